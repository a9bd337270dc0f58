"""The object store's outages and restarts, noticed, and what their lost events would have
said, repaired.

MinIO sends no event for a PUT it answers in its first moments after starting (its
notification target is not connected yet), nor for one it committed as it was killed; an
object store that was unreachable may have taken writes from clients that could reach it.
Nothing else would tell the handler of those objects before the next periodic reconcile.

``StoreWatch`` (the thread ``delvefs-store-watch``) asks the store every ``interval``
seconds with a cheap request (:meth:`BucketReader.probe`: ListObjectsV2 of no keys, of one
tracked bucket) and, where the store tells it (MinIO's admin ServerInfo, with credentials
allowed it), for its uptime. Any of the handler's own requests that gets no answer (tag and
metadata fetches: ``BucketReader.on_unreachable``) counts as a failed probe. The store is

* *unreachable* from the first failed probe or request until a probe succeeds, and
* *restarted* when the start time its uptime implies is later than every moment the
  earlier answers allowed (a restart faster than the probe interval still shows); a store
  first seen up less than 30 s started around the handler's own start, and is repaired
  after as well.

Either way, once the store has answered again for ``settle`` seconds (and, restarted, has
been up that long: the PUTs of its first moments are the ones without events), every
tracked bucket is reconciled — and once more when its events flow again (an event of a
change made after it came back, or ``events_wait`` s without one) if they had not by then (``Engine.reconcile``: one listing each, compared with the
state; ``delvefs_reconcile_*`` count what it checked and what it repaired). A listing costs
one ListObjectsV2 per 1,000 objects: a bucket of 10 million objects is 10,000 requests, and
about as long as its first scan took (docs/OPERATIONS.md has the figures). Meanwhile
``POST /v1/objects/wait`` checks in S3 the keys a mount waits for (``Scanner.check_keys``),
so what a pipeline waits for is repaired within seconds, before the listing ends.
"""
from __future__ import annotations

import logging
import threading
import time

from delvefs.shared.s3 import unreachable_error

log = logging.getLogger("delvefs.eventhandler")

DEFAULT_PROBE_INTERVAL = 2.0
DEFAULT_SETTLE = 3.0
DEFAULT_EVENTS_WAIT = 30.0
BOOT_SLACK = 0.05  # s a probe's own round trip may shift the start time its uptime implies
YOUNG = 30.0  # s: a store first seen up this short a time started around this handler's start


