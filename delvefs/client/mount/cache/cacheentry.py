"""One object version in the data cache (:class:`CacheEntry`) and one ranged GET bringing
bytes of it into its file (:class:`Fetch`): the data the cache's parts share.

An entry's fields are changed by their owners only: ``present``, ``source``, ``fetches``
and ``opens`` by ``delvefs.client.mount.cache.datacache.DataCache``; ``blocks`` and ``counted`` by its
bound (``delvefs.client.mount.cache.cachebound.CacheBound``); ``dirty``, ``gen``, ``meta``,
``writers`` and ``journaled`` by the write side (``delvefs.client.mount.fs.written``). A fetch's
``received`` is written by the worker thread of its GET, everything else on the trio loop.
"""
from __future__ import annotations

import itertools
from collections import deque

import trio

from ..errors import StoreError
from .ranges import RangeSet


class Fetch:
    """One ranged GET [start, end) of an entry's source, in flight. ``received``: bytes
    [start, received) are in the file (clean entry) or were handed to the loop (dirty);
    ``marked``: how far ``present`` knows it."""
    __slots__ = ("entry", "start", "end", "received", "marked", "error", "finished",
                 "cancelled", "waiters", "arrived", "_event")

    def __init__(self, entry: CacheEntry, start: int, end: int):
        self.entry, self.start, self.end = entry, start, end
        self.received = self.marked = start
        self.error: StoreError | None = None
        self.finished = False
        self.cancelled = False
        self.waiters = 0
        self.arrived: deque[tuple[int, bytes]] = deque()  # a dirty entry's bytes, for the loop
        self._event = trio.Event()

    def wake(self) -> None:
        ev, self._event = self._event, trio.Event()
        ev.set()

    async def wait(self, upto: int) -> None:
        """Until ``present`` has [start, upto) of this fetch, or it ended; its error raised."""
        self.waiters += 1
        try:
            while self.marked < min(upto, self.end) and not self.finished:
                await self._event.wait()
        finally:
            self.waiters -= 1
        if self.error is not None and self.marked < min(upto, self.end):
            raise self.error


class CacheEntry:
    """One object version's bytes in the cache. ``dirty``, ``gen``, ``meta``, ``writers``
    and ``journaled`` are the write side's state (changed by ``delvefs.client.mount.fs.written``).
    ``present``/``source``/``source_len``: see ``delvefs.client.mount.cache.datacache``."""
    __slots__ = ("bucket", "key", "path", "etag", "size", "validated", "opens", "dirty",
                 "gen", "meta", "writers", "journaled", "present", "source", "source_len",
                 "fetches", "pinned", "blocks", "counted", "serial")

    _serials = itertools.count(1)

    def __init__(self, bucket: str, key: str, path: str):
        self.bucket = bucket
        self.key = key
        self.path = path
        self.etag: str | None = None
        self.size = 0
        self.validated = float("-inf")
        self.opens = 0
        self.dirty = False
        self.gen = 0            # write generation: bumped by every write/truncate
        self.meta: dict | None = None  # dirty entries: the journal record (view, tags, ...)
        self.writers = 0        # open handles writing to it
        self.journaled = False  # its journal record is on disk
        self.present: RangeSet | None = None       # None: every byte is present
        self.source: tuple[str, str, str] | None = None  # (bucket, key, etag) of missing bytes
        self.source_len = 0     # bytes [0, source_len) may come from ``source``
        self.fetches: list[Fetch] = []             # the fetches in flight (byte ranges)
        self.pinned: list[tuple[int, int]] = []    # ranges ``ensure`` calls wait for
        self.blocks: set[int] = set()              # its blocks in the bound's LRU
        self.counted = 0        # what it adds to the bound's ``bytes``
        self.serial = next(self._serials)
