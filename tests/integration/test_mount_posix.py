"""POSIX corners that file-system test suites exercise, through a real mount in both modes
(strict and eager; real MinIO, RabbitMQ, handler and FUSE)."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from delvefs.client.mount import fuse_adapter
from delvefs.client.mount.mountpoints import mounted_fstype

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, data_views, handler, listdir, mounts, put  # noqa: F401
from .test_mount_write import get, keys

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MODES = {"strict": (), "eager": ("--eager",)}


@pytest.fixture(params=sorted(MODES))
def mode(request):
    return MODES[request.param]


def sync(mounts, mp) -> None:
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr


def test_a_file_unlinked_while_open_is_written_and_read_through_its_descriptor(
        mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    path = mp / "data/gone.txt"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR)
    try:
        os.unlink(path)
        assert os.pwrite(fd, b"hello world", 0) == 11
        assert os.pread(fd, 20, 0) == b"hello world"
        assert os.fstat(fd).st_size == 11
        os.ftruncate(fd, 5)
        assert os.fstat(fd).st_size == 5 and os.pread(fd, 20, 0) == b"hello"
    finally:
        os.close(fd)
    fd = os.open(mp / "data/early.txt", os.O_CREAT | os.O_EXCL | os.O_RDWR)
    try:
        os.write(fd, b"12345")                       # written before the unlink, and after
        os.unlink(mp / "data/early.txt")
        os.pwrite(fd, b"hello world", 0)
        assert os.pread(fd, 20, 0) == b"hello world" and os.fstat(fd).st_size == 11
    finally:
        os.close(fd)
    sync(mounts, mp)
    assert not [k for k in keys(s3, bucket) if k in ("data/gone.txt", "data/early.txt")]
    assert "gone.txt" not in listdir(mp / "data") and "early.txt" not in listdir(mp / "data")


def test_files_removed_or_replaced_here_are_read_on_by_their_descriptors(mounts, s3, bucket, mode):
    # another process's rm and mv through the mount while descriptors read (one fsync'd
    # while still written, one opened for reading before anything of it was read)
    mp = mounts.mount(data_views(bucket), *mode)
    big = os.urandom(3 << 20)
    put(s3, bucket, "data/read.bin", big)
    put(s3, bucket, "data/other.bin", b"other")
    wait_until(lambda: "other.bin" in listdir(mp / "data"), CHANGE_TIMEOUT, "other.bin listed")
    reader = os.open(mp / "data/read.bin", os.O_RDONLY)
    writer = os.open(mp / "data/written.bin", os.O_CREAT | os.O_RDWR)
    try:
        os.pwrite(writer, b"w" * 100_000, 0)
        os.fsync(writer)
        os.rename(mp / "data/other.bin", mp / "data/read.bin")
        os.unlink(mp / "data/written.bin")
        sync(mounts, mp)
        assert os.pread(reader, len(big) + 1, 0) == big
        os.pwrite(writer, b"more", 100_000)
        assert os.pread(writer, 200_000, 0) == b"w" * 100_000 + b"more"
    finally:
        os.close(reader)
        os.close(writer)
    sync(mounts, mp)
    assert "written.bin" not in keys(s3, bucket) and (mp / "data/read.bin").read_bytes() == b"other"


def test_names_too_long_are_enametoolong_for_every_operation(mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    long_name = "n" * 256
    put(s3, bucket, "data/short", b"s")

    def refused(call, *args):
        with pytest.raises(OSError) as e:
            call(*args)
        assert e.value.errno == errno.ENAMETOOLONG, (call, e.value)
    refused(os.open, mp / "data" / long_name, os.O_CREAT | os.O_WRONLY)
    refused(os.mkdir, mp / "data" / long_name)
    refused(os.rename, mp / "data/short", mp / "data" / long_name)
    refused(os.unlink, mp / "data" / long_name)
    refused(os.rmdir, mp / "data" / long_name)
    refused(os.truncate, mp / "data" / long_name, 0)
    refused(os.rename, mp / "data" / long_name, mp / "data/other")
    refused(os.stat, mp / "data" / long_name)
    # a path whose key passes S3's 1,024 bytes: refused at once, nothing half made
    deep = mp / "data"
    for i in range(5):
        deep = deep / (f"{i}" * 200)
        deep.mkdir()
    refused(os.open, deep / ("k" * 50), os.O_CREAT | os.O_WRONLY)
    refused(os.mkdir, deep / ("k" * 50))
    refused(os.rename, mp / "data/short", deep / ("k" * 50))
    assert (mp / "data/short").read_bytes() == b"s"
    sync(mounts, mp)
    assert get(s3, bucket, "data/short") == b"s"
    assert all(len(k.encode()) <= 1024 for k in keys(s3, bucket))


def test_an_outside_overwrite_with_another_size_shows_its_size_and_bytes(
        mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    path = mp / "data/over.txt"
    path.write_bytes(b"old\n")
    sync(mounts, mp)
    assert os.stat(path).st_size == 4
    put(s3, bucket, "data/over.txt", b"new one\n")       # another writer, another size
    wait_until(lambda: os.stat(path).st_size == 8, CHANGE_TIMEOUT,
               "the mount shows the other writer's size")
    assert path.read_bytes() == b"new one\n"


def test_descriptors_open_for_writing_share_one_file_across_fsync_and_other_closes(
        mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    path = mp / "data/shared.bin"
    path.write_bytes(b"o" * 1000)
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)                                   # uploaded; the descriptor stays open
        with open(path, "r+b") as other:               # another descriptor writes and closes
            other.write(b"n" * 10)
        assert os.pread(fd, 12, 0) == b"n" * 10 + b"oo"
        os.pwrite(fd, b"x", 10)                        # then the first one writes
        os.ftruncate(fd, 20)
    finally:
        os.close(fd)
    sync(mounts, mp)
    assert get(s3, bucket, "data/shared.bin") == b"n" * 10 + b"x" + b"o" * 9
    fd = os.open(path, os.O_RDWR)                      # and across a truncating rewrite
    try:
        assert os.pread(fd, 1, 0) == b"n"
        path.write_bytes(b"w" * 5)
        assert os.pread(fd, 100, 0) == b"w" * 5
    finally:
        os.close(fd)


def test_a_descriptor_keeps_the_version_it_read_over_an_outside_overwrite(
        mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    path = mp / "data/kept.bin"
    put(s3, bucket, "data/kept.bin", b"o" * 2367)
    wait_until(lambda: path.exists() and path.read_bytes() == b"o" * 2367, CHANGE_TIMEOUT,
               "the object shows")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 1 << 20, 0) == b"o" * 2367
        put(s3, bucket, "data/kept.bin", b"n" * 1882)
        wait_until(lambda: path.read_bytes() == b"n" * 1882, CHANGE_TIMEOUT,
                   "the new version shows by path")
        assert os.pread(fd, 1 << 20, 0) == b"o" * 2367   # the descriptor keeps its version
    finally:
        os.close(fd)


def test_an_open_beside_a_reader_that_finds_s3_ahead_reads_the_new_version(
        mounts, handler, s3, bucket, mode):
    # the handler is down, so the listing stays behind S3: the second open (past the ttl)
    # asks S3, the name moves to a new inode, and the kernel opens that (ESTALE retried
    # inside the kernel) while the first descriptor keeps its version and its pages
    mp = mounts.mount(data_views(bucket), *mode)
    path = mp / "data/ahead.bin"
    put(s3, bucket, "data/ahead.bin", b"o" * 3000)
    wait_until(lambda: path.exists() and path.read_bytes() == b"o" * 3000, CHANGE_TIMEOUT,
               "the object shows")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 1 << 20, 0) == b"o" * 3000
        before = os.fstat(fd).st_ino
        handler.stop()
        try:
            put(s3, bucket, "data/ahead.bin", b"n" * 1000)
            wait_until(lambda: path.read_bytes() == b"n" * 1000, CHANGE_TIMEOUT,
                       "an open by path reads S3's version")
            assert os.stat(path).st_ino != before
            assert os.pread(fd, 1 << 20, 0) == b"o" * 3000   # the first descriptor's version
        finally:
            handler.start()
    finally:
        os.close(fd)


def test_a_file_renamed_while_written_after_an_fsync_keeps_every_write(
        mounts, s3, bucket, mode):
    # its rename copies exactly the version the fsync uploaded (CopySourceIfMatch), and the
    # descriptor writes on under the new name
    mp = mounts.mount(data_views(bucket), *mode)
    fd = os.open(mp / "data/written.bin", os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, b"0123456789")
        os.fsync(fd)
        os.rename(mp / "data/written.bin", mp / "data/moved.bin")
        os.pwrite(fd, b"XY", 2)
    finally:
        os.close(fd)
    sync(mounts, mp)
    assert get(s3, bucket, "data/moved.bin") == b"01XY456789"
    assert "data/written.bin" not in keys(s3, bucket)


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def test_fallocate_modes_and_zeros_in_s3(mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    path = mp / "data/alloc.bin"
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, b"abcdefgh")
        fallocate(fd, 0, 0, 12)                                      # extends with zeros
        fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 100)                    # changes nothing
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1, 2)
        fallocate(fd, FALLOC_FL_ZERO_RANGE, 14, 2)                     # extends to 16
        assert os.fstat(fd).st_size == 16
        with pytest.raises(OSError) as e:
            fallocate(fd, 0x08, 0, 4)                                  # COLLAPSE_RANGE
        assert e.value.errno == errno.EOPNOTSUPP
    finally:
        os.close(fd)
    expected = b"a\0\0defgh" + b"\0" * 8
    assert path.read_bytes() == expected
    sync(mounts, mp)
    assert get(s3, bucket, "data/alloc.bin") == expected


def test_cp_inside_a_view_is_a_server_side_copy(mounts, s3, bucket, mode):
    mp = mounts.mount(data_views(bucket), *mode)
    data = os.urandom(3 * 1024 * 1024 + 5)
    put(s3, bucket, "data/big.bin", data)
    wait_until(lambda: (mp / "data/big.bin").exists(), CHANGE_TIMEOUT, "the object shows")
    r = subprocess.run(["cp", str(mp / "data/big.bin"), str(mp / "data/copy.bin")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (mp / "data/copy.bin").read_bytes() == data
    sync(mounts, mp)
    assert get(s3, bucket, "data/copy.bin") == data
    log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
    assert "data/copy.bin server-side: 3145733 bytes" in log      # no byte through the mount


def test_killpriv_negotiated_and_no_setuid_bit_survives_a_write_by_another_user(
        mounts, s3, bucket, mode):
    if os.getuid() != 0:
        service_unavailable("another user's write is tried with setuid: root is needed")
    # a mountpoint other users can reach (the test's tmp_path is root's alone)
    base = Path(tempfile.mkdtemp(prefix="delvefs-killpriv-"))
    mp = base / "mnt"
    try:
        base.chmod(0o755)
        mp.mkdir()
        mounts.mount(data_views(bucket), *mode, "-o", "allow_other,file_mode=0666", mountpoint=mp)
        log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
        if fuse_adapter.CUSTOM_IO:  # the kernel then leaves clearing the bits to the mount
            assert "KILLPRIV_V2 negotiated" in log
        path = mp / "data/run.sh"
        path.write_bytes(b"#!/bin/sh\n")
        os.chmod(path, 0o6777)                                       # accepted, not stored
        assert stat.S_IMODE(path.stat().st_mode) == 0o666

        def as_nobody(*argv):
            return subprocess.run(argv, user=65534, group=65534, capture_output=True, text=True,
                                  timeout=60)
        r = as_nobody("sh", "-c", f"echo 'echo hi' >> {path}")
        assert r.returncode == 0, r.stderr
        assert path.stat().st_mode & (stat.S_ISUID | stat.S_ISGID) == 0
        r = as_nobody("truncate", "-s", "3", str(path))
        assert r.returncode == 0, r.stderr
        os.chown(path, 65534, 65534)                                 # accepted, not stored
        st = path.stat()
        assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0 and st.st_size == 3
        assert path.read_bytes() == b"#!/"
        mounts.umount(mp)
    finally:
        if mounted_fstype(str(mp)) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_without_custom_io_one_log_line_says_killpriv_is_not_negotiated(mounts, s3, bucket):
    if not fuse_adapter.CUSTOM_IO:
        service_unavailable("pyfuse3 without custom I/O (contrib/pyfuse3)")
    mp = mounts.mount(data_views(bucket), env=dict(mounts.env, PYFUSE3_CUSTOM_IO="0"))
    (mp / "data/f.txt").write_bytes(b"hello")                       # writes work as before
    assert (mp / "data/f.txt").read_bytes() == b"hello"
    log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
    lines = [line for line in log.splitlines() if "KILLPRIV" in line]
    assert len(lines) == 1 and "not negotiated (disabled by PYFUSE3_CUSTOM_IO=0)" in lines[0]
