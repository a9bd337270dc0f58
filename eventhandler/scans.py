"""The engine's whole-bucket work, run in the ``delvefs-job`` pool (and the ``reconcile``
thread): a bucket's first scan and the replay of the events held meanwhile, reconciles
(re-listing to repair the state), rematches after a view was added, and compaction of old
tombstones.

A listing page is read from S3 outside ``Engine.lock``; it is applied page by page, each
under the lock in one WriteBatch. Held events are replayed in chunks with the lock left
between them; the last chunk and the switch to "ready" happen under one lock hold, so no
event of the bucket is held after its last chunk (engine.py has the concurrency rules)."""
from __future__ import annotations

import logging
import os
import time
from email.utils import parsedate_to_datetime

from delvefs.shared.publish import manifest_batch

from . import records as r
from . import statedb as st
from .tracking import READY, SCANNING

log = logging.getLogger("delvefs.eventhandler")

CHUNK = 1000  # records per lock hold of rematches and compaction
REPLAY_CHUNK = 5000  # held events applied per lock hold


def _http_date_ns(value: str | None) -> int:
    try:
        return int(parsedate_to_datetime(value).timestamp()) * 1_000_000_000
    except (TypeError, ValueError):
        return time.time_ns()


def _listed(contents) -> dict:
    """{key: (seq, size, mtime, etag)} of a listing page; seq as a create event's sequencer
    of the same version would be (its ModTime in ns). Publish manifests are no objects."""
    listed = {}
    for o in contents:
        if manifest_batch(o["Key"]) is not None:
            continue
        modified = o["LastModified"].timestamp()
        listed[o["Key"]] = (int(modified * 1e6) * 1000, o["Size"], modified, o["ETag"].strip('"'))
    return listed


class ScanProgress:
    """A listing under way (a first scan or a reconcile), for the progress log lines and
    ``GET /v1/status``. ``expected``: the objects the bucket's last complete listing in this
    process found (the estimate of the total), else None."""

    __slots__ = ("kind", "started", "listed", "expected", "logged")

    def __init__(self, kind: str, expected: int | None):
        self.kind = kind
        self.started = time.monotonic()
        self.listed = 0
        self.expected = expected
        self.logged = self.started

    def report(self) -> dict:
        """{"kind", "listed", "seconds", "rate" (objects/s), "expected", "eta" (s; None: unknown)}."""
        seconds = max(time.monotonic() - self.started, 1e-3)
        rate = self.listed / seconds
        eta = None
        if self.expected and rate > 0:
            eta = round(max(self.expected - self.listed, 0) / rate, 1)
        return {"kind": self.kind, "listed": self.listed, "seconds": round(seconds, 1),
                "rate": round(rate, 1), "expected": self.expected, "eta": eta}


def progress_text(bucket: str, p: dict) -> str:
    """One line about a listing under way (log lines, ``delvefs status``)."""
    left = f", ~{p['eta']:.0f} s left of ~{p['expected']}" if p["eta"] is not None else ", total unknown"
    return (f"{p['kind']} of bucket {bucket}: {p['listed']} objects listed in {p['seconds']:.0f} s "
            f"({p['rate']:.0f}/s{left})")


def scan_log_interval(env=os.environ) -> float:
    """Seconds between a listing's progress lines (``DELVEFS_SCAN_LOG_INTERVAL``, default 5)."""
    return float(env.get("DELVEFS_SCAN_LOG_INTERVAL") or 5)


