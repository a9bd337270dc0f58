"""The block cache through the kernel: mounts whose S3 endpoint is a fault proxy in front
of the real MinIO (its request log shows every GET and its Range), reading a larger
object at random, its tail, while it is replaced, while S3 cuts a GET mid-block, and with
a cache far smaller than the object."""
from __future__ import annotations

import errno
import hashlib
import os
import random

import pytest

from .mounts import mounts, put  # noqa: F401 — fixtures
from tests.faults.test_write_faults import Faulty, handler, proxy  # noqa: F401 — fixtures

pytestmark = [pytest.mark.services, pytest.mark.fuse]

MiB = 1 << 20
SIZE = 24 * MiB + 123


@pytest.fixture(scope="module")
def blob() -> bytes:
    return random.Random(17).randbytes(SIZE)


def ranges(proxy, key: str) -> list[tuple[int, int]]:
    """The [start, end) of every GET of ``key`` the proxy saw."""
    out = []
    for r in proxy.requests("GET", key=key):
        first, _, last = r.headers["range"].removeprefix("bytes=").partition("-")
        out.append((int(first), int(last) + 1))
    return out


def test_tail_and_random_reads_get_only_their_blocks_byte_exact(mounts, proxy, handler, s3, bucket, blob):
    put(s3, bucket, "data/big.bin", blob)
    etag = s3.head_object(Bucket=bucket, Key="data/big.bin")["ETag"]
    mp = Faulty(mounts, proxy, bucket, s3).mount()
    proxy.clear_log()
    fd = os.open(mp / "data/big.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, SIZE - 4096) == blob[-4096:]
        got = ranges(proxy, "data/big.bin")
        assert got and all(start >= SIZE - 2 * MiB for start, _ in got)   # the tail only
        assert not proxy.requests("HEAD", key="data/big.bin")              # the listing's ETag
        assert all(r.headers["if-match"] == etag for r in proxy.requests("GET", key="data/big.bin"))
        rnd = random.Random(5)
        spots = [rnd.randrange(SIZE - 10_000) for _ in range(8)]
        for off in spots:
            assert os.pread(fd, 10_000, off) == blob[off:off + 10_000]
        # random reads fetch the blocks around them, not the object from its start
        fetched = sum(end - start for start, end in ranges(proxy, "data/big.bin"))
        assert fetched <= (len(spots) + 1) * 2 * MiB
        for _ in range(20):
            off, n = rnd.randrange(SIZE), rnd.choice([1, 4096, 300_000])
            assert os.pread(fd, n, off) == blob[off:off + n]
    finally:
        os.close(fd)
    assert hashlib.sha256((mp / "data/big.bin").read_bytes()).digest() == hashlib.sha256(blob).digest()


def test_an_object_replaced_between_two_reads_is_eio_never_mixed(mounts, proxy, handler, s3, bucket, blob):
    put(s3, bucket, "data/big.bin", blob)
    mp = Faulty(mounts, proxy, bucket, s3).mount()
    fd = os.open(mp / "data/big.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == blob[:4096]
        new = bytes(b ^ 0xFF for b in blob[:MiB]) * 24 + blob[24 * MiB:]
        put(s3, bucket, "data/big.bin", new)             # same size, another version
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 20 * MiB)
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
    # the next open asks S3 (its GET failed: the entry is no longer trusted)
    assert (mp / "data/big.bin").read_bytes() == new


def test_s3_failing_mid_block_is_eio_then_a_later_read_works(mounts, proxy, handler, s3, bucket, blob):
    put(s3, bucket, "data/big.bin", blob)
    mp = Faulty(mounts, proxy, bucket, s3).mount(attempts=1)
    fd = os.open(mp / "data/big.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 100, 0) == blob[:100]
        # every GET cut after its first 2 KiB (a read fetches its own pages, a few KiB)
        proxy.reset(after_bytes=2 * 1024, direction="down")
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 12 * MiB + 5000)
        assert e.value.errno == errno.EIO
        proxy.pass_through()
        assert os.pread(fd, 4096, 12 * MiB + 5000) == blob[12 * MiB + 5000:12 * MiB + 9096]
    finally:
        os.close(fd)


def test_a_cache_smaller_than_the_object_fills_up_mid_read(mounts, proxy, handler, s3, bucket, blob, tmp_path):
    put(s3, bucket, "data/big.bin", blob)
    mp = Faulty(mounts, proxy, bucket, s3).mount("--cache-size", "3MiB")
    assert hashlib.sha256((mp / "data/big.bin").read_bytes()).digest() == hashlib.sha256(blob).digest()
    with open(mp / "data/big.bin", "rb") as f:
        for off in (20 * MiB, 3, 11 * MiB, SIZE - 10):
            f.seek(off)
            assert f.read(2 * MiB) == blob[off:off + 2 * MiB]
    cache = tmp_path / f"cache-{mounts.count}" / "data"
    assert sum(p.stat().st_blocks * 512 for p in cache.iterdir()) <= 3 * MiB + 64 * 1024
