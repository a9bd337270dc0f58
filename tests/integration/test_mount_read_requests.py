"""What reads cost in S3 requests on a real mount (kernel, MinIO, RabbitMQ, handler), counted
by a fault proxy in front of MinIO (delvefs/devtools/faultproxy.py logs every request): the
first byte of an uncached file is one GET (no HEAD), ``ls -l`` of a view asks S3 nothing
(attributes come from the listing), and random 32 KiB reads fetch at most twice what they
read (no read-ahead for a reader that seeks)."""
from __future__ import annotations

import os
import random
import re
import subprocess

import pytest

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, listdir, mounts, put  # noqa: F401  (fixtures)
from tests.faults.test_write_faults import faulty, handler, proxy  # noqa: F401  (fixtures: S3 behind the proxy)

pytestmark = [pytest.mark.services, pytest.mark.fuse]

KiB, MiB = 1 << 10, 1 << 20


def listed(mp, name: str) -> None:
    wait_until(lambda: name in (listdir(mp / "data") or []), CHANGE_TIMEOUT, f"{name} listed")


def ranged_bytes(requests) -> int:
    """Bytes the GETs among ``requests`` asked for (their Range headers)."""
    total = 0
    for r in requests:
        span = re.fullmatch(r"bytes=(\d+)-(\d+)", r.headers.get("range", ""))
        assert span, f"a GET without a range: {r}"
        total += int(span[2]) - int(span[1]) + 1
    return total


def test_the_first_byte_of_an_uncached_file_is_one_request(faulty, proxy):
    data = os.urandom(8 * MiB)
    put(faulty.s3, faulty.bucket, "data/first.bin", data)
    mp = faulty.mount()
    listed(mp, "first.bin")
    proxy.clear_log()
    fd = os.open(mp / "data" / "first.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == data[:4096]
    finally:
        os.close(fd)
    sent = proxy.requests()
    assert [(r.method, r.key) for r in sent] == [("GET", "data/first.bin")], sent
    assert "if-match" in sent[0].headers                     # pinned to the listed version


def test_ls_l_of_a_view_asks_s3_nothing(faulty, proxy):
    names = [f"f{i:04}.txt" for i in range(300)]
    for name in names:
        put(faulty.s3, faulty.bucket, f"data/{name}", name.encode())
    mp = faulty.mount()
    wait_until(lambda: len(listdir(mp / "data") or []) == len(names), CHANGE_TIMEOUT,
               "every object listed")
    proxy.clear_log()
    out = subprocess.run(["ls", "-l", str(mp / "data")], capture_output=True, text=True,
                         check=True).stdout
    assert sum(1 for line in out.splitlines() if line.endswith(".txt")) == len(names)
    assert all(f" {len(n)} " in line for n, line in zip(names, sorted(
        line for line in out.splitlines() if line.endswith(".txt"))))   # sizes from the listing
    assert proxy.requests() == []                              # no HEAD (nor anything) per file


def random_reads(mp, data: bytes, *, run: tuple[int, int], advice: int | None) -> int:
    """40 seeks to random places of ``data/x.bam``, each followed by ``run`` (fewest, most)
    32 KiB reads on (checked); the bytes read. ``advice``: posix_fadvise of the descriptor."""
    rng = random.Random(20261202)
    read = 0
    fd = os.open(mp / "data" / "x.bam", os.O_RDONLY)
    try:
        if advice is not None:
            os.posix_fadvise(fd, 0, 0, advice)
        for _ in range(40):
            off = rng.randrange(0, len(data) - MiB)
            for _ in range(rng.randint(*run)):
                assert os.pread(fd, 32 * KiB, off) == data[off:off + 32 * KiB]
                off += 32 * KiB
                read += 32 * KiB
    finally:
        os.close(fd)
    return read


@pytest.mark.parametrize("pattern", ["single reads", "region runs"])
def test_random_32_kib_reads_fetch_at_most_twice_what_they_read(faulty, proxy, tmp_path, pattern):
    # single reads: a seek, one read (htslib's 32 KiB buffer), as the kernel sends them.
    # region runs: a seek and one to three reads on, as a region query of an indexed BAM
    # reads; the kernel's own read-ahead answers the second read of such a run with a
    # request 4 times its size (up to 1 MiB: more than twice such a run needs), so the
    # descriptor asks it for none here (POSIX_FADV_RANDOM): what is counted is the mount's
    data = os.urandom(64 * MiB)
    put(faulty.s3, faulty.bucket, "data/x.bam", data)
    mp = faulty.mount("-o", "prefetch=off", cache_dir=tmp_path / "cache")
    listed(mp, "x.bam")
    proxy.clear_log()
    if pattern == "single reads":
        read = random_reads(mp, data, run=(1, 1), advice=None)
    else:
        read = random_reads(mp, data, run=(1, 3), advice=os.POSIX_FADV_RANDOM)
    gets = proxy.requests("GET", key="data/x.bam")
    assert [r for r in proxy.requests() if r.method != "GET"] == []
    assert ranged_bytes(gets) <= 2 * read, (ranged_bytes(gets), read, len(gets))
