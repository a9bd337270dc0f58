"""Prometheus metrics of the handler (prometheus_client, one registry per handler)."""
from __future__ import annotations

import bisect
import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily

from delvefs.shared.histogram import cumulative

LATENCY_BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class BatchHistogram:
    """A histogram fed a whole batch at a time (one lock per batch, not per event)."""

    def __init__(self, name: str, doc: str, bounds=LATENCY_BOUNDS):
        self.name, self.doc, self.bounds = name, doc, tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values) -> None:
        bounds, local = self.bounds, [0] * (len(self.bounds) + 1)
        total = 0.0
        for v in values:
            local[bisect.bisect_left(bounds, v)] += 1
            total += v
        with self._lock:
            for i, c in enumerate(local):
                self.counts[i] += c
            self.sum += total

    def collect(self):
        with self._lock:
            counts, total = list(self.counts), self.sum
        m = HistogramMetricFamily(self.name, self.doc)
        m.add_metric([], cumulative(self.bounds, counts), total)
        yield m


class Metrics:
    """``shard``: the name of the shard this handler serves ("0": the one handler of a
    deployment without shards), exported as ``delvefs_handler_info{shard}`` for dashboards
    to join the handler's metrics on."""

    def __init__(self, shard: str = "0"):
        r = self.registry = CollectorRegistry()
        self.info = Gauge("delvefs_handler_info", "always 1; its labels name the handler's shard",
                          ["shard"], registry=r)
        self.info.labels(shard=shard).set(1)
        self.processed = Counter("delvefs_events_processed", "events applied to the state", registry=r)
        self.dropped = Counter("delvefs_events_dropped", "events of buckets no view names", registry=r)
        self.stale = Counter("delvefs_events_stale",
                             "events that changed nothing (replayed or older than the state)", registry=r)
        self.dead = Counter("delvefs_events_dead_lettered", "undecodable or invalid messages", registry=r)
        self.storage_errors = Counter("delvefs_storage_errors",
                                      "LevelDB writes that failed (consuming stopped)", registry=r)
        self.batches = Histogram("delvefs_batch_size", "messages per committed batch", registry=r,
                                 buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))
        self.latency = BatchHistogram("delvefs_event_latency_seconds",
                                      "event time (sequencer) to committed state")
        r.register(self.latency)
        self.queue = Gauge("delvefs_queue_messages", "messages ready in the handler's queue (lag)",
                           registry=r)
        self.scans = Counter("delvefs_bucket_scans", "bucket listings (first scans and reconciles)",
                             registry=r)
        self.scan_failures = Counter("delvefs_scan_failures",
                                     "first scans of a bucket that failed (and are retried)", registry=r)
        self.scanned = Counter("delvefs_scanned_objects", "objects read by bucket listings", registry=r)
        self.tag_fetches = Counter("delvefs_tag_fetches", "GetObjectTagging requests", registry=r)
        self.flips = Counter("delvefs_time_flips", "objects re-evaluated because time passed", registry=r)
        # what a reconcile (or a key checked for a waiting mount) compared with S3, and what
        # it found wrong: effect="view" changed what some view shows (an event was lost or
        # came late), effect="state" only a record no view shows
        self.checked = Counter("delvefs_reconcile_checks", "objects compared with S3 by reconciles "
                               "and key checks", registry=r)
        self.repaired = Counter("delvefs_reconcile_repairs", "records a reconcile or key check "
                                "found wrong and repaired, by effect", ["effect"], registry=r)
        self.store_outages = Counter("delvefs_store_outages", "times the object store was noticed "
                                     "unreachable or restarted (start: first seen up < 30 s)", ["kind"], registry=r)
        self.publish_committed = Counter("delvefs_publish_batches_committed",
                                         "published directories shown whole", registry=r)
        self.publish_expired = Counter("delvefs_publish_batches_expired",
                                       "published directories shown incomplete at the publish timeout",
                                       registry=r)
        # what `GET /v1/status` reports beyond the counters
        self.dead_letters = DeadLetters(self.dead)
        self.newest_event = 0.0  # epoch s: the time of the newest event applied (0: none yet)
        self.queue_depth: int | None = None  # messages waiting in the source's queue (None: not known yet)

    def set_queue_depth(self, n: int) -> None:
        self.queue_depth = n
        self.queue.set(n)

    def applied(self, events) -> None:
        """A batch of ``events`` was committed: remember its newest event's time (a
        sequencer that is epoch ns: MinIO's, or one made from eventTime by the SQS source)."""
        newest = max((e.seq for e in events if 10**18 <= e.seq <= 4 * 10**18), default=0) / 1e9
        if newest > self.newest_event:
            self.newest_event = newest


class DeadLetters:
    """Counts dead-lettered messages (the ``delvefs_events_dead_lettered`` counter) and keeps
    the last few reasons, each with its bucket when one is known (the status endpoint shows a
    principal only those of buckets it may read)."""

    KEEP = 20

    def __init__(self, counter):
        self.counter = counter
        self.count = 0
        self.recent: collections.deque = collections.deque(maxlen=self.KEEP)
        self._lock = threading.Lock()

    def add(self, reason: str, bucket: str | None = None) -> None:
        self.counter.inc()
        with self._lock:
            self.count += 1
            self.recent.append({"time": round(time.time(), 3), "reason": reason[:300], "bucket": bucket})

    def snapshot(self) -> tuple[int, list[dict]]:
        with self._lock:
            return self.count, list(self.recent)
