"""Sequential read-ahead: its rule, its per-handle state and its settings in one part.

A handle whose reads follow one another starts fetching the bytes after them: a window
that starts at ``window_start`` and doubles with every sequential read up to
``window_max`` (at most a quarter of the cache's size limit); a read elsewhere resets it.
Only clean copies of huge objects read in blocks are fetched ahead (``DataCache.prefetch``
does nothing for an object fetched whole or a dirty local file). What the window fetched
and nobody read yet is cancelled when the handle closes (``stop``).

A handle's :class:`Stream` is its state; only this part reads or changes its fields.
"""
from __future__ import annotations

from ..cache.cacheentry import CacheEntry

MiB = 1 << 20


class Stream:
    """One handle's read-ahead state."""
    __slots__ = ("next_off", "window", "ahead", "fetches")

    def __init__(self):
        self.next_off = 0     # where a sequential read would continue
        self.window = 0       # the window (0: random access, none yet)
        self.ahead = 0        # bytes before it are fetched or being fetched
        self.fetches: list = []  # the fetches it started (cancelled at close)


class ReadAhead:
    """The read-ahead of every reading handle, over the data cache."""

    def __init__(self, cache, store, *, window_start: int = 1 * MiB, window_max: int = 128 * MiB):
        self.cache = cache
        self.store = store
        self.window_start = window_start
        self.window_max = window_max

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
        elif s.window == 0:
            s.window = self.window_start
        else:
            s.window = min(2 * s.window, self._top())
        s.next_off = end
        if s.window and s.ahead - end < s.window // 2 and s.ahead < entry.size:
            start = max(s.ahead, end)
            s.ahead = min(end + s.window, entry.size)
            s.fetches = [f for f in s.fetches if not f.finished]
            s.fetches += self.cache.prefetch(self.store, entry, start, s.ahead)

    def pending(self, s: Stream) -> list:
        """The fetches of ``s`` still running."""
        return [f for f in s.fetches if not f.finished]

    def stop(self, s: Stream) -> None:
        """The handle closes: what it fetched ahead and nobody waits for is cancelled."""
        self.cache.cancel(s.fetches)
        s.fetches = []
