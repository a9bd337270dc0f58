"""The kernel's writeback cache of eager mounts through a real mount (real MinIO, RabbitMQ,
handler and FUSE): the kernel coalesces writes, reads the pages a partial write needs,
handles O_APPEND and keeps sizes itself — every way of writing still gives the bytes a
local file would, close-to-open still holds for fsync and `delvefs sync`, and another
client's change still shows with its new size."""
from __future__ import annotations

import mmap
import os

import pytest

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, data_views, handler, mounts, put  # noqa: F401
from .test_mount_write import get

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def test_every_way_of_writing_gives_the_bytes_of_a_local_file(mounts, s3, bucket, tmp_path):
    put(s3, bucket, "data/existing.bin", bytes(range(256)) * 64)     # 16 KiB
    mp = mounts.mount(data_views(bucket), "--eager")
    local = tmp_path / "local"
    local.mkdir()

    def both(fn):
        """Do ``fn(directory)`` in the mount and in a local directory."""
        fn(mp / "data")
        fn(local)

    (local / "existing.bin").write_bytes(bytes(range(256)) * 64)

    def small_writes(d):                     # many write(2)s: one request to the mount
        with open(d / "small.txt", "wb") as f:
            for i in range(300):
                f.write(b"line %d\n" % i)
                f.flush()
    both(small_writes)

    def appends(d):                          # O_APPEND: the kernel finds the end itself
        for part in (b"one ", b"two ", b"three"):
            fd = os.open(d / "appended.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(fd, part)
            os.close(fd)
    both(appends)

    def overwrite_middle(d):                 # O_WRONLY, partial pages: the kernel reads them
        fd = os.open(d / "existing.bin", os.O_WRONLY)
        os.pwrite(fd, b"X" * 5000, 3000)
        os.close(fd)
    both(overwrite_middle)

    def truncates(d):
        (d / "trunc.bin").write_bytes(b"0123456789" * 1000)
        os.truncate(d / "trunc.bin", 15)     # without a handle
        fd = os.open(d / "trunc.bin", os.O_RDWR)
        os.ftruncate(fd, 5)
        os.pwrite(fd, b"end", 9000)          # a hole after the truncated end
        os.close(fd)
    both(truncates)

    def mmap_writes(d):
        fd = os.open(d / "mapped.bin", os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, 3 * 4096 + 10)
        with mmap.mmap(fd, 3 * 4096 + 10) as m:
            m[100:104] = b"MMAP"
            m[3 * 4096:3 * 4096 + 10] = b"last bytes"
            m.flush()
        os.close(fd)
    both(mmap_writes)

    def writer_and_reader(d):                # a reader sees what a writer has not closed yet
        w = open(d / "shared.txt", "wb")
        w.write(b"written, still open")
        w.flush()
        with open(d / "shared.txt", "rb") as r:
            assert r.read() == b"written, still open"
        w.write(b" + more")
        w.close()
    both(writer_and_reader)

    names = ["small.txt", "appended.txt", "existing.bin", "trunc.bin", "mapped.bin", "shared.txt"]
    for name in names:
        assert (mp / "data" / name).read_bytes() == (local / name).read_bytes(), name
        assert os.path.getsize(mp / "data" / name) == os.path.getsize(local / name), name

    fd = os.open(mp / "data/fsynced.txt", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"in S3 once fsync returns")
    os.fsync(fd)                             # the kernel's pages, then the upload
    assert get(s3, bucket, "data/fsynced.txt") == b"in S3 once fsync returns"
    os.close(fd)
    r = mounts.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    for name in names:
        assert get(s3, bucket, f"data/{name}") == (local / name).read_bytes(), name


def test_a_change_by_another_client_shows_with_its_new_size(mounts, s3, bucket):
    put(s3, bucket, "data/f.txt", b"short")
    mp = mounts.mount(data_views(bucket), "--eager")
    f = mp / "data/f.txt"
    held = open(f, "rb")                     # the kernel holds the inode, with its size
    assert os.fstat(held.fileno()).st_size == 5 and held.read() == b"short"
    put(s3, bucket, "data/f.txt", b"a longer version, by someone else")
    wait_until(lambda: os.path.getsize(f) == len(b"a longer version, by someone else"),
               CHANGE_TIMEOUT, "the new size")
    assert f.read_bytes() == b"a longer version, by someone else"
    held.close()
    put(s3, bucket, "data/f.txt", b"tiny")   # shrinks
    wait_until(lambda: f.read_bytes() == b"tiny", CHANGE_TIMEOUT, "the shorter version")
    assert os.path.getsize(f) == 4
    put(s3, bucket, "data/f.txt", b"TINY")   # the same size: the same inode, new pages
    wait_until(lambda: f.read_bytes() == b"TINY", CHANGE_TIMEOUT, "the same-size version")
