"""A write that the cache disk refuses, through a kernel mount against real MinIO,
RabbitMQ and the real event handler: the cache directory is a small tmpfs that a file
bigger than it genuinely fills. The program sees ENOSPC (strict mode: at write(2) and at
close(2); eager mode: at the latest at close, when the kernel's write-back fails), S3 keeps
what it had — no object for a new file, the old version of an overwritten one — before and
after a clean unmount, and the view lists no partial file: nobody is ever shown one."""
from __future__ import annotations

import contextlib
import errno
import os
import subprocess

import pytest

from delvefs.client.mount.mountpoints import mounted_fstype

from ..conftest import IN_CI
from ..waiting import wait_until
from tests.integration.mounts import handler, listdir, mounts, put  # noqa: F401
from tests.integration.test_mount_write import get, write_views

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MiB = 1024 * 1024
CACHE_DISK = 32 * MiB
BIGGER_THAN_THE_DISK = 2 * CACHE_DISK


@contextlib.contextmanager
def small_disk(path):
    """``path``: a tmpfs of ``CACHE_DISK`` bytes while the block runs."""
    if os.geteuid() != 0:
        (pytest.fail if IN_CI else pytest.skip)("mounting a tmpfs needs root")
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={CACHE_DISK}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        (pytest.fail if IN_CI else pytest.skip)(f"mounting a tmpfs: {r.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def copy_until_full(path) -> tuple[int | None, int | None]:
    """What ``cp`` of a file bigger than the cache disk does: write 1 MiB pieces until a
    write fails, then close. The errno of the failed write and of the close (None: none)."""
    piece = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    write_error = close_error = None
    try:
        done = 0
        while done < BIGGER_THAN_THE_DISK:
            try:
                done += os.write(fd, piece)
            except OSError as exc:
                write_error = exc.errno
                break
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            close_error = exc.errno
    return write_error, close_error


@pytest.mark.parametrize("mode", ["strict", "eager"])
def test_a_file_whose_write_filled_the_cache_disk_is_never_published(mounts, s3, bucket,
                                                                        tmp_path, mode):
    put(s3, bucket, "data/old.bin", b"the old version")
    with small_disk(tmp_path / "small-cache") as cache:
        mp = mounts.mount(write_views(bucket), *(["--eager"] if mode == "eager" else []),
                          cache_dir=cache)
        try:
            for name in ("new.bin", "old.bin"):
                write_error, close_error = copy_until_full(mp / "data" / name)
                if mode == "strict":  # each write(2) reaches the mount: it fails, and so does close
                    assert (write_error, close_error) == (errno.ENOSPC, errno.ENOSPC)
                else:  # the kernel's write-back fails: close says so at the latest
                    assert errno.ENOSPC in (write_error, close_error), (write_error, close_error)
                # its last close dropped the partial file: the name shows what S3 has
                wait_until(lambda: "new.bin" not in listdir(mp / "data")
                           and os.stat(mp / "data" / "old.bin").st_size == len(b"the old version"),
                           20, "the partial file dropped")
                assert get(s3, bucket, "data/new.bin") is None
                assert get(s3, bucket, "data/old.bin") == b"the old version"
            assert (mp / "data" / "old.bin").read_bytes() == b"the old version"
            status = mounts.run("sync", str(mp))
            assert status.returncode == 0, status.stderr        # nothing is left to upload
        finally:
            if mounted_fstype(str(mp)) is not None:
                r = mounts.umount(mp, check=False)
                assert r.returncode == 0, r.stderr
        assert get(s3, bucket, "data/new.bin") is None            # not at unmount either
        assert get(s3, bucket, "data/old.bin") == b"the old version"
        records = [(cache / "journal" / n).read_text() for n in os.listdir(cache / "journal")]
        assert not records, records
