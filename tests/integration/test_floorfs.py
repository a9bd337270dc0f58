"""The benchmarks' floor (benchmarks/floorfs.py) behaves as a file system: names, sizes and
modes kept, reads of zeros, the tree kept across a remount through its state file."""
from __future__ import annotations

import os
import stat

import pytest

from benchmarks.mounting import FloorMount
from tests.conftest import service_unavailable


@pytest.fixture
def fuse_available():
    if not os.path.exists("/dev/fuse"):
        service_unavailable("/dev/fuse is missing")


@pytest.mark.parametrize("writeback", [False, True])
def test_the_floor_keeps_names_sizes_and_modes(tmp_path, fuse_available, writeback):
    options = ("--state", str(tmp_path / "tree.json"), *(("--writeback",) if writeback else ()))
    floor = FloorMount(tmp_path / "mnt", *options)
    with floor as mp:
        (mp / "d").mkdir()
        (mp / "d" / "f").write_bytes(b"x" * 5000)
        os.chmod(mp / "d" / "f", 0o600)
        (mp / "d" / "g").write_bytes(b"y")
        os.rename(mp / "d" / "g", mp / "d" / "h")
        os.unlink(mp / "d" / "h")
        (mp / "e").mkdir()
        os.rmdir(mp / "e")
    with floor as mp:
        assert sorted(os.listdir(mp)) == ["d"]
        assert os.listdir(mp / "d") == ["f"]
        st = os.stat(mp / "d" / "f")
        assert (st.st_size, stat.S_IMODE(st.st_mode)) == (5000, 0o600)
        assert (mp / "d" / "f").read_bytes() == bytes(5000)
        with pytest.raises(OSError):
            os.rmdir(mp / "d")


def test_the_floor_makes_directories_of_many_files(tmp_path, fuse_available):
    with FloorMount(tmp_path / "mnt", "--files", "many", "obj-{:06d}.dat", "3000", "100") as mp:
        names = os.listdir(mp / "many")
        assert len(names) == 3000 and "obj-002999.dat" in names
        assert os.stat(mp / "many" / "obj-001234.dat").st_size == 100
        assert not os.path.exists(mp / "many" / "obj-003000.dat")
