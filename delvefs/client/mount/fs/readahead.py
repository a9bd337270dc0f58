"""Sequential read-ahead: its rule, its per-handle state and its settings in one part.

A read fetches only the bytes it lacks (``DataCache.ensure``: rounded out to a page), so
random reads (and a handle's first read: its first byte is one GET of what it reads) cost
about what they read. A handle whose reads follow one another fetches ahead of them: once
a run of reads has covered ``sequential_after`` (1 MiB) since the last seek, a window that
starts at ``window_start`` (64 KiB, or the read's size if larger) and doubles with every
read that follows, at most ``RUN_MULTIPLE`` times the run read so far (8 MiB at least: a
reader that stops after a run wastes a few times what it read at most), up to
``window_max`` (128 MiB; at most a quarter of the cache's size limit); a read elsewhere (a
seek) resets it to none. The window is kept
full: a new fetch starts as soon as one GET's worth (``max_get``, 8 MiB; half the window
while it is smaller) of it is not being fetched yet, so that at the top ``window_max /
max_get`` GETs are in flight at once — what a bandwidth-limited link to a distant S3 needs,
as a 16-way ranged download has. Only clean copies of objects read in blocks are fetched
ahead (``DataCache.prefetch`` does nothing for an object fetched whole or a dirty local
file). What the window fetched and nobody read yet is cancelled when the handle closes
(``stop``).

Across files (``opened``, the mount option ``prefetch``): an open of a data file starts
fetching, whole, the index files next to it that its reader will read whole next (``.bai``,
``.csi``, ``.crai``, ``.tbi``: ``x.bam.bai`` and ``x.bai`` for ``x.bam``; ``index``, the
default); with ``dir`` (a directory as a declared working set) also the first block of the
directory's other files, once per directory and ``ttl``. Both in the background, at most
``PREFETCH_AT_ONCE`` objects at a time, at most ``PREFETCH_FILES`` files and a quarter of
the cache's size limit per open; an index file larger than ``INDEX_MAX`` is left to its
reads.

A handle's :class:`Stream` is its state; only this part reads or changes its fields.
"""
from __future__ import annotations

import math

import trio

from ..cache.cacheentry import CacheEntry

KiB, MiB = 1 << 10, 1 << 20

# index files, read whole by the tools that read the data file next to them
INDEX_SUFFIXES = (".bai", ".csi", ".crai", ".tbi")
INDEX_MAX = 64 * MiB
PREFETCH_AT_ONCE = 4     # objects an open's prefetch fetches at a time
PREFETCH_FILES = 64      # files one open's prefetch names at most (prefetch=dir)
RUN_MULTIPLE = 4         # the window is at most this many times the run read since the seek


class Stream:
    """One handle's read-ahead state."""
    __slots__ = ("next_off", "window", "ahead", "run_from", "fetches")

    def __init__(self):
        self.next_off = 0     # where a sequential read would continue
        self.window = 0       # the window (0: random access, none yet)
        self.ahead = -1       # bytes before it are fetched or being fetched (-1: the first
        #                       read, wherever it is, fetches only itself)
        self.run_from = 0     # where the reads that follow one another began (the last seek)
        self.fetches: list = []  # the fetches it started (cancelled at close)


class ReadAhead:
    """The read-ahead of every reading handle, over the data cache."""

    def __init__(self, cache, store, *, window_start: int = 64 * KiB, window_max: int = 128 * MiB,
                 sequential_after: int = 1 * MiB, prefetch: str = "index"):
        self.cache = cache
        self.store = store
        self.window_start = window_start
        self.window_max = window_max
        # a window opens once reads have followed one another for this many bytes since
        # the last seek: shorter runs (a region of an indexed file) are the kernel's own
        # read-ahead's (its first request after a seek is 4 times the read, up to 1 MiB)
        self.sequential_after = sequential_after
        self.prefetch = prefetch      # off, index, dir (the mount option)
        self._at_once = trio.CapacityLimiter(PREFETCH_AT_ONCE)
        self._dirs: dict[int, float] = {}   # directory inode -> when its files were prefetched

    def opened(self, node) -> None:
        """``node`` (a file) was opened for reading: its index files, and with
        ``prefetch=dir`` the first block of its directory's other files, start coming."""
        d = node.parent
        if self.prefetch == "off" or node.gone or d is None or d.view is None:
            return
        wanted = []
        if not node.name.endswith(INDEX_SUFFIXES):
            stem = node.name.rpartition(".")[0]
            for suffix in INDEX_SUFFIXES:
                for name in (node.name + suffix, stem + suffix if stem else None):
                    index = d.children.get(name) if name else None
                    if index is not None and not index.is_dir and index.size <= INDEX_MAX:
                        wanted.append((index, index.size))
        now = trio.current_time()
        if self.prefetch == "dir" and now - self._dirs.get(d.ino, -math.inf) >= d.view.ttl:
            self._dirs[d.ino] = now
            first = max(self.cache.block_size, self.cache.whole_size)
            others = (f for f in d.children.values() if not f.is_dir and f is not node)
            for f, _ in zip(others, range(PREFETCH_FILES)):
                wanted.append((f, min(f.size, first)))
        budget = self._top()
        for f, upto in dict(wanted).items():  # (an index named twice: once)
            if upto > budget:
                continue
            budget -= upto
            self.cache.background(self._fetch_ahead, f, upto)

    async def _fetch_ahead(self, f, upto: int) -> None:
        async with self._at_once:
            if not f.gone:
                vs = f.parent.view
                await self.cache.fetch_ahead(self.store, vs.bucket, f.key, etag=f.etag,
                                             size=f.size, ttl=vs.ttl, upto=upto)

    def _top(self) -> int:
        cache = self.cache
        if cache.limit is None:
            return self.window_max
        return max(cache.block_size, min(self.window_max, cache.limit // 4))

    def after_read(self, s: Stream, entry: CacheEntry, off: int, end: int) -> None:
        """Bytes [off, end) of ``entry`` were just read through the handle of ``s``."""
        if s.next_off - 2 * self.cache.block_size <= off < s.next_off:
            return  # bytes just read again (or reads overtaking each other): no news
        if not s.next_off <= off <= s.ahead:
            s.window = 0  # a jump: random access until reads follow one another again
            s.ahead = end
            s.run_from = off
        elif s.window == 0:
            if end - s.run_from < self.sequential_after:
                s.next_off = s.ahead = end   # sequential, but the kernel's read-ahead serves
                return                       # a run this short: nothing fetched ahead yet
            s.window = min(max(self.window_start, end - off), self._top())
        else:  # doubles with every read that follows, up to 4 times the run read so far
            s.window = min(2 * s.window, self._top(),
                           max(self.cache.max_get, RUN_MULTIPLE * (end - s.run_from)))
        s.next_off = end
        if not s.window:
            return
        start = max(s.ahead, end)
        target = min(end + s.window, entry.size)
        step = min(self.cache.max_get, max(1, s.window // 2))
        if target - start >= step or (target == entry.size and start < target):
            s.ahead = target
            s.fetches = [f for f in s.fetches if not f.finished]
            s.fetches += self.cache.prefetch(self.store, entry, start, target)

    def pending(self, s: Stream) -> list:
        """The fetches of ``s`` still running."""
        return [f for f in s.fetches if not f.finished]

    def stop(self, s: Stream) -> None:
        """The handle closes: what it fetched ahead and nobody waits for is cancelled."""
        self.cache.cancel(s.fetches)
        s.fetches = []
