"""How big the data cache may grow: the ``--cache-size`` limit and a free-space floor,
kept by evicting blocks least recently used. :class:`CacheBound` is a part of
``delvefs.client.mount.cache.datacache.DataCache`` that owns this accounting: the bytes the cache
counts (``bytes``, each entry's share in ``entry.counted``), its blocks in LRU order (each
entry's in ``entry.blocks``), and their eviction.

Eviction punches the bytes of a block out of its file (fallocate PUNCH_HOLE) and forgets
them in ``present``; an entry with nothing left and no opener is dropped (by the
``drop_unused`` the cache gave, which knows whether a version change is under way). What
is never evicted, and the order (closed entries first), is in ``_evict_to``.

The free space is measured by statvfs now and then (``_space_shortfall``); in between, what
the cache grew by counts as used, dirty files included, so a writer's growth evicts clean
blocks before the disk is full. A disk found full anyway (a write failed: ENOSPC, EDQUOT)
is ``make_room``'s: clean blocks evicted whatever the bound says, as many as the write and
the floor need, all of them if need be (the cache retries the write:
``DataCache.with_room``).

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
        self.forced_evictions = 0  # of those, evicted by ``make_room``: the disk was full
        self._lru: OrderedDict[tuple[int, int], CacheEntry] = OrderedDict()  # (serial, block)
        # the last statvfs: (monotonic time, bytes cached then, the floor, bytes free then)
        self._free_checked = (-math.inf, 0, 0, 0)
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
        """Bytes missing to the free-space floor of the cache's file system (0: none).
        Between two statvfs calls what the cache grew by since the last one (dirty files
        written, blocks fetched, less what was evicted) counts as used: a writer nears the
        floor, and eviction keeps pace with it, without a statvfs per write."""
        at, cached, floor, free = self._free_checked
        grown = self.bytes - cached
        now = time.monotonic()
        if now - at < self.free_check_interval and grown < free // 10:
            return max(0, floor - (free - grown))
        measured = self._measure()
        if measured is None:
            return 0
        floor, free = measured
        self._free_checked = (now, self.bytes, floor, free)
        return max(0, floor - free)

    def _measure(self) -> tuple[int, int] | None:
        """(the free-space floor, the bytes free) of the cache's file system; None when
        statvfs fails."""
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return None
        floor = min(self.free_floor_bytes, int(st.f_blocks * st.f_frsize * self.free_floor_ratio))
        return floor, st.f_bavail * st.f_frsize

    def evict(self) -> None:
        """Evict least-recently-used clean blocks until within ``limit`` and the free-space
        floor (``_evict_to``)."""
        limit = self.limit
        shortfall = self._space_shortfall()
        if shortfall:
            limit = max(0, min(self.bytes if limit is None else limit, self.bytes - shortfall))
        if limit is None or self.bytes <= limit:
            return
        self._evict_to(limit)

    def make_room(self, need: int) -> int:
        """The cache disk refused a write of ``need`` bytes (ENOSPC, EDQUOT): clean blocks
        are evicted least recently used, whatever ``limit`` and the estimate of the free
        space said, until ``need`` bytes and the free-space floor are freed (the writes
        that follow find room too) or nothing evictable is left. The bytes freed; 0: the
        disk is full of what is never evicted (dirty files, blocks being fetched or read)."""
        measured = self._measure()
        floor = measured[0] if measured is not None else 0
        before, evicted = self.bytes, self.evictions
        self._evict_to(max(0, before - need - floor))
        self.forced_evictions += self.evictions - evicted
        self._free_checked = (-math.inf, 0, 0, 0)  # what is free now: measured at the next check
        return before - self.bytes

    def _evict_to(self, limit: int) -> None:
        """Evict least-recently-used clean blocks until ``bytes`` is at most ``limit`` or
        nothing evictable is left: first blocks of entries nobody has open, then of open
        ones. Never evicted: a block of a dirty entry or of one open for writing, a block
        being fetched, a block an ``ensure`` in progress covers (``entry.pinned``)."""
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
                if any(f.start < end and start < f.end for f in entry.fetches) \
                        or any(s < end and start < e for s, e in entry.pinned):
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
