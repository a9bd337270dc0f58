"""The machine can make a real kernel FUSE mount with pyfuse3 and remove it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import service_unavailable
from tests.waiting import wait_until

HELLO = Path(__file__).with_name("hello_fuse.py")


def is_mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


@pytest.fixture
def fuse_available():
    if not os.path.exists("/dev/fuse"):
        service_unavailable("/dev/fuse is missing")


def test_pyfuse3_mount_read_and_unmount(tmp_path, fuse_available):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, str(HELLO), str(mnt)], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=20, what="the mount")
        assert proc.poll() is None, proc.stderr.read().decode()
        assert os.listdir(mnt) == ["hello.txt"]
        assert (mnt / "hello.txt").read_bytes() == b"hello from a kernel FUSE mount\n"
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
        assert proc.wait(timeout=20) == 0
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)])
        if proc.poll() is None:
            proc.kill()
