"""Writes to a part of a big object through a kernel mount, against the real MinIO (behind
the fault proxy, whose request log shows what the mount asked): an append or a change in
the middle is not downloaded at open, and the close rebuilds the object with UploadPartCopy
parts for what did not change; a copy part cut by S3 leaves the file dirty, and it lands
byte-exact later."""
from __future__ import annotations

import errno

import pytest

from ..waiting import wait_until
from .mounts import listdir, mounts, put  # noqa: F401
from tests.faults.test_write_faults import PART, RETRY_WAIT, faulty, handler, payload, proxy  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

SIZE = 2 * PART + 5 * 1024 * 1024          # 21 MiB: above the multipart threshold; whole pages
# (the kernel reads a partial last page before it writes into it)


def copy_parts(proxy, key: str) -> list:
    return [r for r in proxy.requests(method="PUT", key=key)
            if "uploadId" in r.query and any(h.lower() == "x-amz-copy-source" for h in r.headers)]


def fetched(proxy, key: str) -> int:
    """Bytes of ``key`` the ranged GETs asked for."""
    total = 0
    for r in proxy.requests(method="GET", key=key):
        if r.query == "":
            first, _, last = r.headers.get("range", "bytes=0-0")[6:].partition("-")
            total += int(last) - int(first) + 1
    return total


def test_append_and_middle_change_copy_the_unchanged_ranges(faulty, proxy):
    data = payload(SIZE, 7)
    put(faulty.s3, faulty.bucket, "data/big.bin", data)
    mp = faulty.mount()
    proxy.clear_log()
    extra = payload(1 << 20, 8)
    with open(mp / "data/big.bin", "ab") as f:       # no download at open
        f.write(extra)
    data += extra
    assert faulty.get("data/big.bin") == data         # close returned: S3 has it
    # nothing of it came down (but the partial last page, which the kernel's writeback cache
    # reads before it writes into it: one block)
    assert fetched(proxy, "data/big.bin") <= 1 << 20
    assert copy_parts(proxy, "data/big.bin")          # the old bytes were copied by MinIO
    proxy.clear_log()
    with open(mp / "data/big.bin", "r+b") as f:       # a header change
        f.seek(100)
        f.write(b"HEADER")
        f.seek(12 << 20)
        assert f.read(4) == data[12 << 20:(12 << 20) + 4]   # read through the writer: fetched
    data = data[:100] + b"HEADER" + data[106:]
    assert faulty.get("data/big.bin") == data
    assert copy_parts(proxy, "data/big.bin")
    assert (mp / "data/big.bin").read_bytes() == data


def test_a_copy_part_cut_by_s3_leaves_the_file_dirty_and_it_lands_later(faulty, proxy):
    data = payload(SIZE, 9)
    put(faulty.s3, faulty.bucket, "data/cut.bin", data)
    mp = faulty.mount(attempts=1)
    listdir(mp / "data")
    proxy.reset(direction="down", after_bytes=0, limit=3)   # answers of the close lost after S3 acted
    err = None
    try:
        with open(mp / "data/cut.bin", "ab") as f:
            f.write(b"appended")
    except OSError as exc:
        err = exc.errno
    proxy.pass_through()
    assert err in (None, errno.EIO)
    wait_until(lambda: faulty.get("data/cut.bin") == data + b"appended", RETRY_WAIT,
               "the append lands byte-exact")
    assert copy_parts(proxy, "data/cut.bin")
    assert faulty.sync(mp).returncode == 0
