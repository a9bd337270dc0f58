"""A full cache disk against the core: clean cached blocks make room for writes (evicted on
demand, whatever the bound says), and ENOSPC is the answer only when what fills the disk is
dirty data (docs/SEMANTICS.md, the cache; docs/CONFIGURATION.md, "Sizing the cache disk").

The disk is simulated: ``SmallDisk`` refuses an ``os.pwrite`` (ENOSPC, or EDQUOT) that would
take the files of the cache directory past its capacity, counted by their allocated blocks —
so a hole punched by eviction, or a file an eviction removed, frees room as on a real disk."""
from __future__ import annotations

import errno
import logging
import os

import pytest

from delvefs.client.mount.errors import FsError

from .conftest import view

pytestmark = pytest.mark.trio

B = 4096  # the tests' block size
OBJECT_BLOCKS = 64


class SmallDisk:
    """A disk of ``capacity`` bytes under ``root``: pwrite fails with ``err`` past it."""

    def __init__(self, root, capacity: int, err: int = errno.ENOSPC):
        self.root, self.capacity, self.err = str(root), capacity, err
        self.refused = 0  # writes refused for want of room
        self._pwrite = os.pwrite

    def used(self) -> int:
        total = 0
        for directory, _, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(directory, name)).st_blocks * 512
                except FileNotFoundError:
                    pass
        return total

    def pwrite(self, fd, data, offset):
        if self.used() + len(data) > self.capacity:
            self.refused += 1
            raise OSError(self.err, os.strerror(self.err))
        return self._pwrite(fd, data, offset)


def blob(n: int, seed: int = 7) -> bytes:
    return bytes((i * seed + i // 251) % 256 for i in range(n))


async def cached_world(make_world, monkeypatch, tmp_path, capacity: int, err=errno.ENOSPC, *,
                       measured: bool = False):
    """A world whose cache holds every block of a 64-block object (read, closed: all of it
    clean and evictable) on a disk of ``capacity`` bytes. ``measured``: the bound measures
    its free space on that disk (as statvfs would); else on the real one, which has room
    to spare, so that only a refused write shows the disk is full."""
    w = make_world(view("v", writable=True))
    c = w.cache
    c.block_size, c.max_get, c.whole_size = B, 4 * B, B
    c.bound.free_floor_bytes = 8 * B  # (the real disk's 5 % would be all of the small one)
    data = blob(OBJECT_BLOCKS * B)
    w.add("v", "data/big", data)
    await w.start()
    disk = SmallDisk(tmp_path / "cache", capacity, err)
    monkeypatch.setattr(os, "pwrite", disk.pwrite)
    if measured:
        monkeypatch.setattr(c.bound, "_measure", lambda: (8 * B, capacity - disk.used()))
    assert await w.read("v/big") == data
    assert w.cache.get("b", "data/big").present.total == len(data)
    return w, disk, data


async def write_in_pieces(w, path: str, data: bytes, piece: int = B) -> int:
    """Write ``data`` to a new file as the kernel would, ``piece`` bytes a request; its
    handle, left open. The first refused write's FsError is raised with the handle
    (``fh``) and the bytes accepted before it (``accepted``)."""
    fh, _ = await w.open_write(path)
    done = 0
    try:
        while done < len(data):
            done += await w.fs.write(fh, done, data[done:done + piece])
    except FsError as exc:
        exc.accepted, exc.fh = done, fh
        raise
    return fh


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
async def test_a_write_to_a_disk_full_of_clean_blocks_evicts_them_and_succeeds(
        make_world, monkeypatch, tmp_path, caplog, err):
    w, disk, data = await cached_world(make_world, monkeypatch, tmp_path, 72 * B, err)
    new = blob(32 * B, seed=13)
    with caplog.at_level(logging.INFO, logger="delvefs.client.mount.cache.datacache"):
        fh = await write_in_pieces(w, "v/new.bin", new)
    assert disk.refused > 0                   # the disk was full: the ordinary bound never saw it
    forced = w.cache.forced_evictions
    assert forced >= 24 and w.cache.evictions >= forced
    # only what the writes needed went: the object keeps some of its blocks
    assert 0 < w.cache.get("b", "data/big").present.total < len(data)
    # one log line each time the disk was found full, not one per evicted block
    episodes = [r for r in caplog.records if "is full" in r.getMessage()]
    assert 0 < len(episodes) < forced
    await w.close(fh)
    assert w.obj("v", "data/new.bin")["data"] == new
    # the evicted blocks are fetched again (room made for them too: the written file is clean now)
    assert await w.read("v/big") == data
    assert await w.read("v/new.bin") == new


async def test_writes_that_grow_dirty_data_keep_the_free_space_floor_before_the_disk_is_full(
        make_world, monkeypatch, tmp_path):
    w, disk, data = await cached_world(make_world, monkeypatch, tmp_path, 80 * B, measured=True)
    evicted = w.cache.evictions
    new = blob(48 * B, seed=13)
    fh = await write_in_pieces(w, "v/new.bin", new)
    assert disk.refused == 0 and w.cache.forced_evictions == 0
    assert w.cache.evictions - evicted >= 32   # evicted on the way, by the ordinary bound
    await w.close(fh)
    assert w.obj("v", "data/new.bin")["data"] == new
    assert await w.read("v/big") == data


async def test_enospc_only_once_dirty_data_fills_the_disk(make_world, monkeypatch, tmp_path):
    w, disk, data = await cached_world(make_world, monkeypatch, tmp_path, 72 * B)
    with pytest.raises(FsError) as e:
        await write_in_pieces(w, "v/huge.bin", blob(100 * B, seed=13))
    assert e.value.errno == errno.ENOSPC
    # every clean block made way first: the disk holds the written file and nothing else
    big = w.cache.get("b", "data/big")
    assert big is None or big.present.total == 0
    assert e.value.accepted >= 64 * B
    await w.fs.release(e.value.fh)
