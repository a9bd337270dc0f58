"""The change streams' shared reading of the change log (``GET /v1/views/{id}/stream``).

Without it every stream of a bucket woke at every commit of the bucket and read the
bucket's change log from its own version: with a thousand streams and hundreds of small
commits a second, the handler did a thousand log reads per commit and fell behind.

Here, once per commit of a bucket that has streams, the new change log entries are read
from the store *once* and kept in memory (the newest :data:`KEEP` of the bucket); only the
streams of the views those entries touch are woken; a woken stream's changes come from
memory, and the text it sends is encoded once for every stream of its view that is at the
same version (the clients of one view all are, once caught up). A stream further behind
than the memory reaches reads the store as before.

Everything here runs on the API's event loop (``committed`` is called there by the Hub).
"""
from __future__ import annotations

import asyncio
import bisect

import orjson

from . import records as r
from .engine import view_changes

KEEP = 10_000      # newest change log entries of a bucket kept for its streams
READ_MAX = 5_000   # entries read at one commit; more: forget them, the streams read the store


class Window:
    """The newest change log entries of one bucket: every entry in (start, end]."""

    def __init__(self, top: int):
        self.start = self.end = top
        self.versions: list[int] = []
        self.entries: list[tuple[int, list]] = []
        self.encoded: dict[tuple[str, int], tuple[bytes, int, bool]] = {}  # for the current end

    def restart(self, top: int) -> None:
        self.__init__(top)

    def extend(self, entries: list[tuple[int, list]], top: int) -> None:
        self.versions += [v for v, _ in entries]
        self.entries += entries
        self.end = top
        self.encoded = {}
        drop = len(self.entries) - KEEP
        if drop > 0:
            self.start = self.versions[drop - 1]
            del self.versions[:drop], self.entries[:drop]


class ChangeFeed:
    """Recent changes of the buckets that have change streams, read once per commit."""

    def __init__(self, engine):
        self.engine = engine
        self.streams: dict[str, int] = {}  # bucket -> its open streams
        self.windows: dict[str, Window] = {}
        self.waiting: dict[str, dict[int, asyncio.Event]] = {}  # bucket -> view slot -> its event

    def open(self, bucket: str) -> None:
        """A stream of the bucket begins: keep its recent changes from now on."""
        self.streams[bucket] = self.streams.get(bucket, 0) + 1
        if bucket not in self.windows:
            self.windows[bucket] = Window(self.engine.buckets[bucket].committed)
            self.waiting[bucket] = {}

    def close(self, bucket: str) -> None:
        """A stream of the bucket ended; with its last, its changes are forgotten."""
        self.streams[bucket] -= 1
        if not self.streams[bucket]:
            del self.streams[bucket], self.windows[bucket], self.waiting[bucket]

    def event(self, info) -> asyncio.Event:
        """Set once a commit after now touches the view (get it before reading changes;
        between :meth:`open` and :meth:`close` of the bucket)."""
        slots = self.waiting[info.bucket]
        ev = slots.get(info.slot)
        if ev is None:
            ev = slots[info.slot] = asyncio.Event()
        return ev

    def wake_all(self, bucket: str) -> None:
        """Every stream of the bucket waiting wakes (the bucket was handed to another shard)."""
        for ev in self.waiting.pop(bucket, {}).values():
            ev.set()
        if bucket in self.windows:
            self.waiting[bucket] = {}

    def committed(self, buckets) -> None:
        """Read each bucket's new entries once; wake the views they touch."""
        for bucket in buckets:
            window = self.windows.get(bucket)
            if window is None or bucket not in self.engine.buckets:
                continue
            top = self.engine.buckets[bucket].committed
            entries = []
            for v, e in self.engine.store.iter_changes(bucket, window.end):
                if v > top:
                    break
                entries.append((v, e))
                if len(entries) > READ_MAX:
                    break
            slots = self.waiting[bucket]
            if len(entries) > READ_MAX:  # too much at once: whoever waits reads the store
                window.restart(top)
                woken = list(slots)
            else:
                window.extend(entries, top)
                touched = 0
                for _v, e in entries:
                    touched |= int.from_bytes(e[r.CH_SLOTS], "little")
                    if e[r.CH_EVER] is not None:
                        touched |= int.from_bytes(e[r.CH_EVER], "little")
                woken = [slot for slot in slots if (touched >> slot) & 1]
            for slot in woken:
                slots.pop(slot).set()

    def changes(self, info, since: int, limit: int) -> dict | None:
        """The view's changes after ``since`` (as Engine.changes), or None when memory does
        not reach back to ``since``."""
        window = self.windows.get(info.bucket)
        if window is None or not window.start <= since <= window.end:
            return None
        i = bisect.bisect_right(window.versions, since)
        return view_changes(info, iter(window.entries[i:]), since, window.end, limit)

    def encoded(self, info, since: int, limit: int) -> tuple[bytes, int, bool] | None:
        """What a stream at ``since`` sends (its server-sent events), its new version, and
        whether more follows; one encoding for every stream of the view at ``since``."""
        window = self.windows.get(info.bucket)
        if window is None:
            return None
        done = window.encoded.get((info.id, since))
        if done is not None:
            return done
        res = self.changes(info, since, limit)
        if res is None:
            return None
        done = window.encoded[(info.id, since)] = (stream_text(res["changes"]), res["version"], res["more"])
        return done


def stream_text(changes: list[dict]) -> bytes:
    """Changes as server-sent events (``id:`` is the change's version)."""
    out = bytearray()
    for ch in changes:
        out += b"id: %d\ndata: " % ch["v"] + orjson.dumps(ch) + b"\n\n"
    return bytes(out)
