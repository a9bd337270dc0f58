"""The engine's background work on single objects: tag fetches (GetObjectTagging and
HeadObject in the ``delvefs-s3`` pool, their results applied in batches by the
``tag-apply`` thread) and time flips (the ``flips`` thread re-evaluates objects of
time-relative views when an answer can change).

S3 requests run outside ``Engine.lock``; applying their results takes it (engine.py)."""
from __future__ import annotations

import heapq
import logging
import queue
import time

from rulesets import ObjectInfo

from . import records as r

log = logging.getLogger("delvefs.eventhandler")

TAG_APPLY_GATHER = 0.01  # seconds a tag result waits for others to be applied with


class TagFetcher:
    """Part of ``Engine`` (a mixin). A fetch is owed for every record with ``TAGS_PENDING``
    (``_finalize`` decides which: only objects whose answer the tags can change, or whose
    metadata a view reads and a listing did not bring); each (bucket, key) has a ticket so
    that only the newest fetch's result is applied. A fetch reads the metadata first (when
    owed), then the tags only if, with that metadata, they can still change an answer."""

    def _fetch_tags(self, bucket: str, key: str, rec) -> None:
        """Start the fetch owed for ``rec``, the record of ``key`` (call with the lock held)."""
        if self._stop.is_set():
            return
        k = (bucket, key)
        ticket = self._tag_ticket.get(k, 0) + 1
        self._tag_ticket[k] = ticket
        # the size and mtime decide, with the metadata, whether the tags are needed after it
        meta_first = (rec[r.OBJ_SIZE], rec[r.OBJ_MTIME]) if r.lacks_metadata(rec) and (
            bucket in self.meta_buckets or bucket in self.layout_buckets) else None
        try:
            self.s3_pool.submit(self._tag_job, bucket, key, r.seq_of(rec), ticket, meta_first)
        except RuntimeError:  # pool shut down
            pass

    def _tags_needed(self, bucket: str, key: str, size: int, mtime: float, meta: dict) -> bool:
        """Whether the tags of an object with this size, mtime and metadata can change an
        answer, or are listed (it is, or may be, in a view listing property values).
        Called outside the lock: views may change meanwhile, so ``_finalize`` asks again
        when the result is applied."""
        matcher = self.matcher
        obj = ObjectInfo(bucket, key, size, mtime, None, {}, meta)
        return matcher.tags_could_matter(obj) or (
            bucket in self.layout_buckets and matcher.in_property_listing(obj))

    def _tag_job(self, bucket, key, seq, ticket, meta_first):
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
                self.apply_tag_results(items)
            except Exception as exc:
                self._background_failed(exc, f"applying {len(items)} tag results")

    def apply_tag_results(self, items) -> None:
        """Apply fetched (tags, metadata); None for what was not fetched. ``_finalize``
        matches the records, or asks for the tags after all when, with the views of now,
        they can change an answer."""
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
                if rec is None or r.seq_of(rec) != seq or r.is_deleted(rec) or not r.is_tags_pending(rec):
                    continue
                new = r.with_tags(rec, tags, meta)
                if w:
                    w[1] = new
                else:
                    work[k] = [rec, new]
            self._finalize(work)
            # held objects of a publish batch: the batch may wait for their tags only
            self._commit_batches(self._held_batches(work))

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
                if rec is None or not r.is_tags_pending(rec):
                    continue
                self._fetch_tags(b, key, rec)
                n += 1
        if n:
            log.info("reconcile of %s: fetching the tags of %d objects again", bucket, n)
        return n

    def _fetch_props(self, bucket, keys, listed) -> dict:
        """{key: (tags, metadata)} of listed objects, fetched concurrently; None for what
        was not fetched: metadata no view of the bucket reads, tags that cannot change an
        answer given the rest. Objects gone are left out. ``listed``: {key: (seq, size,
        mtime, etag)} as from a listing page."""
        need_meta = bucket in self.meta_buckets
        layout = bucket in self.layout_buckets

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
    """Part of ``Engine`` (a mixin): a heap of (when, bucket, key) at which an object's
    answer for a time-relative view can flip; ``_flip_at`` holds each key's newest time
    (older heap entries are skipped)."""

    def _schedule_flips(self, items, now) -> None:
        matcher = self.matcher
        pushed = False
        with self._flip_cond:
            for bucket, key, rec in items:
                # tags not fetched (they could not matter) may start to matter at a flip
                t = matcher.next_flip(r.object_info(bucket, key, rec), now, r.tags_unknown(rec))
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
                if r.is_settled(rec):
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
                        if rec is None or not r.is_settled(rec):
                            continue
                        work[(b, k)] = [rec, r.to_match_again(rec)]
                    self.metrics.flips.inc(len(work))
                    self._finalize(work, now=max(time.time(), now))
            except Exception as exc:
                self._background_failed(exc, "time flip re-evaluation")
