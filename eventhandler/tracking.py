"""What the handler tracks, in memory: its registered views (``ViewInfo``) and the buckets
they name (``BucketState``), plus the check of a view's bucket rule. Their LevelDB records
are built by records.py; the engine owns the instances (see engine.py for who may change
which field under which lock)."""
from __future__ import annotations

import threading
import time

from . import records

SCANNING, READY = "scanning", "ready"


class BucketState:
    __slots__ = ("name", "state", "version", "committed", "tags", "held", "ready", "scanned",
                 "rematch_needed", "purged", "groups", "scan_error", "scan_listed")

    def __init__(self, name, state, version, tags=False, scanned=0.0, purged=0):
        self.name = name
        self.state = state
        self.version = version
        self.committed = version
        # change-log entries <= purged may be gone (compacted tombstones): older `since` resync
        self.purged = purged
        self.tags = tags
        self.held = 0  # counter of the last event held (E record) during the first scan
        self.scan_error: str | None = None  # why the last attempt of the first scan failed
        self.scan_listed = 0  # objects the first scan's current attempt has listed so far
        self.ready = threading.Event()
        self.scanned = scanned
        self.rematch_needed = False
        # bitmaps of the bucket's membership groups (``m`` records): a superset of the
        # non-empty ones, replaced (never mutated) by writers under the lock, so listing
        # threads read it without one; rebuilt from the store by each compaction
        self.groups: frozenset[bytes] = frozenset()
        if state == READY:
            self.ready.set()

    def record(self) -> bytes:
        return records.pack_bucket(self.state, self.version, self.tags, self.scanned, self.purged)


class ViewInfo:
    """A registered view. ``principals``: who registered it, when last ({name: epoch});
    ``used``: when a mount last registered, listed, polled or renewed a proof for it (set
    without the lock: a float assignment); ``saved_used``: the ``used`` in its record."""

    __slots__ = ("id", "slot", "spec", "view", "bucket", "names", "floor", "ready", "created",
                 "principals", "used", "saved_used")

    def __init__(self, vid, slot, spec, view, names, floor, ready, created, principals=None, used=None):
        self.id, self.slot, self.spec, self.view = vid, slot, spec, view
        self.bucket = view.bucket
        self.names, self.floor, self.ready, self.created = names, floor, ready, created
        self.principals: dict[str, float] = principals or {}
        self.used = self.saved_used = created if used is None else used

    def record(self) -> bytes:
        self.saved_used = self.used
        return records.pack_view(self.id, self.slot, self.spec, self.names, self.floor, self.ready,
                                 self.created, self.principals, self.used)


def bucket_base_version() -> int:
    """The first change-log version of a bucket tracked from now (see records.py)."""
    return int(time.time() * 1e6)


_GLOB_CHARS = frozenset("*?[{\\")


def bucket_is_glob(bucket: str) -> bool:
    """True for a ``bucket`` rule that is a glob (e.g. ``runs-*``): not served yet."""
    return any(c in _GLOB_CHARS for c in bucket)


def bucket_glob_message(name: str, bucket: str) -> str:
    return (f"view {name!r}: bucket {bucket!r}: bucket globs are not supported by this handler "
            "yet: name the bucket")
