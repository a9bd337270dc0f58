"""The handler's state machine: registered views, tracked buckets, applying events, scans,
tag fetches, time flips and reconciles — everything that writes LevelDB.

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

Threads owned here: ``delvefs-s3`` pool (GetObjectTagging/HeadObject, bounded), ``delvefs-job``
pool (scans, rematches, reconciles), ``tag-apply`` (drains tag results in batches),
``flips`` (re-evaluates time-relative views when an answer can flip), ``reconcile``
(periodic re-listing).
"""
from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import parsedate_to_datetime

from rulesets import ObjectInfo, View, compile_views, view_id

from delvefs.shared import s3 as s3mod

from . import statedb as st
from .events import REMOVE, TAGGING, Event
from .statedb import (bits_has, bits_of, bits_union, slots_of)
from .statedb import (DELETED, OBJ_ETAG, OBJ_EVER, OBJ_FLAGS, OBJ_LV, OBJ_META, OBJ_MTIME,
                    OBJ_SEQ, OBJ_SIZE, OBJ_SLOTS, OBJ_TAGS, TAGS_PENDING, packb)

log = logging.getLogger("delvefs.eventhandler")

SCANNING, READY = "scanning", "ready"
CACHE_RECORDS = 200_000
_MISSING = object()
_EMPTY: dict = {}  # shared, never mutated


class BucketState:
    __slots__ = ("name", "state", "version", "committed", "tags", "held", "ready", "scanned",
                 "rematch_needed", "purged", "groups", "scan_error")

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
        return packb({"state": self.state, "version": self.version, "tags": self.tags,
                      "scanned": self.scanned, "purged": self.purged})


class ViewInfo:
    __slots__ = ("id", "slot", "spec", "view", "bucket", "names", "floor", "ready", "created")

    def __init__(self, vid, slot, spec, view, names, floor, ready, created):
        self.id, self.slot, self.spec, self.view = vid, slot, spec, view
        self.bucket = view.bucket
        self.names, self.floor, self.ready, self.created = names, floor, ready, created

    def record(self) -> bytes:
        return packb({"id": self.id, "slot": self.slot, "spec": self.spec,
                      "names": sorted(self.names), "floor": self.floor, "ready": self.ready,
                      "created": self.created})


_GLOB_CHARS = frozenset("*?[\\")


def bucket_is_glob(bucket: str) -> bool:
    """True for a ``bucket`` rule that is a glob (e.g. ``runs-*``): not served yet."""
    return any(c in _GLOB_CHARS for c in bucket)


def bucket_glob_message(name: str, bucket: str) -> str:
    return (f"view {name!r}: bucket {bucket!r}: bucket globs are not supported by this handler "
            "yet: name the bucket")


def _bucket_base_version() -> int:
    return int(time.time() * 1e6)


def _http_date_ns(value: str | None) -> int:
    try:
        return int(parsedate_to_datetime(value).timestamp()) * 1_000_000_000
    except (TypeError, ValueError):
        return time.time_ns()


