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

from . import records as r

log = logging.getLogger("delvefs.eventhandler")


class TagFetcher:
    """Part of ``Engine`` (a mixin). A fetch is owed for every record with ``TAGS_PENDING``;
    each (bucket, key) has a ticket so that only the newest fetch's result is applied."""

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
            tags = self.s3.tags(bucket, key)
            self.metrics.tag_fetches.inc()
            meta = self.s3.metadata(bucket, key) if need_meta and tags is not None else None
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
                if rec is None or r.seq_of(rec) != seq or r.is_deleted(rec) or not r.is_tags_pending(rec):
                    continue
                new = r.with_tags(rec, tags, meta)
                if w:
                    w[1] = new
                else:
                    work[k] = [rec, new]
            self._finalize(work)

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
                self._fetch_tags(b, key, r.seq_of(rec), need_meta=r.lacks_metadata(rec))
                n += 1
        if n:
            log.info("reconcile of %s: fetching the tags of %d objects again", bucket, n)
        return n

    def _fetch_props(self, bucket, keys, need_meta=True) -> dict:
        """{key: (tags, metadata)} fetched concurrently; objects gone are left out."""
        def one(key):
            tags = self.s3.tags(bucket, key)
            meta = self.s3.metadata(bucket, key) if need_meta and tags is not None else {}
            return key, tags, meta
        out = {}
        self.metrics.tag_fetches.inc(len(keys))
        for key, tags, meta in self.s3_pool.map(one, keys):
            if tags is not None and meta is not None:
                out[key] = (tags, meta)
        return out


class FlipScheduler:
    """Part of ``Engine`` (a mixin): a heap of (when, bucket, key) at which an object's
    answer for a time-relative view can flip; ``_flip_at`` holds each key's newest time
    (older heap entries are skipped)."""

    def _schedule_flips(self, items, now) -> None:
        matcher = self.matcher
        pushed = False
        with self._flip_cond:
            for bucket, key, rec in items:
                t = matcher.next_flip(r.object_info(bucket, key, rec), now)
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
