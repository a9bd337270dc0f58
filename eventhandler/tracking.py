"""What the handler tracks, in memory: its registered views (``ViewInfo``) and the buckets
they name (``BucketState``), the ``Catalog`` that holds them by slot and by name with the
matcher compiled from them, plus the check of a view's bucket rule. Their LevelDB records
are built by records.py; engine.py says which part may change which field under which lock."""
from __future__ import annotations

import threading
import time

from rulesets import View, compile_views

from . import records

SCANNING, READY = "scanning", "ready"
# what an empty slot holds in the matcher: a view of no bucket ("/" is in no bucket name)
FREED = View(name="(no view)", bucket="/")


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


class Catalog:
    """The ``catalog`` part of ``Engine``: the registered views by slot and by id, the tracked
    buckets, and the matcher compiled from the views with the sets of buckets that need
    what (restored from the store when built).

    Writers call its methods with ``Engine.lock`` held. Readers (any thread) take no lock:
    ``slot_views``, ``by_slot``, ``infos``, ``views_by_id``, ``tracked``, ``matcher`` and the
    bucket sets are replaced by writers, never changed; ``buckets`` gains and loses keys
    only (single dict operations). ``clearing`` and ``free_slots`` are read and changed
    under the lock only."""

    def __init__(self, store):
        # indexed by slot: the matcher's views (FREED where no view is) and their ViewInfo
        self.slot_views: list[View] = []
        self.by_slot: list[ViewInfo | None] = []
        self.infos: list[ViewInfo] = []  # the registered views
        self.views_by_id: dict[str, ViewInfo] = {}
        self.buckets: dict[str, BucketState] = {}
        self.tracked: frozenset[str] = frozenset()
        self.time_buckets: frozenset[str] = frozenset()
        self.tag_buckets: frozenset[str] = frozenset()
        self.meta_buckets: frozenset[str] = frozenset()
        self.tag_rule_buckets: frozenset[str] = frozenset()
        # buckets with a view listing property values (layout_by), and the property names
        # each membership group's views list (by group bitmap; reset with the matcher)
        self.layout_buckets: frozenset[str] = frozenset()
        self._names_memo: dict[bytes, tuple[str, ...]] = {}
        self.clearing: dict[int, str] = store.load_freeing()  # slot -> bucket, bits being cleared
        for rec in store.load_views():
            view = View.from_filter_spec(rec["names"][0] if rec["names"] else rec["id"], rec["spec"])
            self.add_view(ViewInfo(rec["id"], rec["slot"], rec["spec"], view, set(rec["names"]),
                                   rec["floor"], rec["ready"], rec["created"], rec["principals"],
                                   rec["used"]))
        for slot in self.clearing:
            self._grow_slots(slot)
        self.free_slots: set[int] = {slot for slot, info in enumerate(self.by_slot)
                                     if info is None and slot not in self.clearing}  # reusable
        for name, rec in store.load_buckets().items():
            bs = self.buckets[name] = BucketState(name, rec["state"], rec["version"], rec["tags"],
                                                  rec["scanned"], rec["purged"])
            bs.held = store.last_held(name)
            bs.groups = frozenset(store.member_groups(name))
        self.recompile()

    def _grow_slots(self, slot: int) -> None:
        if slot >= len(self.slot_views):
            n = slot + 1 - len(self.slot_views)
            self.slot_views = self.slot_views + [FREED] * n
            self.by_slot = self.by_slot + [None] * n

    def take_slot(self) -> int:
        """The lowest cleared slot, else a new one."""
        if self.free_slots:
            slot = min(self.free_slots)
            self.free_slots.discard(slot)
            return slot
        return len(self.slot_views)

    def add_view(self, info: ViewInfo) -> None:
        """Put a view in its slot (``recompile`` makes the matcher see it)."""
        self._grow_slots(info.slot)
        assert self.by_slot[info.slot] is None
        views, by_slot = list(self.slot_views), list(self.by_slot)
        views[info.slot], by_slot[info.slot] = info.view, info
        self.slot_views, self.by_slot = views, by_slot
        self.infos = self.infos + [info]
        self.views_by_id = {**self.views_by_id, info.id: info}

    def remove_view(self, info: ViewInfo) -> None:
        """Take a forgotten view out; its slot is being cleared (``slot_cleared`` frees it)."""
        slot = info.slot
        views, by_slot = list(self.slot_views), list(self.by_slot)
        views[slot], by_slot[slot] = FREED, None
        self.slot_views, self.by_slot = views, by_slot
        self.infos = [i for i in self.infos if i is not info]
        self.views_by_id = {vid: i for vid, i in self.views_by_id.items() if i is not info}
        self.clearing[slot] = info.bucket

    def slot_cleared(self, slot: int) -> None:
        """No record has ``slot`` any more: it is free for the next view."""
        del self.clearing[slot]
        self.free_slots.add(slot)

    def add_bucket(self, bs: BucketState) -> None:
        self.buckets[bs.name] = bs

    def drop_bucket(self, name: str) -> None:
        self.buckets.pop(name, None)

    def recompile(self) -> None:
        """Compile the matcher from the views and derive the bucket sets from it."""
        self.matcher = compile_views(self.slot_views)
        self.tracked = frozenset(self.buckets)
        self.time_buckets = frozenset(v.bucket for v in self.slot_views if v.is_time_dependent)
        # buckets where a fetch can be owed: a listing carries neither tags nor metadata, an
        # event no tags; the committer decides per object whether they can change an answer
        self.meta_buckets = frozenset(b for b in self.buckets if self.matcher.needs_metadata(b))
        self.tag_rule_buckets = frozenset(b for b in self.buckets if self.matcher.needs_tags(b))
        self.tag_buckets = self.tag_rule_buckets | self.meta_buckets
        # their members' tags and metadata are fetched (the committer decides which objects);
        # not a meta bucket: the metadata of objects in no such view is not read
        self.layout_buckets = frozenset(b for b in self.buckets if self.matcher.lists_properties(b))
        self._names_memo = {}

    def listed_names(self, slots: bytes) -> tuple[str, ...]:
        """The property names the views of group ``slots`` list (memo reset by recompile)."""
        memo = self._names_memo
        names = memo.get(slots)
        if names is None:
            if len(memo) > 4096:
                memo.clear()
            names = memo[slots] = self.matcher.listed_property_names(records.slots_of(slots))
        return names

    def view_ready(self, info: ViewInfo) -> bool:
        bs = self.buckets.get(info.bucket)
        return info.ready and bs is not None and bs.state == READY


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
