"""Histograms kept as plain bucket counts, for Prometheus' text format (prometheus_client
renders them: :func:`family`). prometheus_client's own Histogram takes a lock and looks
its labels up on every observation; these are fed where that costs too much — a mount's
FUSE requests (one thread: the trio loop observes and the scrape reads) and the handler's
batches (one lock per batch)."""
from __future__ import annotations

from bisect import bisect_left

from prometheus_client.core import HistogramMetricFamily


class Histogram:
    """Observations counted per bucket of ``bounds`` (the last bucket: above them all)
    and summed. Not locked: one thread observes and reads."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)


def cumulative(bounds, counts) -> list[tuple[str, int]]:
    """Prometheus' buckets: (upper bound ``le``, observations at or below it), ``+Inf`` last."""
    acc, buckets = 0, []
    for bound, c in zip(bounds, counts):
        acc += c
        buckets.append((repr(float(bound)), acc))
    buckets.append(("+Inf", acc + counts[-1]))
    return buckets


def family(name: str, doc: str, labels: list[str] | None = None) -> HistogramMetricFamily:
    """An empty histogram family; add one :class:`Histogram` per label set with :func:`add`."""
    return HistogramMetricFamily(name, doc, labels=labels or [])


def add(fam: HistogramMetricFamily, label_values: list[str], h: Histogram) -> None:
    fam.add_metric(label_values, cumulative(h.bounds, h.counts), h.total)


class Timings:
    """Durations by kind (a FUSE operation, a handler endpoint): a :class:`Histogram` of
    ``bounds`` for each kind seen, and how many ended in failure. One dict lookup an
    observation; not locked (one thread observes and reads)."""

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.times: dict[str, Histogram] = {}
        self.failures: dict[str, int] = {}

    def observe(self, kind: str, seconds: float, failed: bool = False) -> None:
        h = self.times.get(kind)
        if h is None:
            h = self.times[kind] = Histogram(self.bounds)
            self.failures[kind] = 0
        h.counts[bisect_left(h.bounds, seconds)] += 1
        h.total += seconds
        if failed:
            self.failures[kind] += 1
