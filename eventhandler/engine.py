"""The handler's state machine: registered views, tracked buckets, applying events, scans,
tag fetches, time flips and reconciles — everything that writes LevelDB.

``Engine`` is a facade over parts that own their state, built in ``Engine.__init__`` and
passed to each other at construction (each names what it uses; arrows point at what a
part calls). Every part that writes takes the one ``Engine.lock``; the store (statedb.py),
the metrics, the ``BucketReader`` (``s3``, given by the composition root, main.py) and the
two pools are handed to the parts that use them, ``background`` to every part with a
thread or a job (the stop flag, failures).

``background``  (jobs.py ``Background``) the stop flag, the ``delvefs-job`` pool with one
                job per (bucket, kind) at a time, the threads, what a failure does
``catalog``     (tracking.py ``Catalog``) the views by slot and id, the tracked buckets
                (``BucketState``), the matcher compiled from the views and the bucket
                sets derived from it, the slots being cleared and the free ones
``tags``        (jobs.py ``TagFetcher``) tag/metadata fetches: tickets, failures, the
                results queue                                               → catalog
``flips``       (jobs.py ``FlipScheduler``) when answers of time-relative views can
                flip: the heap and its condition                            → catalog
``committer``   (apply.py ``Committer``) ``finalize``: match, diff and commit records in
                one WriteBatch; the record cache, the listeners  → catalog, tags, flips
``publisher``   (publish.py ``BatchPublisher``) atomic directory publish: the batches
                held, released, dropped                          → catalog, committer
``applier``     (apply.py ``EventApplier``) events, held events, tag results, due flips
                                               → catalog, committer, publisher, tags
``scanner``     (scans.py ``Scanner``) first scans, reconciles, rematches, compaction,
                clearing forgotten slots; the listings under way
                                                 → catalog, committer, applier, tags
``views``       (``Listings`` here) registration, unregistering, forgetting, releasing a
                bucket, the sweep of unused views, the registration log
                                                           → catalog, scanner, flips
``store_watch`` (storewatch.py ``StoreWatch``; None for a reader that cannot probe) the
                object store's outages and restarts, repaired by reconciles  → scanner

The threads are wired here too: ``tag-apply`` runs ``tags.run(applier.apply_tag_results)``,
``store-watch`` runs ``store_watch.run`` and ``flips`` runs ``flips.run(applier.apply_flips)`` (their results are applied by the
applier: the committer starts fetches and schedules flips, so they sit below it).
``Engine`` keeps start/close, delegating methods for the rest of the handler (the
consumers, the API, groups, the feed) and the reads of the HTTP API. No part assigns
another part's fields; a part changes another's state only through its methods.

``BucketState`` and ``ViewInfo`` (tracking.py) are records the catalog holds, not parts;
each field is written by the part named, under the lock unless said. ``BucketState``:
``version``, ``committed`` by the committer; ``groups`` grown by the committer and by the
scanner's slot clearing, rebuilt from the store by the scanner; ``held`` by the applier;
``state``, ``tags``, ``scanned``, ``ready`` (an Event), ``purged`` by the scanner, and
``scan_error``, ``scan_listed`` too, without the lock (only it writes them; the API reads);
``rematch_needed`` set by ``views`` (a view added during a first scan) and cleared by the
scanner (after the listing, without the lock); ``tags`` also by ``views`` (a view added to
a ready bucket). ``ViewInfo``: ``ready`` and ``floor`` by the scanner; ``names``,
``principals`` and ``used`` by ``views`` (``used`` also by ``touch``, any thread, no lock:
a float assignment).

Concurrency rules
-----------------
- ``Engine.lock`` (an RLock) serialises every writer: the AMQP consumer's batches
  (``apply_events``), tag results, scan/reconcile pages, time flips and view registration.
  Each writer builds one WriteBatch under the lock and commits it before releasing it, so a
  batch is atomic and writers never interleave inside one. S3 requests (listing pages, tags,
  heads) are made *outside* the lock, in the worker pools.
- Lock order: ``Engine.lock``, then ``FlipScheduler``'s condition (``flips.schedule`` runs
  inside commits); the ``flips`` thread releases that condition before it takes the
  engine's lock. No part holds any other lock of its own.
- Readers (the HTTP API on the asyncio thread and its executor) never take the lock: they
  read LevelDB (thread-safe; an iterator reads a consistent snapshot) and in-memory
  structures that writers replace or update with single atomic assignments
  (the catalog's ``tracked``, ``views_by_id``, ``infos``, ``by_slot``, ``BucketState.committed``).
- ``BucketState.version`` is the writer's working counter; ``committed`` is published only
  after the batch is written, so a reader that sees version V finds every change <= V.
- Events of a bucket whose first scan is running are held in LevelDB (``E`` records, written
  before the ack; memory stays bounded however long the scan takes). After the listing they
  are applied in chunks, each deleted in the batch that applies it (sequencers order them
  against the listing); the last chunk and the switch to "ready" happen under one lock hold.
- The consumer acks a batch only after ``apply_events`` returned, i.e. after the WriteBatch
  holding its events was written.
- After each commit the committer calls the listeners with the set of changed buckets (the
  API wakes long-polls and streams from there, via loop.call_soon_threadsafe).
- A tag fetch's ticket is handed out (``tags.fetch``) and claimed (``tags.claim``) under the
  lock; the fetch job (``delvefs-s3`` pool, no lock) only reads its ticket and notes a
  failure (single dict operations).

Threads owned here: ``delvefs-s3`` pool (HeadObject/GetObjectTagging, bounded), ``delvefs-job``
pool (scans, rematches, reconciles, slot clearings), ``tag-apply`` (drains tag results in
batches), ``flips`` (re-evaluates time-relative views when an answer can flip),
``reconcile`` (periodic re-listing), ``publish`` (drops publish batches past their
deadline), ``views`` (forgets views no mount used for the view ttl).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from delvefs.shared.config import MAX_PROOF_LIFETIME
from rulesets import View, view_id

from . import records as r
from . import statedb as st
from .apply import Committer, EventApplier
from .jobs import Background, FlipScheduler, TagFetcher
from .publish import DEFAULT_PUBLISH_TIMEOUT, BatchPublisher
from .scans import Scanner
from .storewatch import DEFAULT_EVENTS_WAIT, DEFAULT_PROBE_INTERVAL, DEFAULT_SETTLE, StoreWatch
from .tracking import (READY, SCANNING, BucketState, Catalog, ViewInfo, bucket_base_version,
                       bucket_glob_message, bucket_is_glob)

log = logging.getLogger("delvefs.eventhandler")

DEFAULT_VIEW_TTL = 7 * 86400.0


class Views:
    """The ``views`` part of ``Engine``: what happens to registered views — registration,
    unregistering, forgetting (its slot is then cleared by a scanner job), releasing a
    bucket, the sweep of views no mount used for ``view_ttl`` seconds (0: never) — and
    their registration log. Owns the log's counter, ``view_ttl``, ``started`` and the hook
    ``before_first_scans``. Changes the catalog through its methods, under the lock."""

    def __init__(self, lock, store, catalog, scanner, flips, background, *,
                 view_ttl: float = DEFAULT_VIEW_TTL, started: float | None = None):
        self.lock = lock
        self.store = store
        self.catalog = catalog
        self.scanner = scanner
        self.flips = flips
        self.background = background
        self.view_ttl = view_ttl  # views no mount used this long are forgotten (0: never)
        self.started = time.time() if started is None else started  # the sweep's grace counts from it
        self._log_n = store.last_view_log()
        # called with the buckets whose first scans are about to begin (a shard binds its queue
        # for them first: eventhandler/amqp.py); any thread but the consumer's
        self.before_first_scans = None

    def hook_first_scans(self, fn) -> None:
        """Call ``fn(buckets)`` before first scans begin (``before_first_scans``)."""
        self.before_first_scans = fn

    def resume(self) -> None:
        """Submit the first scans, rematches and slot clearings a stop interrupted."""
        catalog, submit, scanner = self.catalog, self.background.submit_job, self.scanner
        for bs in list(catalog.buckets.values()):
            if bs.state == SCANNING:
                submit(bs.name, "scan", scanner.first_scan, bs.name)
        for info in catalog.infos:
            if not info.ready and catalog.buckets.get(info.bucket, None) and \
                    catalog.buckets[info.bucket].state == READY:
                submit(info.bucket, "rematch", scanner.rematch, info.bucket)
        for slot, bucket in list(catalog.clearing.items()):  # forgotten before the last stop
            submit(bucket, f"clear slot {slot}", scanner.clear_slot, slot, bucket)

    # ---- registration -----------------------------------------------------------

    @staticmethod
    def _parse(views: list[tuple[str, dict]]) -> list[tuple[str, View, dict]]:
        """(name, view, canonical spec) of each (name, filter spec); ValueError if invalid."""
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
        return parsed

    def register(self, views: list[tuple[str, dict]], principal: str | None = None) -> list[dict]:
        """Register (name, filter spec) pairs for ``principal``; identical specs share an id.
        Raises ValueError for an invalid spec. Starts first scans / rematches as needed."""
        parsed = self._parse(views)
        out = []
        now = time.time()
        catalog = self.catalog
        with self.lock:
            wb = self.store.batch()
            new_views, scans, rematch = False, [], set()
            for name, view, canonical in parsed:
                vid = view_id(canonical)
                info = catalog.views_by_id.get(vid)
                known = info is not None
                if info is None:
                    bs = catalog.buckets.get(view.bucket)
                    if bs is None:
                        bs = BucketState(view.bucket, SCANNING, bucket_base_version())
                        catalog.add_bucket(bs)
                        scans.append(view.bucket)
                        wb.put(r.k_bucket(bs.name), bs.record())
                    elif bs.state == READY:
                        rematch.add(view.bucket)
                    else:  # pages listed so far were matched without this view
                        bs.rematch_needed = True
                    info = ViewInfo(vid, catalog.take_slot(), canonical, view, {name}, bs.committed,
                                    False, now)
                    catalog.add_view(info)
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
                out.append({"name": name, "id": vid, "version": catalog.buckets[info.bucket].committed})
            if new_views:
                catalog.recompile()
            for b in rematch:  # a new view on a tracked bucket: match its objects first
                bs = catalog.buckets[b]
                bs.tags = bs.tags or b in catalog.tag_buckets
                wb.put(r.k_bucket(b), bs.record())
            self.store.write(wb)
        self._start_jobs(scans, rematch, new_views)
        return out

    def _start_jobs(self, scans: list[str], rematch: set[str], new_views: bool) -> None:
        """After a registration: the first scans, the rematches and the flips it needs."""
        if scans and self.before_first_scans is not None:
            self.before_first_scans(scans)
        submit = self.background.submit_job
        for b in scans:
            submit(b, "scan", self.scanner.first_scan, b)
        for b in rematch:
            submit(b, "rematch", self.scanner.rematch, b)
        if new_views and self.catalog.time_buckets:
            self.background.submit(self.flips.schedule_all)

    # ---- views that live: use, unregistering, forgetting ---------------------------------

    def touch(self, info: ViewInfo) -> None:
        """A mount used the view (listed it, polled its changes): any thread, no lock."""
        info.used = time.time()

    def touch_covered(self, principal: str, bucket: str, prefix: str) -> None:
        """``principal`` renewed its proof of ``bucket``/``prefix``: the views it registered
        there are in use."""
        now = time.time()
        for info in self.catalog.infos:
            if info.bucket == bucket and principal in info.principals and info.view.root.startswith(prefix):
                info.used = now

    def unregister(self, vid: str, principal: str) -> bool | None:
        """Drop ``principal``'s registration of view ``vid``; the view is forgotten when no
        registration remains. None when ``principal`` holds none; else whether it was forgotten."""
        with self.lock:
            info = self.catalog.views_by_id.get(vid)
            if info is None or principal not in info.principals:
                return None
            info.principals = {p: t for p, t in info.principals.items() if p != principal}
            if info.principals:
                wb = self.store.batch()
                self._log_view(wb, "unregistered", info, principal, "other registrants remain")
                wb.put(r.k_view(vid), info.record())
                self.store.write(wb)
                return False
            self.forget(info, principal, "unregistered by its last registrant")
            return True

    def forget(self, info: ViewInfo, principal: str | None, reason: str) -> None:
        """Forget a view (call with the lock held): its record goes, its slot is cleared from
        its bucket's records in the background and reused after that."""
        slot = info.slot
        wb = self.store.batch()
        self._log_view(wb, "forgotten", info, principal, reason)
        wb.delete(r.k_view(info.id))
        wb.put(r.k_freeing(slot), r.packb(info.bucket))
        self.store.write(wb)
        self.catalog.remove_view(info)
        self.catalog.recompile()
        self.background.submit_job(info.bucket, f"clear slot {slot}", self.scanner.clear_slot,
                                   slot, info.bucket)

    def release_bucket(self, bucket: str, reason: str) -> list[str]:
        """Forget a bucket another shard now owns: its views, then (once the jobs of the
        bucket are done) every record of it, so that it is scanned afresh should it come
        back. Returns the ids of the views forgotten. Blocks: not on the event loop."""
        with self.lock:
            gone = [info for info in self.catalog.infos if info.bucket == bucket]
            for info in gone:
                self.forget(info, None, reason)
            jobs = self.background.jobs_of(bucket)
        for fut in jobs:
            try:
                fut.result()
            except Exception:  # logged by the job; the records go anyway
                pass
        with self.lock:
            deleted = self.store.delete_bucket(bucket)
            self.catalog.drop_bucket(bucket)
            self.catalog.recompile()
        log.warning("released bucket %s (%s): %d views forgotten, %d records deleted",
                    bucket, reason, len(gone), deleted)
        return [info.id for info in gone]

    def _log_view(self, wb, op: str, info: ViewInfo, principal: str | None, reason: str) -> None:
        """A log line and an entry of the registration log (in ``wb``); call with the lock held."""
        n = self._log_n = self._log_n + 1
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

    def run_sweeps(self) -> None:
        """The ``views`` thread: forget views no mount used for ``view_ttl`` and keep the
        ``used`` times in their records. After a start, nothing is forgotten before a live
        mount has had the time to show up (its proofs are renewed at least every
        MAX_PROOF_LIFETIME / 2)."""
        ttl = self.view_ttl
        interval = max(min(ttl / 10, 3600.0), 0.05)
        grace = min(ttl, MAX_PROOF_LIFETIME)
        while not self.background.stopping.wait(interval):
            try:
                self.sweep_views(time.time(), grace)
            except Exception as exc:
                self.background.failed(exc, "forgetting unused views")

    def sweep_views(self, now: float, grace: float = 0.0) -> list[str]:
        """One pass of the sweep (see run_sweeps); the ids of the views forgotten."""
        ttl = self.view_ttl
        forgotten = []
        with self.lock:
            if now - self.started >= grace:
                for info in list(self.catalog.infos):
                    if now - info.used > ttl:
                        self.forget(info, None, f"no mount used it for {now - info.used:.0f} s "
                                                f"(view ttl {ttl:g} s)")
                        forgotten.append(info.id)
            stale = [info for info in self.catalog.infos
                     if info.used - info.saved_used > min(ttl / 10, 3600.0)]
            if stale:
                wb = self.store.batch()
                for info in stale:
                    wb.put(r.k_view(info.id), info.record())
                self.store.write(wb)
        return forgotten


