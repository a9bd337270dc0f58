"""A cache directory on a small disk (a real 64 MiB tmpfs) through a kernel mount against real
MinIO, RabbitMQ and the event handler: after a read bigger than the disk has filled it with
clean cached blocks, a write evicts them on demand and succeeds, byte-exact in S3; only a
file that cannot fit at all — dirty data filling the disk — is ENOSPC, and nothing of it
reaches S3 (docs/CONFIGURATION.md, "Sizing the cache disk")."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from ..conftest import IN_CI
from tests.integration.mounts import handler, mounts, put  # noqa: F401
from tests.integration.test_mount_write import get, write_file, write_views

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MiB = 1 << 20
DISK_MIB = 64


def digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


@contextlib.contextmanager
def small_disk(path: Path, size_mib: int):
    """A tmpfs of ``size_mib`` MiB mounted at ``path`` (root only: skipped otherwise, a
    failure in CI), unmounted again whatever happens."""
    path.mkdir()
    if os.geteuid() != 0 and not IN_CI:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        message = f"cannot mount a tmpfs at {path}: {r.stderr.strip()}"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_writes_after_a_read_bigger_than_the_cache_disk_evict_clean_blocks(
        mounts, s3, bucket, tmp_path):
    big = os.urandom(96 * MiB)
    put(s3, bucket, "data/big.bin", big)
    with small_disk(tmp_path / "cache-disk", DISK_MIB) as cache:
        mp = mounts.mount(write_views(bucket), cache_dir=cache)
        try:
            assert digest((mp / "data" / "big.bin").read_bytes()) == digest(big)
            assert used(cache) > DISK_MIB * MiB // 2  # the disk is full of clean cached blocks

            # each write needs most of the disk: the clean blocks make way, close succeeds
            for name in ("first.bin", "second.bin"):
                data = os.urandom(30 * MiB)
                write_file(mp / "raw" / name, data)
                assert digest(get(s3, bucket, f"data/{name}")) == digest(data)
            assert digest((mp / "data" / "big.bin").read_bytes()) == digest(big)

            # dirty data alone bigger than the disk: ENOSPC, and nothing partial in S3
            with pytest.raises(OSError) as e:
                write_file(mp / "raw" / "huge.bin", os.urandom(80 * MiB))
            assert e.value.errno == errno.ENOSPC
            assert get(s3, bucket, "data/huge.bin") is None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(mp / "raw" / "huge.bin")  # its local bytes go with it: room again
            data = os.urandom(8 * MiB)
            write_file(mp / "raw" / "after.bin", data)
            assert digest(get(s3, bucket, "data/after.bin")) == digest(data)
        finally:
            mounts.cleanup()  # (before the tmpfs under it goes)
