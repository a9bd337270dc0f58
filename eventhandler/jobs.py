"""The engine's background plumbing and its background work on single objects.

``Background``: the stop flag, the ``delvefs-job`` pool (one job per bucket and kind at a
time), the engine's threads and what a failure in any of them does. ``TagFetcher``: tag
fetches (GetObjectTagging and HeadObject in the ``delvefs-s3`` pool; the ``tag-apply``
thread hands their results, in batches, to the event applier). ``FlipScheduler``: time
flips (the ``flips`` thread hands the objects of time-relative views whose answer can
change now to the event applier).

S3 requests run outside ``Engine.lock``; applying their results takes it (engine.py)."""
from __future__ import annotations

import heapq
import logging
import queue
import threading
import time

from rulesets import ObjectInfo

from . import records as r
from . import statedb as st

log = logging.getLogger("delvefs.eventhandler")

TAG_APPLY_GATHER = 0.01  # seconds a tag result waits for others to be applied with


class Background:
    """The ``background`` part of ``Engine``: owns ``stopping`` (set once, by ``stop``), the
    futures of the jobs under way by (bucket, kind) and the threads it started. ``jobs``:
    the ``delvefs-job`` pool; ``on_storage_error(reason)``: what a failed LevelDB write in
    the background does (the process stops)."""

    def __init__(self, lock, jobs, on_storage_error):
        self.lock = lock
        self.jobs = jobs
        self.on_storage_error = on_storage_error
        self.stopping = threading.Event()
        self._futures: dict[tuple[str, str], object] = {}
        self._threads: list[threading.Thread] = []

    def spawn(self, name: str, target, *args) -> None:
        """Start the daemon thread ``delvefs-<name>``, joined by ``join``."""
        t = threading.Thread(target=target, args=args, name=f"delvefs-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def submit(self, fn, *args):
        """Run ``fn`` in the job pool (no guard, no bookkeeping)."""
        return self.jobs.submit(fn, *args)

    def submit_job(self, bucket: str, kind: str, fn, *args):
        """Run ``fn(*args)`` in the job pool unless a job of that bucket and kind is under
        way already (then that one's future)."""
        key = (bucket, kind)
        with self.lock:
            fut = self._futures.get(key)
            if fut is not None and not fut.done():
                return fut
            fut = self.jobs.submit(self.guard, fn, *args)
            self._futures[key] = fut
            return fut

    def jobs_of(self, bucket: str) -> list:
        """The futures of the jobs of ``bucket`` (call with the lock held)."""
        return [fut for (b, _kind), fut in self._futures.items() if b == bucket]

    def guard(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            self.failed(exc, f"background job {fn.__name__}{args!r}")
            raise

    def failed(self, exc: Exception, what: str) -> None:
        """Log a background failure; a failed LevelDB write stops the process."""
        if self.stopping.is_set():
            return
        if isinstance(exc, st.StorageError):
            log.error("%s: writing the state failed: %s", what, exc)
            self.on_storage_error(f"LevelDB: {exc}")
        else:
            log.error("%s failed", what, exc_info=exc)

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)


class TagFetcher:
    """The ``tags`` part of ``Engine``. A fetch is owed for every record with
    ``TAGS_PENDING`` (the committer decides which: only objects whose answer the tags can
    change, or whose metadata a view reads and a listing did not bring); each (bucket, key)
    has a ticket so that only the newest fetch's result is applied. A fetch reads the
    metadata first (when owed), then the tags only if, with that metadata, they can still
    change an answer.

    Owns the tickets (``_tickets``: handed out and claimed under ``Engine.lock``), the
    fetches that failed (``_failed``; retried by the next reconcile) and the queue of
    results. Fetch jobs run in the ``delvefs-s3`` pool without the lock."""

    def __init__(self, lock, store, metrics, s3, s3_pool, catalog, background):
        self.lock = lock
        self.store = store
        self.metrics = metrics
        self.s3 = s3
        self.s3_pool = s3_pool
        self.catalog = catalog
        self.background = background
        self._tickets: dict[tuple[str, str], int] = {}
        # (bucket, key) -> seq of fetches that failed; retried by the next reconcile
        self._failed: dict[tuple[str, str], int] = {}
        self._results: queue.SimpleQueue = queue.SimpleQueue()

    def fetch(self, bucket: str, key: str, rec) -> None:
        """Start the fetch owed for ``rec``, the record of ``key`` (call with the lock held)."""
        if self.background.stopping.is_set():
            return
        k = (bucket, key)
        ticket = self._tickets.get(k, 0) + 1
        self._tickets[k] = ticket
        # the size and mtime decide, with the metadata, whether the tags are needed after it
        meta_first = (rec[r.OBJ_SIZE], rec[r.OBJ_MTIME]) if r.lacks_metadata(rec) and (
            bucket in self.catalog.meta_buckets or bucket in self.catalog.layout_buckets) else None
        try:
            self.s3_pool.submit(self._job, bucket, key, r.seq_of(rec), ticket, meta_first)
        except RuntimeError:  # pool shut down
            pass

    def resume(self) -> None:
        """Start the fetches owed by the records that wait for one (at a start)."""
        with self.lock:
            for bucket, key, _seq in self.store.pending_tags():
                rec = self.store.get_object(bucket, key)
                if rec is not None and r.is_tags_pending(rec):
                    self.fetch(bucket, key, rec)

    def _tags_needed(self, bucket: str, key: str, size: int, mtime: float, meta: dict) -> bool:
        """Whether the tags of an object with this size, mtime and metadata can change an
        answer, or are listed (it is, or may be, in a view listing property values).
        Called outside the lock: views may change meanwhile, so the committer asks again
        when the result is applied."""
        matcher = self.catalog.matcher
        obj = ObjectInfo(bucket, key, size, mtime, None, {}, meta)
        return matcher.tags_could_matter(obj) or (
            bucket in self.catalog.layout_buckets and matcher.in_property_listing(obj))

    def _job(self, bucket, key, seq, ticket, meta_first):
        """``meta_first``: (size, mtime) when the metadata must be read first, else None."""
        try:
            meta = tags = None
            if meta_first is not None:
                meta = self.s3.metadata(bucket, key)
            if meta_first is None or (meta is not None and self._tags_needed(bucket, key, *meta_first, meta)):
                self.metrics.tag_fetches.inc()
                tags = self.s3.tags(bucket, key)
                if tags is None:  # gone (its remove event follows): known to have none
                    tags = {}
            elif meta is None:  # gone
                tags, meta = {}, {}
        except Exception as exc:
            log.warning("tags of %s/%s: %s (kept pending until a restart or reconcile)", bucket, key, exc)
            if self._tickets.get((bucket, key)) == ticket:  # the newest fetch failed
                self._failed[(bucket, key)] = seq
            return
        self._results.put((bucket, key, seq, ticket, tags, meta))

    def run(self, apply) -> None:
        """The ``tag-apply`` thread: hands the results to ``apply(items)`` in batches; each
        item is (bucket, key, seq, ticket, tags, metadata)."""
        q = self._results
        while not self.background.stopping.is_set():
            item = q.get()
            if item is None:
                continue
            items = [item]
            # results trickle in (one per GetObjectTagging): gather those of the next few
            # milliseconds too, so one lock hold and one WriteBatch apply many
            gather_until = time.monotonic() + TAG_APPLY_GATHER
            while len(items) < 1000:
                try:
                    nxt = q.get(timeout=max(gather_until - time.monotonic(), 0)) \
                        if time.monotonic() < gather_until else q.get_nowait()
                except queue.Empty:
                    break
                if nxt is not None:
                    items.append(nxt)
            try:
                apply(items)
            except Exception as exc:
                self.background.failed(exc, f"applying {len(items)} tag results")

    def wake(self) -> None:
        """Wake the ``tag-apply`` thread (to see that the engine stops)."""
        self._results.put(None)

    def claim(self, items) -> list:
        """The results among ``items`` that are their key's newest fetch, of a bucket still
        tracked; their fetches are done (call with the lock held)."""
        tickets, buckets = self._tickets, self.catalog.buckets
        out = []
        for item in items:
            k = (item[0], item[1])
            if tickets.get(k) != item[3] or item[0] not in buckets:
                continue  # a later fetch for this key is under way (or bucket forgotten)
            del tickets[k]
            self._failed.pop(k, None)
            out.append(item)
        return out

    def under_way(self) -> dict:
        """The fetches started and not applied yet: (bucket, key) -> ticket (any thread)."""
        with self.lock:
            return dict(self._tickets)

    def settled(self, fetches: dict) -> bool:
        """Whether each of ``fetches`` (``under_way``) was applied, replaced by a newer one's
        result, or failed (then retried only by a reconcile)."""
        with self.lock:
            ticket, failed = self._tickets, self._failed
            return all(ticket.get(k) != t or k in failed for k, t in fetches.items())

    def retry_failed(self, bucket: str) -> int:
        """Fetch again the pending tags of ``bucket`` whose last fetch failed (or that no
        fetch serves any more); returns how many fetches were started."""
        n = 0
        with self.lock:  # tickets are handed out under the lock (as by the committer)
            for b, key, _seq in self.store.pending_tags(bucket.encode()):
                k = (b, key)
                if self._failed.pop(k, None) is None and k in self._tickets:
                    continue  # a fetch is under way
                rec = self.store.get_object(b, key)
                if rec is None or not r.is_tags_pending(rec):
                    continue
                self.fetch(b, key, rec)
                n += 1
        if n:
            log.info("reconcile of %s: fetching the tags of %d objects again", bucket, n)
        return n

    def fetch_props(self, bucket, keys, listed) -> dict:
        """{key: (tags, metadata)} of listed objects, fetched concurrently; None for what
        was not fetched: metadata no view of the bucket reads, tags that cannot change an
        answer given the rest. Objects gone are left out. ``listed``: {key: (seq, size,
        mtime, etag)} as from a listing page."""
        need_meta = bucket in self.catalog.meta_buckets
        layout = bucket in self.catalog.layout_buckets

        def one(key):
            _seq, size, mtime, _etag = listed[key]
            meta = self.s3.metadata(bucket, key) if need_meta else None
            if need_meta and meta is None:
                return key, None
            if not self._tags_needed(bucket, key, size, mtime, meta or {}):
                return key, (None, meta)
            if layout and meta is None:  # its values may be user metadata
                meta = self.s3.metadata(bucket, key)
                if meta is None:
                    return key, None
            self.metrics.tag_fetches.inc()
            tags = self.s3.tags(bucket, key)
            return key, None if tags is None else (tags, meta)
        return {key: props for key, props in self.s3_pool.map(one, keys) if props is not None}


class FlipScheduler:
    """The ``flips`` part of ``Engine``: owns a heap of (when, bucket, key) at which an
    object's answer for a time-relative view can flip, ``_at`` with each key's newest time
    (older heap entries are skipped) and ``_cond``, the condition guarding both (taken
    inside ``Engine.lock`` by ``schedule``, never around it)."""

    def __init__(self, store, catalog, background):
        self.store = store
        self.catalog = catalog
        self.background = background
        self._heap: list = []
        self._at: dict[tuple[str, str], float] = {}
        self._cond = threading.Condition()

    def schedule(self, items, now) -> None:
        """Note when the answers of (bucket, key, record) ``items`` can flip next."""
        matcher = self.catalog.matcher
        pushed = False
        with self._cond:
            for bucket, key, rec in items:
                # tags not fetched (they could not matter) may start to matter at a flip
                t = matcher.next_flip(r.object_info(bucket, key, rec), now, r.tags_unknown(rec))
                k = (bucket, key)
                if t is None:
                    self._at.pop(k, None)
                elif self._at.get(k) != t:
                    self._at[k] = t
                    heapq.heappush(self._heap, (t, bucket, key))
                    pushed = True
            if pushed:
                self._cond.notify()

    def schedule_all(self) -> None:
        """Schedule every settled object of the buckets with time-relative views."""
        now = time.time()
        for bucket in self.catalog.time_buckets:
            batch = []
            for key, rec in self.store.iter_objects(bucket):
                if r.is_settled(rec):
                    batch.append((bucket, key, rec))
                if len(batch) >= 1000:
                    self.schedule(batch, now)
                    batch = []
            self.schedule(batch, now)

    def run(self, reevaluate) -> None:
        """The ``flips`` thread: hands the (bucket, key) due to ``reevaluate(due, now)``."""
        heap = self._heap
        stopping = self.background.stopping
        while not stopping.is_set():
            with self._cond:
                now = time.time()
                if not heap or heap[0][0] > now:
                    self._cond.wait(None if not heap else min(heap[0][0] - now, 5.0))
                    continue
                due = []
                while heap and heap[0][0] <= now and len(due) < 1000:
                    t, b, k = heapq.heappop(heap)
                    if self._at.get((b, k)) == t:
                        del self._at[(b, k)]
                        due.append((b, k))
            try:
                reevaluate(due, now)
            except Exception as exc:
                self.background.failed(exc, "time flip re-evaluation")

    def wake(self) -> None:
        """Wake the ``flips`` thread (to see that the engine stops)."""
        with self._cond:
            self._cond.notify_all()