class Engine:
    def __init__(self, store: st.Store, metrics, s3_factory=s3mod.make_client, *,
                 s3_workers: int = 16, job_workers: int = 2, reconcile_interval: float = 0.0,
                 tombstone_horizon: float = 86400.0, on_storage_error=None):
        self.store = store
        # called (any thread) with a reason when LevelDB cannot be written: the process stops
        self.on_storage_error = on_storage_error or (lambda reason: None)
        self.metrics = metrics
        self.lock = threading.RLock()
        self._s3_factory = s3_factory
        self._s3 = None
        self._s3_lock = threading.Lock()
        self.s3_pool = ThreadPoolExecutor(s3_workers, thread_name_prefix="delvefs-s3")
        self.jobs = ThreadPoolExecutor(job_workers, thread_name_prefix="delvefs-job")
        self.reconcile_interval = reconcile_interval
        self.scan_retry = 1.0  # first delay before a failed first scan is tried again
        self.tombstone_horizon = tombstone_horizon
        self._listeners = []
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
        # views and buckets (restored from the store)
        self.views: list[View] = []
        self.infos: list[ViewInfo] = []
        self.views_by_id: dict[str, ViewInfo] = {}
        self.buckets: dict[str, BucketState] = {}
        self.tracked: frozenset[str] = frozenset()
        self.time_buckets: frozenset[str] = frozenset()
        self.tag_buckets: frozenset[str] = frozenset()
        for rec in store.load_views():
            view = View.from_filter_spec(rec["names"][0] if rec["names"] else rec["id"], rec["spec"])
            info = ViewInfo(rec["id"], rec["slot"], rec["spec"], view, set(rec["names"]),
                            rec["floor"], rec["ready"], rec.get("created", 0.0))
            self._add_view(info)
        for name, rec in store.load_buckets().items():
            self.buckets[name] = BucketState(name, rec["state"], rec["version"], rec.get("tags", False),
                                             rec.get("scanned", 0.0), rec.get("purged", 0))
            self.buckets[name].held = store.last_held(name)
            self.buckets[name].groups = frozenset(store.member_groups(name))
        self._recompile()

    # ---- plumbing ------------------------------------------------------------------

    @property
    def s3(self):
        with self._s3_lock:
            if self._s3 is None:
                self._s3 = self._s3_factory()
            return self._s3

    def add_listener(self, fn) -> None:
        """fn(set_of_buckets) is called (from a writer thread) after changes are committed."""
        self._listeners.append(fn)

    def _notify(self, buckets) -> None:
        for fn in self._listeners:
            try:
                fn(buckets)
            except Exception:  # a listener must never break a writer
                log.exception("change listener failed")

    def _add_view(self, info: ViewInfo) -> None:
        assert info.slot == len(self.views)
        self.views.append(info.view)
        self.infos.append(info)
        self.views_by_id = {**self.views_by_id, info.id: info}

    def _recompile(self) -> None:
        self.matcher = compile_views(self.views)
        self.tracked = frozenset(self.buckets)
        self.time_buckets = frozenset(v.bucket for v in self.views if v.is_time_dependent)
        self.tag_buckets = frozenset(b for b in self.buckets if self.matcher.needs_tags(b))

    def start(self) -> None:
        """Start the background threads and resume unfinished work (scans, rematches, tags)."""
        for name, target in (("tag-apply", self._tag_apply_loop), ("flips", self._flip_loop),
                             ("reconcile", self._reconcile_loop)):
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
        for bucket, key, seq in self.store.pending_tags():
            self._fetch_tags(bucket, key, seq, need_meta=True)
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

    def register(self, views: list[tuple[str, dict]]) -> list[dict]:
        """Register (name, filter spec) pairs; identical specs share an id. Raises ValueError
        for an invalid spec. Starts first scans / rematches as needed."""
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
        with self.lock:
            wb = self.store.batch()
            new_views, scans, rematch = False, [], set()
            for name, view, canonical in parsed:
                vid = view_id(canonical)
                info = self.views_by_id.get(vid)
                if info is None:
                    bs = self.buckets.get(view.bucket)
                    if bs is None:
                        bs = BucketState(view.bucket, SCANNING, _bucket_base_version())
                        self.buckets[view.bucket] = bs
                        scans.append(view.bucket)
                        wb.put(st.k_bucket(bs.name), bs.record())
                    elif bs.state == READY:
                        rematch.add(view.bucket)
                    else:  # pages listed so far were matched without this view
                        bs.rematch_needed = True
                    info = ViewInfo(vid, len(self.views), canonical, view, {name}, bs.committed,
                                    False, time.time())
                    self._add_view(info)
                    new_views = True
                elif name not in info.names:
                    info.names = info.names | {name}
                wb.put(st.k_view(vid), info.record())
                out.append({"name": name, "id": vid, "version": self.buckets[info.bucket].committed})
            if new_views:
                self._recompile()
            for b in rematch:  # a new view on a tracked bucket: match its objects first
                bs = self.buckets[b]
                bs.tags = bs.tags or b in self.tag_buckets
                wb.put(st.k_bucket(b), bs.record())
            self.store.write(wb)
        for b in scans:
            self._submit_job(b, "scan", self._first_scan, b)
        for b in rematch:
            self._submit_job(b, "rematch", self._rematch, b)
        if new_views and self.time_buckets:
            self.jobs.submit(self._schedule_all_flips)
        return out

    def view_ready(self, info: ViewInfo) -> bool:
        bs = self.buckets.get(info.bucket)
        return info.ready and bs is not None and bs.state == READY

    # ---- applying events (the hot path) -------------------------------------------

    def apply_events(self, events: list[Event]) -> None:
        """Apply a batch of parsed events in one WriteBatch (call with events in delivery order)."""
        with self.lock:
            self._apply_locked(events)

    def _apply_locked(self, events: list[Event], replay: bool = False, extra=None) -> None:
        """``replay``: events held during a scan, applied now although the bucket is not
        ready yet; ``extra(wb)`` adds writes to the batch."""
        buckets = self.buckets
        held = None
        nheld = 0
        cache = self._cache
        get = self.store.get_object
        tag_buckets = self.tag_buckets
        work: dict = {}
        dropped = stale = 0
        applied_seqs = []
        for ev in events:
            bs = buckets.get(ev.bucket)
            if bs is None:
                dropped += 1
                continue
            if bs.state != READY and not replay:
                if held is None:
                    held = self.store.batch()
                bs.held += 1
                held.put(st.k_held(ev.bucket, bs.held),
                         packb([ev.kind, ev.key, ev.seq, ev.size, ev.etag, ev.mtime, ev.metadata, ev.name]))
                nheld += 1
                continue
            k = (ev.bucket, ev.key)
            w = work.get(k)
            if w is None:
                old = cache.get(k, _MISSING)
                if old is _MISSING:
                    old = get(ev.bucket, ev.key)
                w = work[k] = [old, old]
            cur = w[1]
            kind = ev.kind
            seq = ev.seq
            if kind == REMOVE:
                if cur is not None and seq <= cur[OBJ_SEQ]:
                    stale += 1
                    continue
                if cur is None:
                    w[1] = [seq, 0, 0.0, "", None, {}, b"", b"", 0, DELETED]
                else:
                    w[1] = [seq, 0, 0.0, "", None, {}, cur[OBJ_SLOTS], cur[OBJ_EVER], cur[OBJ_LV], DELETED]
            elif cur is not None and seq <= cur[OBJ_SEQ]:
                if seq == cur[OBJ_SEQ] and kind == TAGGING and ev.bucket in tag_buckets \
                        and not cur[OBJ_FLAGS] & DELETED:
                    new = list(cur)
                    new[OBJ_FLAGS] |= TAGS_PENDING
                    w[1] = new
                else:
                    stale += 1
                    continue
            else:  # a newer version (a create, or tagging of a version we never saw)
                pending = TAGS_PENDING if ev.bucket in tag_buckets else 0
                if cur is None:
                    w[1] = [seq, ev.size, ev.mtime, ev.etag, None, ev.metadata, [], [], 0, pending]
                else:
                    w[1] = [seq, ev.size, ev.mtime, ev.etag, None, ev.metadata, cur[OBJ_SLOTS],
                            cur[OBJ_EVER], cur[OBJ_LV], pending]
            if kind != TAGGING:
                applied_seqs.append(seq)
        if held is not None:
            held.write()
        m = self.metrics
        if dropped:
            m.dropped.inc(dropped)
        if stale:
            m.stale.inc(stale)
        if work or extra:
            self._finalize(work, extra=extra)
            m.processed.inc(len(events) - dropped - nheld)
            now = time.time()
            m.latency.observe_many([now - s / 1e9 for s in applied_seqs if 10**18 <= s <= 4 * 10**18])

    def _finalize(self, work: dict, log_changes: bool = True, now: float | None = None,
                  extra=None) -> None:
        """Match, diff and write the records in ``work`` ({(bucket,key): [old, new]}; entries
        with new is old are unchanged) in one WriteBatch; then publish versions and notify."""
        now = time.time() if now is None else now
        todo = [(bk, w[0], w[1]) for bk, w in work.items() if w[1] is not w[0]]
        if not todo and not extra:
            return
        matcher = self.matcher
        infos = self.infos
        to_match = []
        objs = []
        empty = _EMPTY
        for i, (bk, _old, new) in enumerate(todo):
            if not new[OBJ_FLAGS] & 3:  # neither DELETED nor TAGS_PENDING
                to_match.append(i)
                objs.append(ObjectInfo(bk[0], bk[1], new[OBJ_SIZE], new[OBJ_MTIME], None,
                                       new[OBJ_TAGS] or empty, new[OBJ_META] or empty))
        results = dict(zip(to_match, matcher.match_batch(objs, now))) if objs else {}
        time_buckets = self.time_buckets
        flips = []
        wb = self.store.batch()
        put, delete = wb.put, wb.delete
        touched: set[str] = set()
        buckets = self.buckets
        cprefixes: dict = {}
        new_groups = []
        pack_v = st.pack_version
        memo = self._bits_memo
        for i, ((bucket, key), old, new) in enumerate(todo):
            flags = new[OBJ_FLAGS]
            old_slots = old[OBJ_SLOTS] if old is not None else b""
            if flags & DELETED:
                slots = b""
            elif flags & TAGS_PENDING:
                slots = old_slots
            else:
                res = results[i]
                t = tuple(res)
                slots = memo.get(t)
                if slots is None:
                    if len(memo) > 4096:
                        memo.clear()
                    slots = memo[t] = bits_of(res)
                if time_buckets and bucket in time_buckets:
                    flips.append((bucket, key, i))
            new[OBJ_SLOTS] = slots
            ever = new[OBJ_EVER]
            if slots != old_slots and slots != ever:
                ever = new[OBJ_EVER] = bits_union(ever, slots)
            if log_changes:
                old_deleted = old is None or old[OBJ_FLAGS] & DELETED
                deleted = flags & DELETED
                if slots != old_slots or (slots and (
                        old_deleted or old[OBJ_SIZE] != new[OBJ_SIZE] or old[OBJ_ETAG] != new[OBJ_ETAG]
                        or old[OBJ_MTIME] != new[OBJ_MTIME])) or (deleted and not old_deleted and ever):
                    bs = buckets[bucket]
                    v = bs.version = bs.version + 1
                    touched.add(bucket)
                    cprefix = cprefixes.get(bucket)
                    if cprefix is None:
                        cprefix = cprefixes[bucket] = st.change_prefix(bucket)
                    put(cprefix + pack_v(v), packb([key, 1 if deleted else 0, slots,
                                                    None if ever == slots else ever,
                                                    new[OBJ_SIZE], new[OBJ_MTIME], new[OBJ_ETAG]]))
                    if new[OBJ_LV]:
                        delete(cprefix + pack_v(new[OBJ_LV]))
                    new[OBJ_LV] = v
            # the membership index follows slots, size, mtime and etag (store.py)
            if slots != old_slots:
                if old_slots:
                    delete(st.k_member(bucket, old_slots, key))
                if slots and slots not in buckets[bucket].groups:
                    new_groups.append((bucket, slots))
            if slots and (slots != old_slots or old[OBJ_SIZE] != new[OBJ_SIZE]
                          or old[OBJ_ETAG] != new[OBJ_ETAG] or old[OBJ_MTIME] != new[OBJ_MTIME]):
                put(st.k_member(bucket, slots, key), packb([new[OBJ_SIZE], new[OBJ_MTIME], new[OBJ_ETAG]]))
            put(st.k_obj(bucket, key), packb(new))
            if flags & TAGS_PENDING:
                put(st.k_tagwait(bucket, key), packb(new[OBJ_SEQ]))
            elif old is not None and old[OBJ_FLAGS] & TAGS_PENDING:
                delete(st.k_tagwait(bucket, key))
        if extra:
            extra(wb)
        for b in touched:
            put(st.k_bucket(b), buckets[b].record())
        # groups before the write: a listing that reads the new version (taken before its
        # groups) must find the new group; an empty one only costs it a seek
        for b, g in new_groups:
            buckets[b].groups = buckets[b].groups | {g}
        try:
            wb.write()
        except BaseException:
            for b in touched:
                buckets[b].version = buckets[b].committed
            self._cache.clear()
            raise
        for b in touched:
            buckets[b].committed = buckets[b].version
        cache = self._cache
        if len(cache) + len(todo) > CACHE_RECORDS:
            cache.clear()
        for bk, _old, new in todo:  # records are never mutated once written
            cache[bk] = new
        # after the commit: tag fetches, time flips, wake-ups
        for (bucket, key), old, new in todo:
            if new[OBJ_FLAGS] & TAGS_PENDING:
                self._fetch_tags(bucket, key, new[OBJ_SEQ], need_meta=new[OBJ_META] is None)
        if flips:
            self._schedule_flips([(b, k, todo[i][2]) for b, k, i in flips], now)
        if touched:
            self._notify(touched)

    # ---- tags -------------------------------------------------------------------

    def _fetch_tags(self, bucket: str, key: str, seq: int, need_meta: bool = False) -> None:
        if self._stop.is_set():
            return
        k = (bucket, key)
        ticket = self._tag_ticket.get(k, 0) + 1
        self._tag_ticket[k] = ticket
        try:
            self.s3_pool.submit(self._tag_job, bucket, key, seq, ticket, need_meta)
        except RuntimeError:  # pool shut down
            pass

    def _tag_job(self, bucket, key, seq, ticket, need_meta):
        try:
            tags = s3mod.get_object_tags(self.s3, bucket, key)
            self.metrics.tag_fetches.inc()
            meta = s3mod.head_object_metadata(self.s3, bucket, key) if need_meta and tags is not None else None
        except Exception as exc:
            log.warning("tags of %s/%s: %s (kept pending until a restart or reconcile)", bucket, key, exc)
            if self._tag_ticket.get((bucket, key)) == ticket:  # the newest fetch failed
                self._tag_failed[(bucket, key)] = seq
            return
        self._tag_results.put((bucket, key, seq, ticket, tags, meta))

    def _tag_apply_loop(self) -> None:
        q = self._tag_results
        while not self._stop.is_set():
            item = q.get()
            if item is None:
                continue
            items = [item]
            while len(items) < 1000:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is not None:
                    items.append(nxt)
            try:
                self.apply_tag_results(items)
            except Exception as exc:
                self._background_failed(exc, f"applying {len(items)} tag results")

    def apply_tag_results(self, items) -> None:
        with self.lock:
            work = {}
            for bucket, key, seq, ticket, tags, meta in items:
                k = (bucket, key)
                if self._tag_ticket.get(k) != ticket or bucket not in self.buckets:
                    continue  # a later fetch for this key is under way (or bucket forgotten)
                del self._tag_ticket[k]
                self._tag_failed.pop(k, None)
                w = work.get(k)
                rec = w[1] if w else self.store.get_object(bucket, key)
                if rec is None or rec[OBJ_SEQ] != seq or rec[OBJ_FLAGS] & DELETED \
                        or not rec[OBJ_FLAGS] & TAGS_PENDING:
                    continue
                new = list(rec)
                new[OBJ_TAGS] = tags if tags is not None else {}
                if meta is not None:
                    new[OBJ_META] = meta
                elif new[OBJ_META] is None:
                    new[OBJ_META] = {}
                new[OBJ_FLAGS] &= ~TAGS_PENDING
                if w:
                    w[1] = new
                else:
                    work[k] = [rec, new]
            self._finalize(work)

    # ---- time-relative views -----------------------------------------------------

    def _schedule_flips(self, items, now) -> None:
        matcher = self.matcher
        pushed = False
        with self._flip_cond:
            for bucket, key, rec in items:
                obj = ObjectInfo(bucket, key, rec[OBJ_SIZE], rec[OBJ_MTIME], None,
                                 rec[OBJ_TAGS] or {}, rec[OBJ_META] or {})
                t = matcher.next_flip(obj, now)
                k = (bucket, key)
                if t is None:
                    self._flip_at.pop(k, None)
                elif self._flip_at.get(k) != t:
                    self._flip_at[k] = t
                    heapq.heappush(self._flip_heap, (t, bucket, key))
                    pushed = True
            if pushed:
                self._flip_cond.notify()

    def _schedule_all_flips(self) -> None:
        now = time.time()
        for bucket in self.time_buckets:
            batch = []
            for key, rec in self.store.iter_objects(bucket):
                if not rec[OBJ_FLAGS] & (DELETED | TAGS_PENDING):
                    batch.append((bucket, key, rec))
                if len(batch) >= 1000:
                    self._schedule_flips(batch, now)
                    batch = []
            self._schedule_flips(batch, now)

    def _flip_loop(self) -> None:
        heap = self._flip_heap
        while not self._stop.is_set():
            with self._flip_cond:
                now = time.time()
                if not heap or heap[0][0] > now:
                    self._flip_cond.wait(None if not heap else min(heap[0][0] - now, 5.0))
                    continue
                due = []
                while heap and heap[0][0] <= now and len(due) < 1000:
                    t, b, k = heapq.heappop(heap)
                    if self._flip_at.get((b, k)) == t:
                        del self._flip_at[(b, k)]
                        due.append((b, k))
            try:
                with self.lock:
                    work = {}
                    for b, k in due:
                        rec = self.store.get_object(b, k) if b in self.buckets else None
                        if rec is None or rec[OBJ_FLAGS] & (DELETED | TAGS_PENDING):
                            continue
                        work[(b, k)] = [rec, list(rec)]
                    self.metrics.flips.inc(len(work))
                    self._finalize(work, now=max(time.time(), now))
            except Exception as exc:
                self._background_failed(exc, "time flip re-evaluation")

    # ---- scans, rematches, reconciles ----------------------------------------------

    def _fetch_props(self, bucket, keys, need_meta=True) -> dict:
        """{key: (tags, metadata)} fetched concurrently; objects gone are left out."""
        def one(key):
            tags = s3mod.get_object_tags(self.s3, bucket, key)
            meta = s3mod.head_object_metadata(self.s3, bucket, key) if need_meta and tags is not None else {}
            return key, tags, meta
        out = {}
        self.metrics.tag_fetches.inc(len(keys))
        for key, tags, meta in self.s3_pool.map(one, keys):
            if tags is not None and meta is not None:
                out[key] = (tags, meta)
        return out

    def _first_scan(self, bucket: str) -> dict | None:
        """A bucket's first scan, retried with backoff (``scan_retry`` s doubling up to a
        minute) until it succeeds: S3 away or refusing must not leave the bucket "scanning"
        until a restart. Meanwhile its views answer 503 and its events are held; a retry
        lists from the start (applying a listed page again changes nothing)."""
        bs = self.buckets[bucket]
        delay = self.scan_retry
        while not self._stop.is_set():
            try:
                counts = self._scan(bucket, True)
            except st.StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 — S3 errors of every kind: retried
                bs.scan_error = f"{type(exc).__name__}: {exc}"
                self.metrics.scan_failures.inc()
                log.warning("first scan of bucket %s failed (%s); retrying in %.1f s",
                            bucket, bs.scan_error, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 60.0)
                continue
            bs.scan_error = None
            return counts
        return None

    def _scan(self, bucket: str, initial: bool) -> dict:
        """List the bucket and make the state agree with the listing (initial scan: then
        apply the events buffered meanwhile and declare the bucket ready)."""
        t0 = time.monotonic()
        self.metrics.scans.inc()
        cutoff = None
        prev_last = None
        counts = {"listed": 0, "repaired": 0, "removed": 0}
        # the store's clock before the listing starts: objects modified earlier and not listed
        # are gone (the Date header has whole seconds: floor, so the bound is safe)
        cutoff = _http_date_ns(s3mod.store_date(self.s3, bucket))
        for contents, date in s3mod.list_pages(self.s3, bucket):
            if self._stop.is_set():
                return counts
            if not contents:
                continue
            listed = {}
            for o in contents:
                listed[o["Key"]] = (int(o["LastModified"].timestamp() * 1e6) * 1000, o["Size"],
                                    o["LastModified"].timestamp(), o["ETag"].strip('"'))
            last = contents[-1]["Key"]
            counts["listed"] += len(listed)
            self.metrics.scanned.inc(len(listed))
            self._scan_apply(bucket, listed, prev_last, last, cutoff, initial, counts)
            prev_last = last
        self._scan_apply(bucket, {}, prev_last, None, cutoff, initial, counts)
        if not initial:
            counts["tags_retried"] = self._retry_failed_tags(bucket)
            counts["purged"] = self.compact(bucket)
        bs = self.buckets[bucket]
        while initial and bs.rematch_needed and not self._stop.is_set():
            bs.rematch_needed = False
            self._rematch_objects(bucket)
        replayed = 0
        chunk = 5000
        for _ in range(1000 if initial else 0):  # held events: in chunks, the lock left between
            with self.lock:
                n = self._replay_held(bucket, chunk)
            replayed += n
            if n < chunk:
                break
        with self.lock:
            bs = self.buckets[bucket]
            bs.scanned = time.time()
            if initial and bs.state == SCANNING:
                while (n := self._replay_held(bucket, chunk)):  # the rest; the consumer waits
                    replayed += n
                bs.state = READY
                bs.tags = bucket in self.tag_buckets
                for info in self.infos:
                    if info.bucket == bucket and not info.ready:
                        info.ready = True
                        info.floor = bs.committed
                wb = self.store.batch()
                wb.put(st.k_bucket(bucket), bs.record())
                for info in self.infos:
                    if info.bucket == bucket:
                        wb.put(st.k_view(info.id), info.record())
                self.store.write(wb)
                bs.ready.set()
                log.info("bucket %s scanned: %d objects in %.1f s (%d events held meanwhile applied)",
                         bucket, counts["listed"], time.monotonic() - t0, replayed)
            else:
                wb = self.store.batch()
                wb.put(st.k_bucket(bucket), bs.record())
                self.store.write(wb)
        self.metrics.repaired.inc(counts["repaired"] + counts["removed"])
        return counts

    def _replay_held(self, bucket: str, chunk: int) -> int:
        """Apply (and delete, in the same batch) the oldest ``chunk`` events held for
        ``bucket``; call under the lock. Returns how many."""
        items = self.store.iter_held(bucket, chunk)
        if not items:
            return 0
        events = [Event(kind, bucket, key, seq, size, etag, mtime, metadata, name)
                  for _k, (kind, key, seq, size, etag, mtime, metadata, name) in items]

        def delete_held(wb):
            for k, _ in items:
                wb.delete(k)
        self._apply_locked(events, replay=True, extra=delete_held)
        return len(items)

    def _retry_failed_tags(self, bucket: str) -> int:
        """Fetch again the pending tags of ``bucket`` whose last fetch failed (or that no
        fetch serves any more); returns how many fetches were started."""
        n = 0
        with self.lock:  # tickets are handed out under the lock (as by _finalize)
            for b, key, _seq in self.store.pending_tags(bucket.encode()):
                k = (b, key)
                if self._tag_failed.pop(k, None) is None and k in self._tag_ticket:
                    continue  # a fetch is under way
                rec = self.store.get_object(b, key)
                if rec is None or not rec[OBJ_FLAGS] & TAGS_PENDING:
                    continue
                self._fetch_tags(b, key, rec[OBJ_SEQ], need_meta=rec[OBJ_META] is None)
                n += 1
        if n:
            log.info("reconcile of %s: fetching the tags of %d objects again", bucket, n)
        return n

    def _scan_apply(self, bucket, listed, prev_last, last, cutoff, initial, counts) -> None:
        needs = bucket in self.tag_buckets
        props = {}
        if needs:  # fetch tags+metadata for listed objects we do not know yet (outside the lock)
            get = self.store.get_object
            unknown = [k for k, (seq, *_rest) in listed.items()
                       if (lambda r: r is None or r[OBJ_SEQ] < seq)(get(bucket, k))]
            if unknown:
                props = self._fetch_props(bucket, unknown)
        with self.lock:
            work = {}
            present = {}
            recent = []
            for key, rec in self.store.iter_objects(bucket, after=prev_last, upto=last):
                present[key] = rec
                if key not in listed and not rec[OBJ_FLAGS] & DELETED:
                    if rec[OBJ_SEQ] < cutoff:  # existed before the listing began, not listed: gone
                        new = [cutoff, 0, 0.0, "", None, {}, rec[OBJ_SLOTS], rec[OBJ_EVER], rec[OBJ_LV], DELETED]
                        work[(bucket, key)] = [rec, new]
                        counts["removed"] += 1
                    else:  # too recent to tell from the listing: ask the store
                        recent.append((key, rec[OBJ_SEQ]))
            for key, (seq, size, mtime, etag) in listed.items():
                rec = present.get(key)
                if rec is not None and rec[OBJ_SEQ] >= seq:
                    continue
                p = props.get(key)
                if needs and p is None:
                    new = [seq, size, mtime, etag, None, None, b"", b"", 0, TAGS_PENDING]
                else:
                    new = [seq, size, mtime, etag, p[0] if p else None, p[1] if p else None, b"", b"", 0, 0]
                if rec is not None:
                    new[OBJ_SLOTS], new[OBJ_EVER], new[OBJ_LV] = rec[OBJ_SLOTS], rec[OBJ_EVER], rec[OBJ_LV]
                work[(bucket, key)] = [rec, new]
                counts["repaired"] += 1
            self._finalize(work, log_changes=not initial)
        if recent:
            self._sweep_recent(bucket, recent, initial, counts)

    def _sweep_recent(self, bucket, recent, initial, counts) -> None:
        """Unlisted objects modified after the listing began: HeadObject decides."""
        def gone(item):
            return item if s3mod.head_object_metadata(self.s3, bucket, item[0]) is None else None
        absent = [item for item in self.s3_pool.map(gone, recent) if item is not None]
        if not absent:
            return
        with self.lock:
            work = {}
            for key, seq in absent:
                rec = self.store.get_object(bucket, key)
                if rec is None or rec[OBJ_SEQ] != seq or rec[OBJ_FLAGS] & DELETED:
                    continue  # changed meanwhile: its own events decide
                work[(bucket, key)] = [rec, [seq + 1, 0, 0.0, "", None, {}, rec[OBJ_SLOTS], rec[OBJ_EVER],
                                             rec[OBJ_LV], DELETED]]
                counts["removed"] += 1
            self._finalize(work, log_changes=not initial)

    def _rematch(self, bucket: str) -> None:
        """Match every object of a tracked bucket again (a view was added); objects whose
        tags/metadata are now needed but unknown get fetched first. Then the bucket's new
        views are ready."""
        self._rematch_objects(bucket)
        # objects whose tags had to be fetched join the view when the tags are in
        deadline = time.monotonic() + 120
        while self.store.has_pending_tags(bucket) and time.monotonic() < deadline:
            if self._stop.wait(0.02):
                return
        if self._stop.is_set():
            return
        with self.lock:
            bs = self.buckets[bucket]
            wb = self.store.batch()
            for info in self.infos:
                if info.bucket == bucket and not info.ready:
                    info.ready = True
                    info.floor = bs.committed
                    wb.put(st.k_view(info.id), info.record())
            self.store.write(wb)

    def _rematch_objects(self, bucket: str) -> None:
        after = None
        needs = bucket in self.tag_buckets
        while not self._stop.is_set():
            with self.lock:
                work = {}
                n = 0
                for key, rec in self.store.iter_objects(bucket, after=after):
                    n += 1
                    after = key
                    if rec[OBJ_FLAGS] & (DELETED | TAGS_PENDING):
                        continue
                    new = list(rec)
                    if needs and (rec[OBJ_TAGS] is None or rec[OBJ_META] is None):
                        new[OBJ_FLAGS] |= TAGS_PENDING
                    work[(bucket, key)] = [rec, new]
                    if n >= 1000:
                        break
                self._finalize(work)
                if n < 1000:
                    return

    def compact(self, bucket: str, horizon: float | None = None) -> int:
        """Remove the tombstones of ``bucket`` older than ``horizon`` seconds (default: the
        engine's) together with their change-log entries; returns how many.

        A tombstone exists so that a late or replayed older event cannot resurrect a removed
        key; past the horizon no such event is expected (and a reconcile would repair one).
        Its change entry tells lagging clients "this key left you": once it is gone, a client
        asking for changes since a version below it must list the view again, so the bucket's
        ``purged`` floor rises to the highest removed entry's version (raised *before* the
        write: a reader that sees the new floor resyncs, one that does not still finds the
        entries in its snapshot)."""
        horizon = self.tombstone_horizon if horizon is None else horizon
        before_ns = time.time_ns() - int(horizon * 1e9)
        purged = 0
        after = None
        while not self._stop.is_set():
            chunk = []  # (key, lv) of old tombstones, read outside the lock
            last = None
            for key, rec in self.store.iter_objects(bucket, after=after):
                last = key
                if rec[OBJ_FLAGS] & DELETED and rec[OBJ_SEQ] < before_ns:
                    chunk.append((key, rec[OBJ_SEQ], rec[OBJ_LV]))
                    if len(chunk) >= 1000:
                        break
            if chunk:
                purged += self._purge(bucket, chunk)
            if last is None or len(chunk) < 1000:
                break
            after = last
        if purged:
            log.info("compacted %s: %d tombstones removed", bucket, purged)
        with self.lock:  # drop groups that emptied (under the lock: no group is added meanwhile)
            self.buckets[bucket].groups = frozenset(self.store.member_groups(bucket))
        return purged

    def _purge(self, bucket: str, chunk) -> int:
        with self.lock:
            bs = self.buckets[bucket]
            wb = self.store.batch()
            cprefix = st.change_prefix(bucket)
            floor = bs.purged
            n = 0
            for key, seq, lv in chunk:
                rec = self.store.get_object(bucket, key)
                if rec is None or not rec[OBJ_FLAGS] & DELETED or rec[OBJ_SEQ] != seq:
                    continue  # changed since it was read
                wb.delete(st.k_obj(bucket, key))
                if lv:
                    wb.delete(cprefix + st.pack_version(lv))
                    floor = max(floor, lv)
                self._cache.pop((bucket, key), None)
                n += 1
            bs.purged = floor
            wb.put(st.k_bucket(bucket), bs.record())
            self.store.write(wb)
            return n

    def change_floor(self, info: ViewInfo) -> int:
        """The lowest ``since`` whose changes the log still holds completely for the view."""
        return max(info.floor, self.buckets[info.bucket].purged)

    def reconcile(self, bucket: str | None = None) -> dict:
        """Re-list one tracked bucket (or all) and repair the state; returns counts per bucket."""
        names = [bucket] if bucket is not None else [b for b, s in self.buckets.items() if s.state == READY]
        out = {}
        for b in names:
            bs = self.buckets.get(b)
            if bs is None:
                raise KeyError(b)
            if bs.state != READY:
                bs.ready.wait(300)
            out[b] = self._submit_job(b, "reconcile", self._scan, b, False).result()
        return out

    def _reconcile_loop(self) -> None:
        interval = self.reconcile_interval
        if not interval or interval <= 0:
            return
        while not self._stop.wait(interval):
            try:
                self.reconcile()
            except Exception as exc:
                self._background_failed(exc, "periodic reconcile")

    # ---- reads (any thread, no lock) --------------------------------------------------

    def lookup(self, bucket: str, key: str) -> dict | None:
        if bucket not in self.buckets:
            return None
        rec = self.store.get_object(bucket, key)
        if rec is None or rec[OBJ_FLAGS] & DELETED:
            return None
        infos = self.infos
        return {"bucket": bucket, "key": key, "size": rec[OBJ_SIZE], "mtime": rec[OBJ_MTIME],
                "etag": rec[OBJ_ETAG], "tags": rec[OBJ_TAGS] or {}, "metadata": rec[OBJ_META] or {},
                "views": [infos[s].id for s in slots_of(rec[OBJ_SLOTS])]}

    def list_view(self, info: ViewInfo, after: str | None, limit: int) -> dict:
        """One page of a view, in key order: a merge of the membership groups that hold its
        slot (only its members are read). The version is taken first, so changes after it
        may already show; a client applies the changes since it, which is idempotent."""
        bs = self.buckets[info.bucket]
        version = bs.committed
        slot = info.slot
        groups = [g for g in bs.groups if bits_has(g, slot)]
        objects = []
        more = False
        for key, (size, mtime, etag) in self.store.iter_members(info.bucket, groups, after):
            if len(objects) >= limit:
                more = True
                break
            objects.append({"key": key, "size": size, "mtime": mtime, "etag": etag})
        return {"version": version, "objects": objects,
                "next": objects[-1]["key"] if more and objects else None}

    def changes(self, info: ViewInfo, since: int, limit: int) -> dict:
        """Changes of a view after ``since`` (caller checked since >= floor)."""
        bs = self.buckets[info.bucket]
        top = bs.committed
        slot = info.slot
        out = []
        more = False
        last_v = since
        for v, e in self.store.iter_changes(info.bucket, since):
            if v > top:
                break
            if len(out) >= limit:
                more = True
                break
            last_v = v
            if bits_has(e[st.CH_SLOTS], slot):
                out.append({"v": v, "op": "put", "key": e[st.CH_KEY],
                            "object": {"key": e[st.CH_KEY], "size": e[st.CH_SIZE],
                                       "mtime": e[st.CH_MTIME], "etag": e[st.CH_ETAG]}})
            elif e[st.CH_EVER] is not None and bits_has(e[st.CH_EVER], slot):
                out.append({"v": v, "op": "delete", "key": e[st.CH_KEY], "object": None})
        return {"version": last_v if more else top, "changes": out, "more": more}
