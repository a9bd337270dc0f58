"""How big the data cache may grow: the ``--cache-size`` limit and a free-space floor,
kept by evicting blocks least recently used. :class:`CacheBound` is a part of
``delvefs.client.mount.cache.datacache.DataCache`` that owns this accounting: the bytes the cache
counts (``bytes``, each entry's share in ``entry.counted``), its blocks in LRU order (each
entry's in ``entry.blocks``), and their eviction.

Eviction punches the bytes of a block out of its file (fallocate PUNCH_HOLE) and forgets
them in ``present``; an entry with nothing left and no opener is dropped (by the
``drop_unused`` the cache gave, which knows whether a version change is under way). What
is never evicted, and the order (closed entries first), is in ``evict``.

Concurrency: everything here runs on the trio loop (the cache calls it there); ``evict``
never awaits, so a reader's check of ``present`` followed by a pread without an await in
between reads bytes no eviction punched out.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from .cacheentry import CacheEntry
from .ranges import blocks

log = logging.getLogger(__name__)


class CacheBound:
    """The bound of the cache whose files are in ``directory``: at most ``limit`` bytes
    (None: only the free-space floor), evicted ``block_size`` bytes at a time.
    ``drop_unused(entry)`` drops an entry eviction emptied that nobody has open, unless
    the cache must keep it; it answers whether it did."""

    # the free-space floor: whatever ``limit`` says, clean blocks go while the cache's file
    # system has less free than the smaller of these (``limit`` None: the only bound)
    free_floor_bytes = 1 << 30
    free_floor_ratio = 0.05

    # statvfs at most this often (seconds), plus whenever the cache grew by a tenth of the
    # free space seen last: many small files are cached and written one after another
    free_check_interval = 0.5

    def __init__(self, directory: Path, limit: int | None, block_size: int,
                 drop_unused: Callable[[CacheEntry], bool]):
        self.dir = directory
        self.limit = limit
        self.block_size = block_size
        self._drop_unused = drop_unused
        self.bytes = 0       # present bytes of clean entries, the size of dirty ones
        self.evictions = 0   # blocks (or entries) evicted: statistics, for tests and logs
        self._lru: OrderedDict[tuple[int, int], CacheEntry] = OrderedDict()  # (serial, block)
        self._free_checked = (-math.inf, 0, 0)  # (monotonic time, bytes cached then, shortfall then)
        self._free_seen = 0
        self._punch_warned = False

    def set_block_size(self, size: int) -> None:
        """Blocks of ``size`` bytes from now on (set before anything is cached)."""
        self.block_size = size

    # ------------------------------------------------------------------ accounting

    def recount(self, entry: CacheEntry, n: int) -> None:
        """The entry adds ``n`` bytes now (its blocks unchanged)."""
        self.bytes += n - entry.counted
        entry.counted = n

    def added(self, entry: CacheEntry, start: int, end: int, n: int) -> None:
        """Bytes [start, end) of a clean entry are present now, ``n`` of them new: counted,
        and their blocks the most recently used."""
        self.bytes += n
        entry.counted += n
        lru = self._lru
        for block in blocks(start, end, self.block_size):
            unit = (entry.serial, block)
            lru[unit] = entry
            lru.move_to_end(unit)
            entry.blocks.add(block)

    def touch(self, entry: CacheEntry, start: int, end: int) -> None:
        """Bytes [start, end) of the entry were read: its blocks are the most recently used."""
        if entry.blocks:
            lru = self._lru
            for block in blocks(start, end, self.block_size):
                unit = (entry.serial, block)
                if unit in lru:
                    lru.move_to_end(unit)

    def forget(self, entry: CacheEntry) -> None:
        """The entry counts no more: its bytes uncounted, its blocks out of the LRU."""
        self.bytes -= entry.counted
        entry.counted = 0
        for block in entry.blocks:
            self._lru.pop((entry.serial, block), None)
        entry.blocks = set()

    # ------------------------------------------------------------------ eviction

    def _space_shortfall(self) -> int:
        """Bytes missing to the free-space floor of the cache's file system (0: none)."""
        at, cached, shortfall = self._free_checked
        now = time.monotonic()
        if now - at < self.free_check_interval and self.bytes - cached < self._free_seen // 10:
            return shortfall
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return 0
        floor = min(self.free_floor_bytes, int(st.f_blocks * st.f_frsize * self.free_floor_ratio))
        self._free_seen = st.f_bavail * st.f_frsize
        shortfall = max(0, floor - self._free_seen)
        self._free_checked = (now, self.bytes, shortfall)
        return shortfall

    def evict(self) -> None:
        """Evict least-recently-used clean blocks until within ``limit`` and the free-space
        floor: first blocks of entries nobody has open, then of open ones."""
        limit = self.limit
        shortfall = self._space_shortfall()
        if shortfall:
            limit = max(0, min(self.bytes if limit is None else limit, self.bytes - shortfall))
        if limit is None or self.bytes <= limit:
            return
        bs = self.block_size
        for open_too in (False, True):
            for unit, entry in list(self._lru.items()):
                if self.bytes <= limit:
                    return
                if unit not in self._lru:
                    continue  # its entry was dropped meanwhile
                if entry.dirty or entry.writers or (entry.opens and not open_too):
                    continue
                block = unit[1]
                start, end = block * bs, min((block + 1) * bs, entry.size)
                if block in entry.fetches or any(s < end and start < e for s, e in entry.pinned):
                    continue
                self._evict_block(entry, block, start, end)

    def _evict_block(self, entry: CacheEntry, block: int, start: int, end: int) -> None:
        del self._lru[(entry.serial, block)]
        entry.blocks.discard(block)
        self.evictions += 1
        present = entry.present
        had = present.total
        present.remove(start, end)
        if not present and not entry.opens and not entry.fetches and self._drop_unused(entry):
            return  # nothing left: the file went
        freed = had - present.total
        self.bytes -= freed
        entry.counted -= freed
        if freed and not _punch_hole(entry.path, start, end - start) and not self._punch_warned:
            self._punch_warned = True
            log.warning("the cache directory %s cannot punch holes into files (fallocate): "
                        "evicted blocks of open files keep their disk space until closed",
                        self.dir)


_libc = None


def _punch_hole(path: str, offset: int, length: int) -> bool:
    """Free the disk blocks of [offset, offset + length) of a file, its size unchanged
    (reads there see zeros). False when the file system cannot."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
        return _libc.fallocate(fd, 0x01 | 0x02, offset, length) == 0
    finally:
        os.close(fd)
