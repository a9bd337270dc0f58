"""The handler's state machine: registered views, tracked buckets, applying events, scans,
tag fetches, time flips and reconciles — everything that writes LevelDB.

``Engine`` is composed of rooms, one per concern, each a mixin over the state built here:
apply.py (the event path and ``_finalize``, which every writer commits through), scans.py
(first scans, reconciles, rematches, compaction), jobs.py (tag fetches, time flips),
publish.py (batches of an atomic directory publish: held, released, dropped). This
module holds construction, plumbing, view registration and the reads of the HTTP API.
Records are built and parsed by records.py; S3 is read through the ``BucketReader`` given
by the composition root (main.py).

Concurrency rules
-----------------
- ``Engine.lock`` (an RLock) serialises every writer: the AMQP consumer's batches
  (``apply_events``), tag results, scan/reconcile pages, time flips and view registration.
  Each writer builds one WriteBatch under the lock and commits it before releasing it, so a
  batch is atomic and writers never interleave inside one. S3 requests (listing pages, tags,
  heads) are made *outside* the lock, in the worker pools.
- Readers (the HTTP API on the asyncio thread and its executor) never take the lock: they
  read LevelDB (thread-safe; an iterator reads a consistent snapshot) and in-memory
  structures that writers replace or update with single atomic assignments
  (``tracked``, ``views_by_id``, ``BucketState.committed``).
- ``BucketState.version`` is the writer's working counter; ``committed`` is published only
  after the batch is written, so a reader that sees version V finds every change <= V.
- Events of a bucket whose first scan is running are held in LevelDB (``E`` records, written
  before the ack; memory stays bounded however long the scan takes). After the listing they
  are applied in chunks, each deleted in the batch that applies it (sequencers order them
  against the listing); the last chunk and the switch to "ready" happen under one lock hold.
- The consumer acks a batch only after ``apply_events`` returned, i.e. after the WriteBatch
  holding its events was written.
- After each commit the engine calls its listeners with the set of changed buckets (the API
  wakes long-polls and streams from there, via loop.call_soon_threadsafe).

Threads owned here: ``delvefs-s3`` pool (HeadObject/GetObjectTagging, bounded), ``delvefs-job``
pool (scans, rematches, reconciles), ``tag-apply`` (drains tag results in batches),
``flips`` (re-evaluates time-relative views when an answer can flip), ``reconcile``
(periodic re-listing), ``publish`` (drops publish batches past their deadline).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from delvefs.shared.config import MAX_PROOF_LIFETIME
from rulesets import View, compile_views, view_id

from . import records as r
from . import statedb as st
from .apply import EventApplier
from .jobs import FlipScheduler, TagFetcher
from .publish import DEFAULT_PUBLISH_TIMEOUT, BatchPublisher
from .scans import Scanner
from .tracking import (READY, SCANNING, BucketState, ViewInfo, bucket_base_version,
                       bucket_glob_message, bucket_is_glob)

log = logging.getLogger("delvefs.eventhandler")

DEFAULT_VIEW_TTL = 7 * 86400.0
CLEAR_CHUNK = 1000  # records per lock hold when a forgotten view's slot is cleared
# what an empty slot holds in the matcher: a view of no bucket ("/" is in no bucket name)
FREED = View(name="(no view)", bucket="/")


class Engine(EventApplier, Scanner, TagFetcher, FlipScheduler, BatchPublisher):
    """``s3``: what the engine reads from S3 (``delvefs.shared.s3.BucketReader``: listings,
    tags, user metadata, the store's clock); only the worker pools call it."""

    def __init__(self, store: st.Store, metrics, s3, *,
                 s3_workers: int = 16, job_workers: int = 2, reconcile_interval: float = 0.0,
                 tombstone_horizon: float = 86400.0, view_ttl: float = DEFAULT_VIEW_TTL,
                 publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT, on_storage_error=None):
        self.store = store
        # called (any thread) with a reason when LevelDB cannot be written: the process stops
        self.on_storage_error = on_storage_error or (lambda reason: None)
        self.metrics = metrics
        self.lock = threading.RLock()
        self.s3 = s3
        self.s3_pool = ThreadPoolExecutor(s3_workers, thread_name_prefix="delvefs-s3")
        self.jobs = ThreadPoolExecutor(job_workers, thread_name_prefix="delvefs-job")
        self.reconcile_interval = reconcile_interval
        self.scan_retry = 1.0  # first delay before a failed first scan is tried again
        self.tombstone_horizon = tombstone_horizon
        self.view_ttl = view_ttl  # views no mount used this long are forgotten (0: never)
        self.publish_timeout = publish_timeout  # a published batch is shown by then at the latest
        self.started = time.time()
        self._listeners = []
        # called with the buckets whose first scans are about to begin (a shard binds its queue
        # for them first: eventhandler/amqp.py); any thread but the consumer's
        self.before_first_scans = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tag_results: queue.SimpleQueue = queue.SimpleQueue()
        self._tag_ticket: dict[tuple[str, str], int] = {}
        # (bucket, key) -> seq of fetches that failed; retried by the next reconcile
        self._tag_failed: dict[tuple[str, str], int] = {}
        self._flip_heap: list = []
        self._flip_at: dict[tuple[str, str], float] = {}
        self._flip_cond = threading.Condition()
        self._job_futures: dict[tuple[str, str], object] = {}
        self._bits_memo: dict[tuple, bytes] = {}
        # committed object records by (bucket, key), for the event path only (bounded)
        self._cache: dict[tuple[str, str], list] = {}
        # views and buckets (restored from the store). ``views`` and ``by_slot`` are indexed
        # by slot (FREED and None where no view is); ``infos`` lists the registered views.
        # Readers iterate them without the lock: writers replace them, never change them.
        self.views: list[View] = []
        self.by_slot: list[ViewInfo | None] = []
        self.infos: list[ViewInfo] = []
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
        self._clearing: dict[int, str] = store.load_freeing()  # slot -> bucket, bits being cleared
        self._free_slots: set[int] = set()  # cleared: reusable
        self._view_log_n = store.last_view_log()
        for rec in store.load_views():
            view = View.from_filter_spec(rec["names"][0] if rec["names"] else rec["id"], rec["spec"])
            info = ViewInfo(rec["id"], rec["slot"], rec["spec"], view, set(rec["names"]),
                            rec["floor"], rec["ready"], rec["created"], rec["principals"], rec["used"])
            self._add_view(info)
        for slot in self._clearing:
            self._grow_slots(slot)
        self._free_slots = {slot for slot, info in enumerate(self.by_slot)
                            if info is None and slot not in self._clearing}
        for name, rec in store.load_buckets().items():
            self.buckets[name] = BucketState(name, rec["state"], rec["version"], rec["tags"],
                                             rec["scanned"], rec["purged"])
            self.buckets[name].held = store.last_held(name)
            self.buckets[name].groups = frozenset(store.member_groups(name))
        self._load_batches()
        self._recompile()

    # ---- plumbing ------------------------------------------------------------------

    def add_listener(self, fn) -> None:
        """fn(set_of_buckets) is called (from a writer thread) after changes are committed."""
        self._listeners.append(fn)

    def _notify(self, buckets) -> None:
        for fn in self._listeners:
            try:
                fn(buckets)
            except Exception:  # a listener must never break a writer
                log.exception("change listener failed")

    def _grow_slots(self, slot: int) -> None:
        if slot >= len(self.views):
            n = slot + 1 - len(self.views)
            self.views = self.views + [FREED] * n
            self.by_slot = self.by_slot + [None] * n

    def _add_view(self, info: ViewInfo) -> None:
        self._grow_slots(info.slot)
        assert self.by_slot[info.slot] is None
        views, by_slot = list(self.views), list(self.by_slot)
        views[info.slot], by_slot[info.slot] = info.view, info
        self.views, self.by_slot = views, by_slot
        self.infos = self.infos + [info]
        self.views_by_id = {**self.views_by_id, info.id: info}

    def _take_slot(self) -> int:
        """The lowest cleared slot, else a new one."""
        if self._free_slots:
            slot = min(self._free_slots)
            self._free_slots.discard(slot)
            return slot
        return len(self.views)

    def _recompile(self) -> None:
        self.matcher = compile_views(self.views)
        self.tracked = frozenset(self.buckets)
        self.time_buckets = frozenset(v.bucket for v in self.views if v.is_time_dependent)
        # buckets where a fetch can be owed: a listing carries neither tags nor metadata, an
        # event no tags; _finalize decides per object whether they can change an answer
        self.meta_buckets = frozenset(b for b in self.buckets if self.matcher.needs_metadata(b))
        self.tag_rule_buckets = frozenset(b for b in self.buckets if self.matcher.needs_tags(b))
        self.tag_buckets = self.tag_rule_buckets | self.meta_buckets
        # their members' tags and metadata are fetched (_finalize decides which objects);
        # not a meta bucket: the metadata of objects in no such view is not read
        self.layout_buckets = frozenset(b for b in self.buckets if self.matcher.lists_properties(b))
        self._names_memo = {}

    def start(self) -> None:
        """Start the background threads and resume unfinished work (scans, rematches, tags)."""
        for name, target in (("tag-apply", self._tag_apply_loop), ("flips", self._flip_loop),
                             ("reconcile", self._reconcile_loop), ("publish", self._publish_loop)):
            t = threading.Thread(target=target, name=f"delvefs-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        for bs in list(self.buckets.values()):
            if bs.state == SCANNING:
                self._submit_job(bs.name, "scan", self._first_scan, bs.name)
        for info in self.infos:
            if not info.ready and self.buckets.get(info.bucket, None) and \
                    self.buckets[info.bucket].state == READY:
                self._submit_job(info.bucket, "rematch", self._rematch, info.bucket)
        for slot, bucket in list(self._clearing.items()):  # forgotten before the last stop
            self._submit_job(bucket, f"clear slot {slot}", self._clear_slot, slot, bucket)
        if self.view_ttl > 0:
            t = threading.Thread(target=self._view_sweep_loop, name="delvefs-views", daemon=True)
            t.start()
            self._threads.append(t)
        with self.lock:
            for bucket, key, _seq in self.store.pending_tags():
                rec = self.store.get_object(bucket, key)
                if rec is not None and r.is_tags_pending(rec):
                    self._fetch_tags(bucket, key, rec)
        if self.time_buckets:
            self.jobs.submit(self._schedule_all_flips)

    def close(self) -> None:
        self._stop.set()
        with self._flip_cond:
            self._flip_cond.notify_all()
        self._tag_results.put(None)
        self.jobs.shutdown(wait=True, cancel_futures=True)
        self.s3_pool.shutdown(wait=True, cancel_futures=True)
        self._tag_results.put(None)
        for t in self._threads:
            t.join(10)

    def _submit_job(self, bucket, kind, fn, *args):
        key = (bucket, kind)
        with self.lock:
            fut = self._job_futures.get(key)
            if fut is not None and not fut.done():
                return fut
            fut = self.jobs.submit(self._guard, fn, *args)
            self._job_futures[key] = fut
            return fut

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            self._background_failed(exc, f"background job {fn.__name__}{args!r}")
            raise

    def _background_failed(self, exc: Exception, what: str) -> None:
        if self._stop.is_set():
            return
        if isinstance(exc, st.StorageError):
            log.error("%s: writing the state failed: %s", what, exc)
            self.on_storage_error(f"LevelDB: {exc}")
        else:
            log.error("%s failed", what, exc_info=exc)

    # ---- registration -----------------------------------------------------------

    def register(self, views: list[tuple[str, dict]], principal: str | None = None) -> list[dict]:
        """Register (name, filter spec) pairs for ``principal``; identical specs share an id.
        Raises ValueError for an invalid spec. Starts first scans / rematches as needed."""
        parsed = []
        for name, spec in views:
            try:
                view = View.from_filter_spec(name, spec)
                canonical = view.filter_spec()
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"view {name!r}: invalid spec: {exc}") from None
            if not isinstance(view.bucket, str) or not view.bucket:
                raise ValueError(f"view {name!r}: bucket must be a non-empty string")
            if bucket_is_glob(view.bucket):
                raise ValueError(bucket_glob_message(name, view.bucket))
            parsed.append((name, view, canonical))
        out = []
        now = time.time()
        with self.lock:
            wb = self.store.batch()
            new_views, scans, rematch = False, [], set()
            for name, view, canonical in parsed:
                vid = view_id(canonical)
                info = self.views_by_id.get(vid)
                known = info is not None
                if info is None:
                    bs = self.buckets.get(view.bucket)
                    if bs is None:
                        bs = BucketState(view.bucket, SCANNING, bucket_base_version())
                        self.buckets[view.bucket] = bs
                        scans.append(view.bucket)
                        wb.put(r.k_bucket(bs.name), bs.record())
                    elif bs.state == READY:
                        rematch.add(view.bucket)
                    else:  # pages listed so far were matched without this view
                        bs.rematch_needed = True
                    info = ViewInfo(vid, self._take_slot(), canonical, view, {name}, bs.committed,
                                    False, now)
                    self._add_view(info)
                    new_views = True
                    self._log_view(wb, "registered", info, principal, "new view")
                elif name not in info.names:
                    info.names = info.names | {name}
                if principal is not None:
                    if known and principal not in info.principals:
                        self._log_view(wb, "registered", info, principal, "another registrant")
                    info.principals = {**info.principals, principal: now}
                info.used = now
                wb.put(r.k_view(vid), info.record())
                out.append({"name": name, "id": vid, "version": self.buckets[info.bucket].committed})
            if new_views:
                self._recompile()
            for b in rematch:  # a new view on a tracked bucket: match its objects first
                bs = self.buckets[b]
                bs.tags = bs.tags or b in self.tag_buckets
                wb.put(r.k_bucket(b), bs.record())
            self.store.write(wb)
        if scans and self.before_first_scans is not None:
            self.before_first_scans(scans)
        for b in scans:
            self._submit_job(b, "scan", self._first_scan, b)
        for b in rematch:
            self._submit_job(b, "rematch", self._rematch, b)
        if new_views and self.time_buckets:
            self.jobs.submit(self._schedule_all_flips)
        return out

    # ---- views that live: use, unregistering, forgetting ---------------------------------

    def touch(self, info: ViewInfo) -> None:
        """A mount used the view (listed it, polled its changes): any thread, no lock."""
        info.used = time.time()

    def touch_covered(self, principal: str, bucket: str, prefix: str) -> None:
        """``principal`` renewed its proof of ``bucket``/``prefix``: the views it registered
        there are in use."""
        now = time.time()
        for info in self.infos:
            if info.bucket == bucket and principal in info.principals and info.view.root.startswith(prefix):
                info.used = now

    def unregister(self, vid: str, principal: str) -> bool | None:
        """Drop ``principal``'s registration of view ``vid``; the view is forgotten when no
        registration remains. None when ``principal`` holds none; else whether it was forgotten."""
        with self.lock:
            info = self.views_by_id.get(vid)
            if info is None or principal not in info.principals:
                return None
            info.principals = {p: t for p, t in info.principals.items() if p != principal}
            if info.principals:
                wb = self.store.batch()
                self._log_view(wb, "unregistered", info, principal, "other registrants remain")
                wb.put(r.k_view(vid), info.record())
                self.store.write(wb)
                return False
            self._forget(info, principal, "unregistered by its last registrant")
            return True

    def _forget(self, info: ViewInfo, principal: str | None, reason: str) -> None:
        """Forget a view (call with the lock held): its record goes, its slot is cleared from
        its bucket's records in the background and reused after that."""
        slot = info.slot
        wb = self.store.batch()
        self._log_view(wb, "forgotten", info, principal, reason)
        wb.delete(r.k_view(info.id))
        wb.put(r.k_freeing(slot), r.packb(info.bucket))
        self.store.write(wb)
        views, by_slot = list(self.views), list(self.by_slot)
        views[slot], by_slot[slot] = FREED, None
        self.views, self.by_slot = views, by_slot
        self.infos = [i for i in self.infos if i is not info]
        self.views_by_id = {vid: i for vid, i in self.views_by_id.items() if i is not info}
        self._clearing[slot] = info.bucket
        self._recompile()
        self._submit_job(info.bucket, f"clear slot {slot}", self._clear_slot, slot, info.bucket)

    def release_bucket(self, bucket: str, reason: str) -> list[str]:
        """Forget a bucket another shard now owns: its views, then (once the jobs of the
        bucket are done) every record of it, so that it is scanned afresh should it come
        back. Returns the ids of the views forgotten. Blocks: not on the event loop."""
        with self.lock:
            gone = [info for info in self.infos if info.bucket == bucket]
            for info in gone:
                self._forget(info, None, reason)
            jobs = [fut for (b, _kind), fut in self._job_futures.items() if b == bucket]
        for fut in jobs:
            try:
                fut.result()
            except Exception:  # logged by the job; the records go anyway
                pass
        with self.lock:
            deleted = self.store.delete_bucket(bucket)
            self.buckets.pop(bucket, None)
            self._recompile()
        log.warning("released bucket %s (%s): %d views forgotten, %d records deleted",
                    bucket, reason, len(gone), deleted)
        return [info.id for info in gone]

    def _clear_slot(self, slot: int, bucket: str) -> int:
        """Clear ``slot`` from ``slots`` and ``ever`` of every record of ``bucket`` (moving
        membership entries to their new groups), in chunks under the lock; then the slot is
        free. Nothing sets the bit meanwhile: no view holds the slot. Returns the records changed."""
        after, changed = None, 0
        while not self._stop.is_set():
            with self.lock:
                wb = self.store.batch()
                n = 0
                groups = set()
                for key, rec in self.store.iter_objects(bucket, after=after):
                    n += 1
                    after = key
                    old_slots = rec[r.OBJ_SLOTS]
                    if r.bits_has(old_slots, slot) or r.bits_has(rec[r.OBJ_EVER], slot):
                        new = list(rec)
                        new[r.OBJ_SLOTS] = slots = r.bits_without(old_slots, slot)
                        new[r.OBJ_EVER] = r.bits_without(rec[r.OBJ_EVER], slot)
                        if slots != old_slots:
                            wb.delete(r.k_member(bucket, old_slots, key))
                            if slots:
                                # the views left list a subset of the names the entry has
                                names = self._listed_names(slots)
                                props = r.only_properties(self._stored_props(bucket, old_slots, key),
                                                          names) if names else None
                                wb.put(r.k_member(bucket, slots, key), r.pack_member(new, props))
                                groups.add(slots)
                        wb.put(r.k_obj(bucket, key), r.pack_object(new))
                        self._cache.pop((bucket, key), None)  # the event path reads it anew
                        changed += 1
                    if n >= CLEAR_CHUNK:
                        break
                bs = self.buckets[bucket]
                bs.groups = bs.groups | groups  # before the write, as _finalize does
                if n < CLEAR_CHUNK:  # the last chunk: the slot is free with it
                    wb.delete(r.k_freeing(slot))
                try:
                    self.store.write(wb)
                except BaseException:
                    self._cache.clear()
                    raise
                if n < CLEAR_CHUNK:
                    bs.groups = frozenset(self.store.member_groups(bucket))
                    del self._clearing[slot]
                    self._free_slots.add(slot)
                    log.info("slot %d of forgotten view cleared from bucket %s (%d records)", slot, bucket, changed)
                    return changed
        return changed

    def _log_view(self, wb, op: str, info: ViewInfo, principal: str | None, reason: str) -> None:
        """A log line and an entry of the registration log (in ``wb``); call with the lock held."""
        n = self._view_log_n = self._view_log_n + 1
        entry = {"n": n, "time": time.time(), "op": op, "id": info.id, "bucket": info.bucket,
                 "root": info.view.root or "", "principal": principal, "reason": reason}
        wb.put(r.k_view_log(n), r.packb(entry))
        if n > r.VIEW_LOG_SIZE:
            wb.delete(r.k_view_log(n - r.VIEW_LOG_SIZE))
        log.info("view %s (bucket %s, root %r) %s by %s: %s", info.id, info.bucket, entry["root"], op,
                 principal or "the handler", reason)

    def view_log(self, after: int = 0) -> list[dict]:
        """The registration log after entry ``after`` (any thread)."""
        return self.store.view_log(after)

    def _view_sweep_loop(self) -> None:
        """Forget views no mount used for ``view_ttl`` and keep the ``used`` times in their
        records. After a start, nothing is forgotten before a live mount has had the time to
        show up (its proofs are renewed at least every MAX_PROOF_LIFETIME / 2)."""
        ttl = self.view_ttl
        interval = max(min(ttl / 10, 3600.0), 0.05)
        grace = min(ttl, MAX_PROOF_LIFETIME)
        while not self._stop.wait(interval):
            try:
                self.sweep_views(time.time(), grace)
            except Exception as exc:
                self._background_failed(exc, "forgetting unused views")

    def sweep_views(self, now: float, grace: float = 0.0) -> list[str]:
        """One pass of the sweep (see _view_sweep_loop); the ids of the views forgotten."""
        ttl = self.view_ttl
        forgotten = []
        with self.lock:
            if now - self.started >= grace:
                for info in list(self.infos):
                    if now - info.used > ttl:
                        self._forget(info, None, f"no mount used it for {now - info.used:.0f} s "
                                                 f"(view ttl {ttl:g} s)")
                        forgotten.append(info.id)
            stale = [info for info in self.infos if info.used - info.saved_used > min(ttl / 10, 3600.0)]
            if stale:
                wb = self.store.batch()
                for info in stale:
                    wb.put(r.k_view(info.id), info.record())
                self.store.write(wb)
        return forgotten

    def view_ready(self, info: ViewInfo) -> bool:
        bs = self.buckets.get(info.bucket)
        return info.ready and bs is not None and bs.state == READY

    # ---- reads (any thread, no lock) --------------------------------------------------

    def change_floor(self, info: ViewInfo) -> int:
        """The lowest ``since`` whose changes the log still holds completely for the view."""
        return max(info.floor, self.buckets[info.bucket].purged)


    def lookup(self, bucket: str, key: str) -> dict | None:
        if bucket not in self.buckets:
            return None
        rec = self.store.get_object(bucket, key)
        if rec is None or r.is_deleted(rec):
            return None
        by_slot = self.by_slot
        return {"bucket": bucket, "key": key, **r.object_fields(rec),
                "views": [by_slot[s].id for s in r.view_slots(rec) if s < len(by_slot) and by_slot[s]]}

    def list_view(self, info: ViewInfo, after: str | None, limit: int) -> dict:
        """One page of a view, in key order: a merge of the membership groups that hold its
        slot (only its members are read). The version is taken first, so changes after it
        may already show; a client applies the changes since it, which is idempotent."""
        bs = self.buckets[info.bucket]
        version = bs.committed
        slot = info.slot
        groups = [g for g in bs.groups if r.bits_has(g, slot)]
        objects = []
        more = False
        names = info.view.layout_by  # None: a view that lists no property values
        for key, entry in self.store.iter_members(info.bucket, groups, after):
            if len(objects) >= limit:
                more = True
                break
            objects.append(r.member_listing(key, entry, names))
        return {"version": version, "objects": objects,
                "next": objects[-1]["key"] if more and objects else None}

    def changes(self, info: ViewInfo, since: int, limit: int) -> dict:
        """Changes of a view after ``since`` (caller checked since >= floor)."""
        top = self.buckets[info.bucket].committed
        return view_changes(info, self.store.iter_changes(info.bucket, since), since, top, limit)


def view_changes(info: ViewInfo, entries, since: int, top: int, limit: int) -> dict:
    """A view's changes (``GET /v1/views/{id}/changes``) among change log ``entries``
    ((version, entry), ascending, from after ``since``), up to version ``top``."""
    slot = info.slot
    out = []
    more = False
    last_v = since
    names = info.view.layout_by  # None: a view that lists no property values
    for v, e in entries:
        if v > top:
            break
        if len(out) >= limit:
            more = True
            break
        last_v = v
        op = r.change_view_op(e, slot)
        if op == "put":
            out.append({"v": v, "op": "put", "key": r.change_key(e), "object": r.change_object(e, names)})
        elif op == "delete":
            out.append({"v": v, "op": "delete", "key": r.change_key(e), "object": None})
    return {"version": last_v if more else top, "changes": out, "more": more}