class Scanner:
    """Part of ``Engine`` (a mixin)."""

    @property
    def scan_progress(self) -> dict[str, ScanProgress]:
        """The listings under way, by bucket (one per bucket at a time: jobs of a bucket
        run one after the other)."""
        return self.__dict__.setdefault("_scan_progress", {})

    @property
    def _listed_last(self) -> dict[str, int]:
        """Objects of each bucket's last complete listing (this process)."""
        return self.__dict__.setdefault("_scan_listed_last", {})

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
        progress = self.scan_progress[bucket] = ScanProgress(
            "first scan" if initial else "reconcile", self._listed_last.get(bucket))
        try:
            counts, complete = self._list_and_apply(bucket, initial, progress)
        finally:
            self.scan_progress.pop(bucket, None)
        if not complete:  # stopping
            return counts
        self._listed_last[bucket] = counts["listed"]
        return self._scan_finish(bucket, initial, counts, t0)

    def _list_and_apply(self, bucket: str, initial: bool, progress: ScanProgress) -> tuple[dict, bool]:
        """List the bucket, applying page by page: (counts, whether the listing is complete)."""
        prev_last = None
        counts = {"listed": 0, "repaired": 0, "removed": 0}
        # the store's clock before the listing starts: objects modified earlier and not listed
        # are gone (the Date header has whole seconds: floor, so the bound is safe)
        cutoff = _http_date_ns(self.s3.store_date(bucket))
        log_interval = scan_log_interval()
        for contents, _date in self.s3.list_pages(bucket):
            if self._stop.is_set():
                return counts, False
            if not contents:
                continue
            listed = _listed(contents)
            last = contents[-1]["Key"]
            counts["listed"] += len(listed)
            progress.listed = counts["listed"]
            if initial:  # progress, for the 503 "scanning" answers meanwhile
                self.buckets[bucket].scan_listed = counts["listed"]
            if time.monotonic() - progress.logged >= log_interval:
                progress.logged = time.monotonic()
                log.info("%s", progress_text(bucket, progress.report()))
            self.metrics.scanned.inc(len(listed))
            self._scan_apply(bucket, listed, prev_last, last, cutoff, initial, counts)
            prev_last = last
        self._scan_apply(bucket, {}, prev_last, None, cutoff, initial, counts)
        return counts, True

    def _scan_finish(self, bucket: str, initial: bool, counts: dict, t0: float) -> dict:
        """After a complete listing: retried tags and compaction (reconcile), or the held
        events and the switch to ready (first scan)."""
        if not initial:
            counts["tags_retried"] = self._retry_failed_tags(bucket)
            counts["purged"] = self.compact(bucket)
        bs = self.buckets[bucket]
        while initial and bs.rematch_needed and not self._stop.is_set():
            bs.rematch_needed = False
            self._rematch_objects(bucket)
        replayed = 0
        for _ in range(1000 if initial else 0):  # held events: in chunks, the lock left between
            with self.lock:
                n = self._replay_held(bucket, REPLAY_CHUNK)
            replayed += n
            if n < REPLAY_CHUNK:
                break
        with self.lock:
            bs = self.buckets[bucket]
            bs.scanned = time.time()
            if initial and bs.state == SCANNING:
                while (n := self._replay_held(bucket, REPLAY_CHUNK)):  # the rest; the consumer waits
                    replayed += n
                bs.state = READY
                bs.tags = bucket in self.tag_buckets
                for info in self.infos:
                    if info.bucket == bucket and not info.ready:
                        info.ready = True
                        info.floor = bs.committed
                wb = self.store.batch()
                wb.put(r.k_bucket(bucket), bs.record())
                for info in self.infos:
                    if info.bucket == bucket:
                        wb.put(r.k_view(info.id), info.record())
                self.store.write(wb)
                bs.ready.set()
                log.info("bucket %s scanned: %d objects in %.1f s (%d events held meanwhile applied)",
                         bucket, counts["listed"], time.monotonic() - t0, replayed)
            else:
                wb = self.store.batch()
                wb.put(r.k_bucket(bucket), bs.record())
                self.store.write(wb)
        self.metrics.repaired.inc(counts["repaired"] + counts["removed"])
        return counts

    def _replay_held(self, bucket: str, chunk: int) -> int:
        """Apply (and delete, in the same batch) the oldest ``chunk`` events held for
        ``bucket``; call under the lock. Returns how many."""
        items = self.store.iter_held(bucket, chunk)
        if not items:
            return 0
        events = [r.held_event(bucket, fields) for _k, fields in items]

        def delete_held(wb):
            for k, _ in items:
                wb.delete(k)
        self._apply_locked(events, replay=True, extra=delete_held)
        return len(items)

    def _scan_apply(self, bucket, listed, prev_last, last, cutoff, initial, counts) -> None:
        needs = bucket in self.tag_buckets
        props = {}
        if needs:  # fetch tags+metadata for listed objects we do not know yet (outside the lock)
            get = self.store.get_object
            unknown = [k for k, (seq, *_rest) in listed.items()
                       if (lambda rec: rec is None or r.seq_of(rec) < seq)(get(bucket, k))]
            if unknown:
                props = self._fetch_props(bucket, unknown, listed)
        with self.lock:
            work = {}
            present = {}
            recent = []
            for key, rec in self.store.iter_objects(bucket, after=prev_last, upto=last):
                present[key] = rec
                if key not in listed and not r.is_deleted(rec):
                    if r.seq_of(rec) < cutoff:  # existed before the listing began, not listed: gone
                        work[(bucket, key)] = [rec, r.tombstone(cutoff, rec)]
                        counts["removed"] += 1
                    else:  # too recent to tell from the listing: ask the store
                        recent.append((key, r.seq_of(rec)))
            for key, (seq, size, mtime, etag) in listed.items():
                rec = present.get(key)
                if rec is not None and r.seq_of(rec) >= seq:
                    continue
                p = props.get(key)
                if needs and p is None:
                    new = r.new_version(rec, seq, size, mtime, etag, None, None, r.TAGS_PENDING)
                else:
                    new = r.new_version(rec, seq, size, mtime, etag, p[0] if p else None,
                                        p[1] if p else None, 0)
                work[(bucket, key)] = [rec, new]
                counts["repaired"] += 1
            self._finalize(work, log_changes=not initial)
        if recent:
            self._sweep_recent(bucket, recent, initial, counts)

    def _sweep_recent(self, bucket, recent, initial, counts) -> None:
        """Unlisted objects modified after the listing began: HeadObject decides."""
        def gone(item):
            return item if self.s3.metadata(bucket, item[0]) is None else None
        absent = [item for item in self.s3_pool.map(gone, recent) if item is not None]
        if not absent:
            return
        with self.lock:
            work = {}
            for key, seq in absent:
                rec = self.store.get_object(bucket, key)
                if rec is None or r.seq_of(rec) != seq or r.is_deleted(rec):
                    continue  # changed meanwhile: its own events decide
                work[(bucket, key)] = [rec, r.tombstone(seq + 1, rec)]
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
                    wb.put(r.k_view(info.id), info.record())
            self.store.write(wb)

    def _rematch_objects(self, bucket: str) -> None:
        after = None
        while not self._stop.is_set():
            with self.lock:
                work = {}
                n = 0
                for key, rec in self.store.iter_objects(bucket, after=after):
                    n += 1
                    after = key
                    if not r.is_settled(rec):
                        continue
                    work[(bucket, key)] = [rec, r.to_match_again(rec)]
                    if n >= CHUNK:
                        break
                self._finalize(work)
                if n < CHUNK:
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
            chunk = []  # (key, seq, lv) of old tombstones, read outside the lock
            last = None
            for key, rec in self.store.iter_objects(bucket, after=after):
                last = key
                if r.is_deleted(rec) and r.seq_of(rec) < before_ns:
                    chunk.append((key, r.seq_of(rec), r.change_version(rec)))
                    if len(chunk) >= CHUNK:
                        break
            if chunk:
                purged += self._purge(bucket, chunk)
            if last is None or len(chunk) < CHUNK:
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
            floor = bs.purged
            n = 0
            for key, seq, lv in chunk:
                rec = self.store.get_object(bucket, key)
                if rec is None or not r.is_deleted(rec) or r.seq_of(rec) != seq:
                    continue  # changed since it was read
                wb.delete(r.k_obj(bucket, key))
                if lv:
                    wb.delete(r.k_change(bucket, lv))
                    floor = max(floor, lv)
                self._cache.pop((bucket, key), None)
                n += 1
            bs.purged = floor
            wb.put(r.k_bucket(bucket), bs.record())
            self.store.write(wb)
            return n

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
