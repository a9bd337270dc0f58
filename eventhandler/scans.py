"""The engine's whole-bucket work, run in the ``delvefs-job`` pool (and the ``reconcile``
thread): a bucket's first scan and the replay of the events held meanwhile, reconciles
(re-listing to repair the state), rematches after a view was added, compaction of old
tombstones, and the clearing of a forgotten view's slot from a bucket's records.

A listing page is read from S3 outside ``Engine.lock``; it is applied page by page, each
under the lock in one WriteBatch. Held events are replayed in chunks with the lock left
between them; the last chunk and the switch to "ready" happen under one lock hold, so no
event of the bucket is held after its last chunk (engine.py has the concurrency rules)."""
from __future__ import annotations

import logging
import os
import time
from email.utils import parsedate_to_datetime

from delvefs.shared.manifests import manifest_batch

from . import records as r
from . import statedb as st
from .apply import stored_props
from .tracking import READY, SCANNING

log = logging.getLogger("delvefs.eventhandler")

CHUNK = 1000  # records per lock hold of rematches and compaction
CLEAR_CHUNK = 1000  # records per lock hold when a forgotten view's slot is cleared
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


def _listed_version(rec, listed: tuple, props, needs: bool) -> list:
    """The record of a version S3 listed or answered (``listed``: seq, size, mtime, etag),
    after ``rec``: with its tags and metadata (``props``) when fetched; waiting for them
    (``TAGS_PENDING``) when a view of the bucket needs them and they are not."""
    seq, size, mtime, etag = listed
    if needs and props is None:
        return r.new_version(rec, seq, size, mtime, etag, None, None, r.TAGS_PENDING)
    return r.new_version(rec, seq, size, mtime, etag, props[0] if props else None,
                         props[1] if props else None, 0)


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
    """The ``scanner`` part of ``Engine``: its methods run as jobs (``background``), one per
    bucket and kind at a time; each applies what it read under ``Engine.lock``, through the
    committer (held events through the event applier).

    Owns ``progress`` (the listings under way, by bucket; one per bucket at a time: jobs
    of a bucket run one after the other) and the object counts of each bucket's last
    complete listing (this process). Writes the ``BucketState`` fields of a bucket's scan
    (``state``, ``tags``, ``scanned``, ``scan_error``, ``scan_listed``, ``rematch_needed``
    back to False, ``purged``, ``groups`` rebuilt from the store) and ``ViewInfo.ready`` and
    ``floor``. ``scan_retry``: first delay before a failed first scan is tried again."""

    def __init__(self, lock, store, metrics, s3, s3_pool, catalog, committer, applier, tags,
                 background, *, reconcile_interval: float = 0.0, tombstone_horizon: float = 86400.0,
                 scan_retry: float = 1.0):
        self.lock = lock
        self.store = store
        self.metrics = metrics
        self.s3 = s3
        self.s3_pool = s3_pool
        self.catalog = catalog
        self.committer = committer
        self.applier = applier
        self.tags = tags
        self.background = background
        self.reconcile_interval = reconcile_interval
        self.tombstone_horizon = tombstone_horizon
        self.scan_retry = scan_retry
        self.progress: dict[str, ScanProgress] = {}
        self._listed_last: dict[str, int] = {}

    def first_scan(self, bucket: str) -> dict | None:
        """A bucket's first scan, retried with backoff (``scan_retry`` s doubling up to a
        minute) until it succeeds: S3 away or refusing must not leave the bucket "scanning"
        until a restart. Meanwhile its views answer 503 and its events are held; a retry
        lists from the start (applying a listed page again changes nothing)."""
        bs = self.catalog.buckets[bucket]
        delay = self.scan_retry
        stopping = self.background.stopping
        while not stopping.is_set():
            try:
                counts = self._scan(bucket, True)
            except st.StorageError:
                raise
            except Exception as exc:  # noqa: BLE001 — S3 errors of every kind: retried
                bs.scan_error = f"{type(exc).__name__}: {exc}"
                self.metrics.scan_failures.inc()
                log.warning("first scan of bucket %s failed (%s); retrying in %.1f s",
                            bucket, bs.scan_error, delay)
                stopping.wait(delay)
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
        progress = self.progress[bucket] = ScanProgress(
            "first scan" if initial else "reconcile", self._listed_last.get(bucket))
        try:
            counts, complete = self._list_and_apply(bucket, initial, progress)
        finally:
            self.progress.pop(bucket, None)
        if not complete:  # stopping
            return counts
        self._listed_last[bucket] = counts["listed"]
        return self._scan_finish(bucket, initial, counts, t0)

    def _list_and_apply(self, bucket: str, initial: bool, progress: ScanProgress) -> tuple[dict, bool]:
        """List the bucket, applying page by page: (counts, whether the listing is complete)."""
        prev_last = None
        counts = {"listed": 0, "repaired": 0, "removed": 0, "view_changes": 0}
        # the store's clock before the listing starts: objects modified earlier and not listed
        # are gone (the Date header has whole seconds: floor, so the bound is safe)
        cutoff = _http_date_ns(self.s3.store_date(bucket))
        log_interval = scan_log_interval()
        for contents, _date in self.s3.list_pages(bucket):
            if self.background.stopping.is_set():
                return counts, False
            if not contents:
                continue
            listed = _listed(contents)
            last = contents[-1]["Key"]
            counts["listed"] += len(listed)
            progress.listed = counts["listed"]
            if initial:  # progress, for the 503 "scanning" answers meanwhile
                self.catalog.buckets[bucket].scan_listed = counts["listed"]
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
            counts["tags_retried"] = self.tags.retry_failed(bucket)
            counts["purged"] = self.compact(bucket)
        bs = self.catalog.buckets[bucket]
        while initial and bs.rematch_needed and not self.background.stopping.is_set():
            bs.rematch_needed = False
            self._rematch_objects(bucket)
        replayed = 0
        for _ in range(1000 if initial else 0):  # held events: in chunks, the lock left between
            with self.lock:
                n = self.applier.replay_held(bucket, REPLAY_CHUNK)
            replayed += n
            if n < REPLAY_CHUNK:
                break
        with self.lock:
            bs = self.catalog.buckets[bucket]
            bs.scanned = time.time()
            if initial and bs.state == SCANNING:
                while (n := self.applier.replay_held(bucket, REPLAY_CHUNK)):  # the rest; the consumer waits
                    replayed += n
                bs.state = READY
                bs.tags = bucket in self.catalog.tag_buckets
                infos = self.catalog.infos
                for info in infos:
                    if info.bucket == bucket and not info.ready:
                        info.ready = True
                        info.floor = bs.committed
                wb = self.store.batch()
                wb.put(r.k_bucket(bucket), bs.record())
                for info in infos:
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
        if not initial:
            self._count_repairs(bucket, counts)
        return counts

    def _count_repairs(self, bucket: str, counts: dict, what: str = "reconcile") -> None:
        """The metrics of a reconcile or key check: what it compared, what it repaired, and
        how much of that a view shows (an operator's sign of lost events)."""
        self.metrics.checked.inc(counts["listed"])
        shown = counts["view_changes"]
        self.metrics.repaired.labels("view").inc(shown)
        self.metrics.repaired.labels("state").inc(max(0, counts["repaired"] + counts["removed"] - shown))
        if shown:
            log.warning("%s of %s: %d objects checked, %d repaired, %d of them changed a "
                        "view (events lost or late)", what, bucket, counts["listed"],
                        counts["repaired"] + counts["removed"], shown)

    def _scan_apply(self, bucket, listed, prev_last, last, cutoff, initial, counts) -> None:
        needs = bucket in self.catalog.tag_buckets
        props = {}
        if needs:  # fetch tags+metadata for listed objects we do not know yet (outside the lock)
            get = self.store.get_object
            unknown = [k for k, (seq, *_rest) in listed.items()
                       if (lambda rec: rec is None or r.seq_of(rec) < seq)(get(bucket, k))]
            if unknown:
                props = self.tags.fetch_props(bucket, unknown, listed)
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
                new = _listed_version(rec, (seq, size, mtime, etag), props.get(key), needs)
                work[(bucket, key)] = [rec, new]
                counts["repaired"] += 1
            counts["view_changes"] += self.committer.finalize(work, log_changes=not initial)
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
            counts["view_changes"] += self.committer.finalize(work, log_changes=not initial)

    def check_keys(self, bucket: str, keys: list[str]) -> dict:
        """Ask S3 for each key (HeadObject, in parallel) and make the state agree: a key S3
        has in another version than the record (or that the record lacks) gets that version,
        a key S3 lacks that the record has is removed. For a mount waiting for keys
        (``POST /v1/objects/wait``) whose events were lost: repaired in one round trip
        instead of at the next reconcile. A record that changed while S3 was asked is left to
        its own events. Counts as a reconcile does."""
        counts = {"listed": 0, "repaired": 0, "removed": 0, "view_changes": 0}
        keys = [k for k in dict.fromkeys(keys) if manifest_batch(k) is None]
        before = {k: self.store.get_object(bucket, k) for k in keys}
        answers = list(self.s3_pool.map(lambda k: self.s3.head(bucket, k), keys))
        counts["listed"] = len(keys)
        listed, absent = {}, []
        for key, info in zip(keys, answers):
            rec = before[key]
            if info is None:
                if rec is not None and not r.is_deleted(rec):
                    absent.append(key)
                continue
            if rec is not None and not r.is_deleted(rec) and rec[r.OBJ_ETAG] == info["etag"]:
                continue
            # Last-Modified has whole seconds: a record of a version modified in a later
            # second is newer than what S3 answered a moment ago (its event came meanwhile)
            seq = int(info["mtime"]) * 1_000_000_000
            if rec is not None and r.seq_of(rec) >= seq + 1_000_000_000:
                continue
            seq = max(seq, r.seq_of(rec) + 1 if rec is not None else 0)
            listed[key] = (seq, info["size"], info["mtime"], info["etag"])
        needs = bucket in self.catalog.tag_buckets
        props = self.tags.fetch_props(bucket, list(listed), listed) if needs and listed else {}
        with self.lock:
            work = {}
            for key, (seq, size, mtime, etag) in listed.items():
                rec = self.store.get_object(bucket, key)
                if rec is not before[key] and (rec is None or before[key] is None
                                               or r.seq_of(rec) != r.seq_of(before[key])):
                    continue  # changed meanwhile: its own events decide
                new = _listed_version(rec, (seq, size, mtime, etag), props.get(key), needs)
                work[(bucket, key)] = [rec, new]
                counts["repaired"] += 1
            for key in absent:
                rec = self.store.get_object(bucket, key)
                if rec is None or r.is_deleted(rec) or r.seq_of(rec) != r.seq_of(before[key]):
                    continue
                work[(bucket, key)] = [rec, r.tombstone(r.seq_of(rec) + 1, rec)]
                counts["removed"] += 1
            counts["view_changes"] += self.committer.finalize(work)
        self._count_repairs(bucket, counts, "check of waited-for keys")
        return counts

    def rematch(self, bucket: str) -> None:
        """Match every object of a tracked bucket again (a view was added); objects whose
        tags/metadata are now needed but unknown get fetched first. Then the bucket's new
        views are ready."""
        self._rematch_objects(bucket)
        # objects whose tags had to be fetched join the view when the tags are in
        deadline = time.monotonic() + 120
        stopping = self.background.stopping
        while self.store.has_pending_tags(bucket) and time.monotonic() < deadline:
            if stopping.wait(0.02):
                return
        if stopping.is_set():
            return
        with self.lock:
            bs = self.catalog.buckets[bucket]
            wb = self.store.batch()
            for info in self.catalog.infos:
                if info.bucket == bucket and not info.ready:
                    info.ready = True
                    info.floor = bs.committed
                    wb.put(r.k_view(info.id), info.record())
            self.store.write(wb)

    def _rematch_objects(self, bucket: str) -> None:
        after = None
        while not self.background.stopping.is_set():
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
                self.committer.finalize(work)
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
        while not self.background.stopping.is_set():
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
            self.catalog.buckets[bucket].groups = frozenset(self.store.member_groups(bucket))
        return purged

    def _purge(self, bucket: str, chunk) -> int:
        with self.lock:
            bs = self.catalog.buckets[bucket]
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
                self.committer.forget_record(bucket, key)
                n += 1
            bs.purged = floor
            wb.put(r.k_bucket(bucket), bs.record())
            self.store.write(wb)
            return n

    def reconcile(self, bucket: str | None = None) -> dict:
        """Re-list one tracked bucket (or all) and repair the state; returns counts per bucket."""
        buckets = self.catalog.buckets
        names = [bucket] if bucket is not None else [b for b, s in buckets.items() if s.state == READY]
        out = {}
        for b in names:
            bs = buckets.get(b)
            if bs is None:
                raise KeyError(b)
            if bs.state != READY:
                bs.ready.wait(300)
            out[b] = self.background.submit_job(b, "reconcile", self._scan, b, False).result()
        return out

    def run_reconciles(self) -> None:
        """The ``reconcile`` thread: every ``reconcile_interval`` s (0: never), all buckets."""
        interval = self.reconcile_interval
        if not interval or interval <= 0:
            return
        while not self.background.stopping.wait(interval):
            try:
                self.reconcile()
            except Exception as exc:
                self.background.failed(exc, "periodic reconcile")

    def clear_slot(self, slot: int, bucket: str) -> int:
        """Clear ``slot`` from ``slots`` and ``ever`` of every record of ``bucket`` (moving
        membership entries to their new groups), in chunks under the lock; then the slot is
        free. Nothing sets the bit meanwhile: no view holds the slot. Returns the records changed."""
        after, changed = None, 0
        catalog = self.catalog
        while not self.background.stopping.is_set():
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
                                names = catalog.listed_names(slots)
                                props = r.only_properties(stored_props(self.store, bucket, old_slots, key),
                                                          names) if names else None
                                wb.put(r.k_member(bucket, slots, key), r.pack_member(new, props))
                                groups.add(slots)
                        wb.put(r.k_obj(bucket, key), r.pack_object(new))
                        self.committer.forget_record(bucket, key)  # the event path reads it anew
                        changed += 1
                    if n >= CLEAR_CHUNK:
                        break
                bs = catalog.buckets[bucket]
                bs.groups = bs.groups | groups  # before the write, as the committer does
                if n < CLEAR_CHUNK:  # the last chunk: the slot is free with it
                    wb.delete(r.k_freeing(slot))
                try:
                    self.store.write(wb)
                except BaseException:
                    self.committer.drop_cache()
                    raise
                if n < CLEAR_CHUNK:
                    bs.groups = frozenset(self.store.member_groups(bucket))
                    catalog.slot_cleared(slot)
                    log.info("slot %d of forgotten view cleared from bucket %s (%d records)",
                             slot, bucket, changed)
                    return changed
        return changed