class Engine:
    """The facade: builds the parts (see the module) and delegates to them. ``s3``: what the
    engine reads from S3 (``delvefs.shared.s3.BucketReader``: listings, tags, user metadata,
    the store's clock); only the worker pools call it."""

    def __init__(self, store: st.Store, metrics, s3, *,
                 s3_workers: int = 16, job_workers: int = 2, reconcile_interval: float = 0.0,
                 tombstone_horizon: float = 86400.0, view_ttl: float = DEFAULT_VIEW_TTL,
                 publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT, on_storage_error=None,
                 store_probe_interval: float = DEFAULT_PROBE_INTERVAL,
                 store_settle: float = DEFAULT_SETTLE, store_events_wait: float = DEFAULT_EVENTS_WAIT):
        started = time.time()
        self.store = store
        self.metrics = metrics
        self.lock = threading.RLock()
        self.s3_pool = ThreadPoolExecutor(s3_workers, thread_name_prefix="delvefs-s3")
        self.jobs = ThreadPoolExecutor(job_workers, thread_name_prefix="delvefs-job")
        lock = self.lock
        # called (any thread) with a reason when LevelDB cannot be written: the process stops
        self.background = Background(lock, self.jobs, on_storage_error or (lambda reason: None))
        self.catalog = Catalog(store)
        self.tags = TagFetcher(lock, store, metrics, s3, self.s3_pool, self.catalog, self.background)
        self.flips = FlipScheduler(store, self.catalog, self.background)
        self.committer = Committer(store, self.catalog, self.tags, self.flips)
        self.publisher = BatchPublisher(lock, store, metrics, self.catalog, self.committer,
                                        self.background, publish_timeout)
        self.applier = EventApplier(lock, store, metrics, self.catalog, self.committer,
                                    self.publisher, self.tags)
        self.scanner = Scanner(lock, store, metrics, s3, self.s3_pool, self.catalog, self.committer,
                               self.applier, self.tags, self.background,
                               reconcile_interval=reconcile_interval, tombstone_horizon=tombstone_horizon)
        self.views = Views(lock, store, self.catalog, self.scanner, self.flips, self.background,
                           view_ttl=view_ttl, started=started)
        # outages and restarts of the object store, repaired by reconciles (storewatch.py);
        # only a reader that can probe (tests' fakes of the four listing methods cannot)
        self.store_watch = StoreWatch(
            s3, self._ready_buckets, self.scanner.reconcile, metrics, self.background.stopping,
            interval=store_probe_interval, settle=store_settle,
            events_wait=store_events_wait) if hasattr(s3, "probe") else None

    def start(self) -> None:
        """Start the background threads and resume unfinished work (scans, rematches, tags)."""
        spawn = self.background.spawn
        spawn("tag-apply", self.tags.run, self.applier.apply_tag_results)
        spawn("flips", self.flips.run, self.applier.apply_flips)
        spawn("reconcile", self.scanner.run_reconciles)
        spawn("publish", self.publisher.run)
        if self.store_watch is not None:
            spawn("store-watch", self.store_watch.run)
        self.views.resume()
        if self.views.view_ttl > 0:
            spawn("views", self.views.run_sweeps)
        self.tags.resume()
        if self.catalog.time_buckets:
            self.background.submit(self.flips.schedule_all)

    def _ready_buckets(self) -> list[str]:
        return sorted(b for b, bs in self.catalog.buckets.items() if bs.state == READY)

    def close(self) -> None:
        self.background.stop()
        if self.store_watch is not None:
            self.store_watch.wake()
        self.flips.wake()
        self.tags.wake()
        self.jobs.shutdown(wait=True, cancel_futures=True)
        self.s3_pool.shutdown(wait=True, cancel_futures=True)
        self.tags.wake()
        self.background.join(10)

    # ---- what the rest of the handler uses (the parts' state and methods) -----------

    @property
    def buckets(self) -> dict[str, BucketState]:
        return self.catalog.buckets

    @property
    def tracked(self) -> frozenset[str]:
        return self.catalog.tracked

    @property
    def views_by_id(self) -> dict[str, ViewInfo]:
        return self.catalog.views_by_id

    @property
    def infos(self) -> list[ViewInfo]:
        return self.catalog.infos

    @property
    def matcher(self):
        return self.catalog.matcher

    @property
    def scan_progress(self) -> dict:
        """The listings under way, by bucket (scans.py ``ScanProgress``)."""
        return self.scanner.progress

    @property
    def before_first_scans(self):
        return self.views.before_first_scans

    @before_first_scans.setter
    def before_first_scans(self, fn) -> None:
        self.views.hook_first_scans(fn)

    def add_listener(self, fn) -> None:
        """fn(set_of_buckets) is called (from a writer thread) after changes are committed."""
        self.committer.add_listener(fn)

    def apply_events(self, events) -> None:
        self.applier.apply_events(events)

    def apply_tag_results(self, items) -> None:
        self.applier.apply_tag_results(items)

    def register(self, views: list[tuple[str, dict]], principal: str | None = None) -> list[dict]:
        return self.views.register(views, principal)

    def unregister(self, vid: str, principal: str) -> bool | None:
        return self.views.unregister(vid, principal)

    def touch(self, info: ViewInfo) -> None:
        self.views.touch(info)

    def touch_covered(self, principal: str, bucket: str, prefix: str) -> None:
        self.views.touch_covered(principal, bucket, prefix)

    def release_bucket(self, bucket: str, reason: str) -> list[str]:
        return self.views.release_bucket(bucket, reason)

    def view_log(self, after: int = 0) -> list[dict]:
        return self.views.view_log(after)

    def sweep_views(self, now: float, grace: float = 0.0) -> list[str]:
        return self.views.sweep_views(now, grace)

    def reconcile(self, bucket: str | None = None) -> dict:
        return self.scanner.reconcile(bucket)

    def check_keys(self, bucket: str, keys: list[str]) -> dict:
        """Ask S3 for each key and repair the records that disagree (``Scanner.check_keys``)."""
        return self.scanner.check_keys(bucket, keys)

    def compact(self, bucket: str, horizon: float | None = None) -> int:
        return self.scanner.compact(bucket, horizon)

    def expire_batches(self, now: float | None = None) -> int:
        return self.publisher.expire_batches(now)

    def tag_fetches_under_way(self) -> dict:
        return self.tags.under_way()

    def tag_fetches_settled(self, fetches: dict) -> bool:
        return self.tags.settled(fetches)

    # ---- reads (any thread, no lock) --------------------------------------------------

    def view_ready(self, info: ViewInfo) -> bool:
        return self.catalog.view_ready(info)

    def change_floor(self, info: ViewInfo) -> int:
        """The lowest ``since`` whose changes the log still holds completely for the view."""
        return max(info.floor, self.catalog.buckets[info.bucket].purged)

    def lookup(self, bucket: str, key: str) -> dict | None:
        if bucket not in self.catalog.buckets:
            return None
        rec = self.store.get_object(bucket, key)
        if rec is None or r.is_deleted(rec):
            return None
        by_slot = self.catalog.by_slot
        return {"bucket": bucket, "key": key, **r.object_fields(rec),
                "views": [by_slot[s].id for s in r.view_slots(rec) if s < len(by_slot) and by_slot[s]]}

    def list_view(self, info: ViewInfo, after: str | None, limit: int) -> dict:
        """One page of a view, in key order: a merge of the membership groups that hold its
        slot (only its members are read). The version is taken first, so changes after it
        may already show; a client applies the changes since it, which is idempotent."""
        bs = self.catalog.buckets[info.bucket]
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
        top = self.catalog.buckets[info.bucket].committed
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
