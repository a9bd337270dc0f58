"""The patched pyfuse3 (contrib/pyfuse3) delivers fallocate and copy_file_range to a real
kernel mount with the right arguments: util-linux `fallocate` in its four modes, coreutils
`cp` and os.copy_file_range, against the minimal file system of posix_ops_fuse.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import service_unavailable
from tests.integration.test_fuse_kernel import is_mounted
from tests.waiting import wait_until

pyfuse3 = pytest.importorskip("pyfuse3")

FS = Path(__file__).with_name("posix_ops_fuse.py")
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    """(mountpoint, requests): requests() is the file system's log of requests so far."""
    if not os.path.exists("/dev/fuse"):
        service_unavailable("/dev/fuse is missing")
    if not hasattr(pyfuse3.Operations, "copy_file_range"):
        service_unavailable("pyfuse3 without fallocate/copy_file_range: run scripts/bootstrap.sh")
    for tool in ("fallocate", "cp"):
        if shutil.which(tool) is None:
            service_unavailable(f"{tool} is missing")
    base = tmp_path_factory.mktemp("posix-ops")
    mnt, log = base / "mnt", base / "requests.jsonl"
    mnt.mkdir()
    log.touch()
    proc = subprocess.Popen([sys.executable, str(FS), str(mnt), str(log)], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=20, what="the mount")
        assert proc.poll() is None, proc.stderr.read().decode()

        def requests() -> list[dict]:
            return [json.loads(line) for line in log.read_text().splitlines()]
        yield mnt, requests
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def handles(requests, name: str) -> set[int]:
    return {r["fh"] for r in requests if r["op"] == "open" and r["name"] == name}


def last(requests, op: str) -> dict:
    return [r for r in requests if r["op"] == op][-1]


def fallocate(*args: str) -> None:
    subprocess.run(["fallocate", *args], check=True, capture_output=True)


def test_fallocate_reaches_the_file_system_in_each_mode(mount):
    mnt, requests = mount
    path = mnt / "allocated"

    fallocate("-l", "1MiB", str(path))
    req = last(requests(), "fallocate")
    assert (req["mode"], req["offset"], req["length"]) == (0, 0, 1 << 20)
    assert req["fh"] in handles(requests(), "allocated")
    assert req["inode"] == path.stat().st_ino
    assert path.stat().st_size == 1 << 20

    path.write_bytes(b"x" * 100)
    fallocate("--keep-size", "-o", "0", "-l", "8192", str(path))
    assert last(requests(), "fallocate")["mode"] == FALLOC_FL_KEEP_SIZE
    assert path.read_bytes() == b"x" * 100

    fallocate("--punch-hole", "-o", "10", "-l", "20", str(path))
    req = last(requests(), "fallocate")
    assert (req["mode"], req["offset"], req["length"]) == (
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 10, 20)
    assert path.read_bytes() == b"x" * 10 + bytes(20) + b"x" * 70

    fallocate("--zero-range", "-o", "90", "-l", "20", str(path))
    req = last(requests(), "fallocate")
    assert (req["mode"], req["offset"], req["length"]) == (FALLOC_FL_ZERO_RANGE, 90, 20)
    assert path.read_bytes() == b"x" * 10 + bytes(20) + b"x" * 60 + bytes(20)


def test_an_unsupported_fallocate_mode_is_refused_and_later_ones_still_arrive(mount):
    mnt, requests = mount
    path = mnt / "refused"
    path.write_bytes(b"y" * 8192)
    # collapse-range: the kernel itself refuses it for FUSE (EOPNOTSUPP), nothing arrives
    before = len(requests())
    result = subprocess.run(["fallocate", "--collapse-range", "-o", "0", "-l", "4096", str(path)],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "not supported" in result.stderr
    assert not [r for r in requests()[before:] if r["op"] == "fallocate"]
    fallocate("-o", "0", "-l", "16384", str(path))
    assert last(requests(), "fallocate")["length"] == 16384
    assert path.stat().st_size == 16384


def test_cp_asks_copy_file_range_for_the_whole_file(mount):
    mnt, requests = mount
    data = os.urandom(300_000)
    (mnt / "source").write_bytes(data)

    subprocess.run(["cp", str(mnt / "source"), str(mnt / "copy")], check=True)

    req = last(requests(), "copy_file_range")
    assert (req["off_in"], req["off_out"], req["length"], req["flags"]) == (0, 0, len(data), 0)
    assert (req["inode_in"], req["inode_out"]) == ((mnt / "source").stat().st_ino,
                                                   (mnt / "copy").stat().st_ino)
    assert req["fh_in"] in handles(requests(), "source")
    assert req["fh_out"] in handles(requests(), "copy")
    assert (mnt / "copy").read_bytes() == data


def test_copy_file_range_carries_offsets_and_length(mount):
    mnt, requests = mount
    data = os.urandom(10_000)
    (mnt / "ranged-source").write_bytes(data)
    (mnt / "ranged-target").write_bytes(b"z" * 100)
    src = os.open(mnt / "ranged-source", os.O_RDONLY)
    dst = os.open(mnt / "ranged-target", os.O_WRONLY)
    try:
        assert os.copy_file_range(src, dst, 1000, 2000, 50) == 1000
    finally:
        os.close(src)
        os.close(dst)
    req = last(requests(), "copy_file_range")
    assert (req["off_in"], req["off_out"], req["length"]) == (2000, 50, 1000)
    assert (mnt / "ranged-target").read_bytes() == b"z" * 50 + data[2000:3000]


def test_a_refused_copy_falls_back_to_read_and_write(mount):
    """EOPNOTSUPP is not remembered by the kernel (ENOSYS would be): it copies this
    range through read and write, and asks again next time."""
    mnt, requests = mount
    data = os.urandom(200_000)
    (mnt / "copied-source").write_bytes(data)

    for target in ("fallback-one", "fallback-two"):
        subprocess.run(["cp", str(mnt / "copied-source"), str(mnt / target)], check=True)
        assert (mnt / target).read_bytes() == data
        req = last(requests(), "copy_file_range")
        assert req["fh_out"] in handles(requests(), target)