class StoreWatch:
    """Probes the store (``reader``: a ``BucketReader``) for the buckets ``tracked()`` names,
    and calls ``repair()`` after an outage or a restart. ``interval`` 0: no probing (the
    handler's own failed requests still count)."""

    def __init__(self, reader, tracked, repair, metrics, stopping: threading.Event, *,
                 interval: float = DEFAULT_PROBE_INTERVAL, settle: float = DEFAULT_SETTLE,
                 events_wait: float = DEFAULT_EVENTS_WAIT):
        self.reader = reader
        # epoch s of the newest event applied (its sequencer): whether events flow again
        self.newest_event = lambda: metrics.newest_event
        self.events_wait = events_wait
        self.tracked = tracked
        self.repair = repair
        self.metrics = metrics
        self.stopping = stopping
        self.interval = interval
        self.settle = settle
        self._lock = threading.Lock()
        self.unreachable_since: float | None = None  # monotonic, while unreachable
        self.last_error: str | None = None
        # (earliest, latest) monotonic time the store can have started, by its answers so far
        self._booted: tuple[float, float] | None = None
        self._uptime_known = True  # False once the store did not tell its uptime
        self._repair_due: float | None = None  # monotonic time the repair is due
        self._ran_before_events = False  # the repair ran once before the store's events flowed again
        self._events_after = 0.0  # epoch s: a repair is complete after an event of a change after it
        self._repair_latest = 0.0  # monotonic: ... or until then
        self._why = ""
        self.repairs = 0
        self._wake = threading.Event()
        reader.on_unreachable = self.failed

    # -- signals

    def failed(self, exc: BaseException) -> None:
        """A request of the handler's got no answer from the store (any thread)."""
        with self._lock:
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                self.metrics.store_outages.labels("unreachable").inc()
                log.warning("the object store is unreachable (%s): the tracked buckets will be "
                            "reconciled once it answers again", self.last_error)
        self._wake.set()

    def _answered(self, uptime: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            was_down = self.unreachable_since is not None
            if was_down:
                seconds = now - self.unreachable_since
                self.unreachable_since = None
                self._due(now + self.settle, f"unreachable for {seconds:.1f} s")
                log.warning("the object store answers again after %.1f s: reconciling the "
                            "tracked buckets in %.1f s", seconds, self.settle)
            if uptime is not None:
                self._started(now, uptime, was_down)

    def _started(self, now: float, uptime: float, was_down: bool) -> None:
        """The store says it has been up ``uptime`` whole seconds: it started within
        (now - uptime - 1, now - uptime]. A start after every moment the earlier answers
        allow is a restart; a store that started just before this handler first asked may
        have lost events as well (a restart this handler could not see)."""
        lo, hi = now - uptime - 1.0, now - uptime
        first = self._booted is None
        if not first and lo > self._booted[1] + BOOT_SLACK:
            self._booted = None  # a new start
            if not was_down:
                self.metrics.store_outages.labels("restart").inc()
                self._due(now + max(0.0, self.settle - uptime), f"restarted {uptime:.0f} s ago")
                log.warning("the object store restarted %.0f s ago: reconciling the tracked "
                            "buckets once it has been up %.1f s", uptime, self.settle)
        elif first and uptime < YOUNG:  # (buckets tracked by then are reconciled)
            self.metrics.store_outages.labels("start").inc()
            self._due(now + max(0.0, self.settle - uptime), f"started {uptime:.0f} s ago")
            log.warning("the object store started %.0f s ago: reconciling the tracked buckets "
                        "once it has been up %.1f s (events of its first moments may be lost)",
                        uptime, self.settle)
        if self._booted is None:
            self._booted = (lo, hi)
        else:  # the same start: what every answer allows
            self._booted = (max(lo, self._booted[0]), min(hi, self._booted[1]))

    def _due(self, at: float, why: str) -> None:
        """A repair at ``at``, and — when the store's events did not flow again by then —
        once more when they do: an event of a change made from now on (its sequencer, the
        store's clock) shows that the store's notification target is connected, so every
        PUT whose event was lost was answered before that event's, and a listing after it
        sees them all. A store that takes no writes sends no event: the second repair is
        then ``events_wait`` s later."""
        if self._repair_due is None or at > self._repair_due:
            self._repair_due = at
        self._ran_before_events = False
        self._events_after = time.time()
        self._repair_latest = time.monotonic() + self.events_wait
        self._why = why

    def _events_flow(self) -> bool:
        return self.newest_event() >= self._events_after or time.monotonic() >= self._repair_latest

    # -- the thread

    def probe_once(self) -> None:
        """One probe: read the store's uptime where it tells (from the start: a restart is
        a change of it), and reach a tracked bucket."""
        buckets = self.tracked()
        if not buckets and not self._uptime_known:
            return
        try:
            uptime = self.reader.store_uptime() if self._uptime_known else None
            if buckets:
                self.reader.probe(buckets[0])
        except Exception as exc:  # noqa: BLE001 — any answer of the store's is an answer
            if unreachable_error(exc):
                self.failed(exc)
                return
            uptime = None
        if uptime is None and self._uptime_known:
            self._uptime_known = False
            log.info("the object store does not tell its uptime (no MinIO admin right): a "
                     "restart shows only when a probe fails")
        self._answered(uptime)

    def run(self) -> None:
        """The ``delvefs-store-watch`` thread: probe, and repair when due."""
        while not self.stopping.is_set():
            if self.interval > 0 or self.unreachable_since is not None:
                self.probe_once()
            self._repair_if_due()
            wait = self.interval if self.interval > 0 else 1.0
            with self._lock:
                if self._repair_due is not None:  # events are looked for every 0.1 s meanwhile
                    wait = min(wait, max(0.1, self._repair_due - time.monotonic()))
            self._wake.wait(wait)
            self._wake.clear()

    def _repair_if_due(self) -> None:
        """The repair at its time; one that ran before the store's events flowed again runs
        once more when they do (or ``events_wait`` s later): the PUTs of that moment had
        no event either."""
        with self._lock:
            due = self._repair_due
            if due is None or time.monotonic() < due or self.unreachable_since is not None:
                return
            flowing = self._events_flow()
            if self._ran_before_events:  # the second run: once the events flow
                if not flowing:
                    return
                self._ran_before_events = False
                self._repair_due, why = None, self._why + " (again: its events flow now)"
            else:
                self._ran_before_events = not flowing
                if flowing:
                    self._repair_due = None
                why = self._why
        t0 = time.monotonic()
        try:
            counts = self.repair()
        except Exception as exc:  # noqa: BLE001 — S3 away again: the next answer repairs
            log.warning("repair after the object store's outage failed (%s: %s); tried again "
                        "once the store answers", type(exc).__name__, exc)
            with self._lock:
                self._due(time.monotonic() + self.settle, why)
            return
        self.repairs += 1
        checked = sum(c.get("listed", 0) for c in counts.values())
        repaired = sum(c.get("repaired", 0) + c.get("removed", 0) for c in counts.values())
        shown = sum(c.get("view_changes", 0) for c in counts.values())
        log.warning("object store %s: %d bucket(s) reconciled in %.1f s: %d objects checked, "
                    "%d repaired (%d changed a view)", why, len(counts), time.monotonic() - t0,
                    checked, repaired, shown)

    def wake(self) -> None:
        """End the thread's wait (stopping)."""
        self._wake.set()

    def status(self) -> dict:
        """For ``GET /v1/status``: whether the store answers, since when not, the last error."""
        with self._lock:
            since = self.unreachable_since
            return {"reachable": since is None,
                    "unreachable_seconds": None if since is None else round(time.monotonic() - since, 1),
                    "last_error": self.last_error, "repair_pending": self._repair_due is not None,
                    "repairs": self.repairs}
