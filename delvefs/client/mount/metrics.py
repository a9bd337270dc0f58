"""A mount's Prometheus metrics, opt-in: served on ``--metrics-addr HOST:PORT``
(``http://HOST:PORT/metrics``, as rclone's) and/or written to ``--metrics-textfile FILE``
every ``--metrics-interval`` seconds for node_exporter's textfile collector
(docs/CONFIGURATION.md lists every metric).

:class:`MountMetrics` is a prometheus_client collector (rendered in the same text format
as the handler's ``/metrics``): at each scrape it reads what the mount's parts already
count — FUSE requests by operation (``Timings`` fed by the adapter's request wrapper),
the data cache's hits, misses and bytes, the files not in S3 yet (the same report as
``delvefs status``: delvefs/client/commands/status.py), the S3 requests by operation
(``S3Store.requests``: delvefs/client/mount/s3async.py), round trips to the handler
(``HandlerClient.round_trips``) and how long ago each view was last known fresh. Every
metric carries the ``mountpoint`` label: one node's mounts write files side by side.

Everything runs on the mount's trio loop: the HTTP server is a trio task (one short
request per connection; a scrape renders on the loop, as ``delvefs status`` does) and
the textfile is rendered on the loop and written by a worker thread (a temporary file
renamed over the old one: node_exporter never reads half a file). The file is removed
when the mount ends: a mount that is gone exports nothing.
"""
from __future__ import annotations

import contextlib
import logging
import os

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from delvefs.shared import histogram
from delvefs.shared.histogram import Timings
from .mountpoints import MountError
from .passthrough import report as passthrough_report
from .report import dirty_bytes, upload_counts, views_report

log = logging.getLogger(__name__)

# seconds; a request answered from memory takes tens of microseconds
REQUEST_BOUNDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                  0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def request_times() -> Timings:
    """What the FUSE adapter times its requests into (``Adapter.request_times``)."""
    return Timings(REQUEST_BOUNDS)


class MountMetrics:
    """The metrics of the mount at ``mountpoint``, read at each :meth:`render` from
    ``core`` (the file system core: its cache, uploads and views), ``requests`` (the
    adapter's request times) and ``round_trips`` (the handler client's, to ``handler``)."""

    def __init__(self, core, mountpoint: str, requests: Timings, round_trips: Timings, *,
                 handler: str = "", version: str = ""):
        self.core = core
        self.mountpoint = mountpoint
        self.requests = requests
        self.round_trips = round_trips
        self.handler = handler
        self.version = version
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        """The Prometheus text format (on the loop)."""
        return generate_latest(self.registry)

    def collect(self):
        mp = self.mountpoint
        info = GaugeMetricFamily("delvefs_mount_info", "always 1; its labels describe the mount",
                                 labels=["mountpoint", "handler", "version"])
        info.add_metric([mp, self.handler, self.version], 1)
        yield info
        yield from _timings(self.requests, mp, "op", "delvefs_mount_fuse_request_seconds",
                            "FUSE requests answered, by operation: time from the kernel's request "
                            "to the answer", "delvefs_mount_fuse_errors",
                            "FUSE requests answered with an error (ENOENT, EIO, ...), by operation")
        yield from self._cache()
        yield from self._uploads()
        yield from self._s3()
        yield from self._passthrough()
        yield from _timings(self.round_trips, mp, "request",
                            "delvefs_mount_handler_request_seconds",
                            "round trips to the event handler, by request (standbys tried included)",
                            "delvefs_mount_handler_errors",
                            "round trips to the event handler that ended in an error")
        yield from self._views()

    def _cache(self):
        cache, mp = self.core.cache, self.mountpoint
        reads = CounterMetricFamily("delvefs_mount_cache_reads",
                                    "reads answered from the data cache (hit) or after fetching "
                                    "from S3 (miss)", labels=["mountpoint", "result"])
        read_bytes = CounterMetricFamily("delvefs_mount_cache_read_bytes", "bytes of those reads",
                                         labels=["mountpoint", "result"])
        reads.add_metric([mp, "hit"], cache.hits)
        reads.add_metric([mp, "miss"], cache.misses)
        read_bytes.add_metric([mp, "hit"], cache.hit_bytes)
        read_bytes.add_metric([mp, "miss"], cache.miss_bytes)
        yield reads
        yield read_bytes
        yield _counter("delvefs_mount_cache_fetched_bytes", "bytes fetched from S3 into the cache",
                       mp, cache.got)
        yield _counter("delvefs_mount_cache_gets", "ranged GETs the cache sent to S3", mp, cache.gets)
        yield _counter("delvefs_mount_cache_evictions", "cached blocks evicted to keep the bound",
                       mp, cache.evictions)
        yield _counter("delvefs_mount_cache_forced_evictions", "of those, evicted because the "
                       "cache disk was full (a write to it failed with ENOSPC or EDQUOT)",
                       mp, cache.forced_evictions)
        yield _gauge("delvefs_mount_cache_bytes", "bytes the cache holds (clean present bytes and "
                     "dirty files)", mp, cache.bytes)
        if cache.limit is not None:
            yield _gauge("delvefs_mount_cache_limit_bytes", "the bound on clean cached data "
                         "(--cache-size)", mp, cache.limit)
        yield _gauge("delvefs_mount_dirty_bytes", "bytes of files written here and not in S3 yet",
                     mp, dirty_bytes(self.core))
        reads = getattr(self.core, "reads", None)
        yield _counter("delvefs_mount_unconfirmed_opens", "opens served a cached copy S3 could "
                       "not be asked to confirm (stale_if_error)", mp,
                       reads.unconfirmed.opens if reads is not None else 0)

    def _uploads(self):
        core, mp = self.core, self.mountpoint
        files = GaugeMetricFamily("delvefs_mount_uploads",
                                  "files (and DELETEs) not in S3 yet, by state: waiting (write-back), "
                                  "pending, uploading, failed, conflict (as `delvefs status` "
                                  "shows them)",
                                  labels=["mountpoint", "state"])
        for state, n in upload_counts(core.upload_report()).items():
            files.add_metric([mp, state], n)
        yield files
        yield _counter("delvefs_mount_uploads_completed", "files uploaded to S3", mp, core.uploads.count)
        yield _counter("delvefs_mount_conflicts", "conflict copies made (S3 had another version)",
                       mp, len(core.uploads.conflicts))
        yield _counter("delvefs_mount_failed_writes", "writes and truncates of files being written "
                       "that the cache disk refused (ENOSPC, EDQUOT, EIO, ...)", mp,
                       core.written.failed_writes)
        yield _counter("delvefs_mount_failed_write_drops", "files not uploaded because a write "
                       "into them failed: their local changes dropped", mp,
                       core.written.dropped_files)

    def _s3(self):
        """The S3 requests the mount made, by operation (``S3Store.requests``)."""
        store, mp = getattr(self.core, "store", None), self.mountpoint
        for name, doc, counts in (
                ("delvefs_mount_s3_requests", "requests the mount sent to S3, by operation "
                 "(PutObject, HeadObject, GetObject, DeleteObjects, ...; the S3 client's own "
                 "retries of one not counted)", getattr(store, "requests", None)),
                ("delvefs_mount_s3_errors", "of those, the ones that failed",
                 getattr(store, "errors", None))):
            c = CounterMetricFamily(name, doc, labels=["mountpoint", "request"])
            for operation, n in sorted((counts or {}).items()):
                c.add_metric([mp, operation], n)
            yield c

    def _passthrough(self):
        """FUSE passthrough (``delvefs status`` shows the same): on or off, and its opens."""
        pt, mp = passthrough_report(self.core), self.mountpoint
        yield _gauge("delvefs_mount_passthrough", "1 when the kernel serves cached files' bytes "
                     "itself (FUSE passthrough), 0 when every read and write comes to the mount",
                     mp, 1 if pt["state"] == "on" else 0)
        yield _counter("delvefs_mount_passthrough_opens", "opens the kernel served through "
                       "passthrough (reads of whole cached copies, and writes with passthrough=rw)",
                       mp, pt["opens"])
        yield _gauge("delvefs_mount_passthrough_open_files", "files open through passthrough now",
                     mp, pt["open_files"])

    def _views(self):
        labels = ["mountpoint", "view", "bucket"]
        age = GaugeMetricFamily("delvefs_mount_view_age_seconds",
                                "seconds since the view's listing was last known current (refreshed "
                                "when used after its ttl); absent until first listed", labels=labels)
        stale = GaugeMetricFamily("delvefs_mount_view_stale",
                                  "1 while the view is served from its last listing because the "
                                  "handler does not answer", labels=labels)
        for v in views_report(self.core):
            values = [self.mountpoint, v["name"], v["bucket"]]
            if v["refreshed_ago"] is not None:
                age.add_metric(values, v["refreshed_ago"])
            stale.add_metric(values, 1 if v["stale"] else 0)
        yield age
        yield stale


def _timings(t: Timings, mountpoint: str, label: str, name: str, doc: str, errors_name: str,
             errors_doc: str):
    times = histogram.family(name, doc, ["mountpoint", label])
    errors = CounterMetricFamily(errors_name, errors_doc, labels=["mountpoint", label])
    for kind, h in sorted(t.times.items()):
        histogram.add(times, [mountpoint, kind], h)
        errors.add_metric([mountpoint, kind], t.failures[kind])
    yield times
    yield errors


def _counter(name: str, doc: str, mountpoint: str, value) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["mountpoint"])
    c.add_metric([mountpoint], value)
    return c


def _gauge(name: str, doc: str, mountpoint: str, value) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["mountpoint"])
    g.add_metric([mountpoint], value)
    return g


# ----------------------------------------------------------------- exporting

class Exporter:
    """The exports ``settings`` ask for, of ``metrics``: :meth:`open` binds the address
    and writes the file once (before the file system is mounted: a busy port or an
    unwritable directory fails the mount), :meth:`run` serves them (a task of the
    mount's nursery), :meth:`close` removes the file."""

    def __init__(self, metrics: MountMetrics, settings):
        self.metrics = metrics
        self.address = settings.metrics_addr
        self.textfile = settings.metrics_textfile
        self.interval = settings.metrics_interval
        self.listeners: list = []
        self.written = 0  # textfile writes (tests)

    async def open(self) -> None:
        if self.address is not None:
            host, port = self.address
            try:
                self.listeners = await trio.open_tcp_listeners(port, host=host or None)
            except OSError as exc:
                raise MountError(f"metrics address {host}:{port}: {exc.strerror or exc}") from None
        if self.textfile is not None:
            try:
                await self.write()
            except OSError as exc:
                raise MountError(f"metrics file {self.textfile}: {exc.strerror or exc}") from None

    @property
    def port(self) -> int | None:
        """The port served (the one the system chose for port 0)."""
        return self.listeners[0].socket.getsockname()[1] if self.listeners else None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            if self.listeners:
                nursery.start_soon(trio.serve_listeners, self._answer, self.listeners)
            if self.textfile is not None:
                nursery.start_soon(self._keep_writing)

    def close(self) -> None:
        for listener in self.listeners:
            listener.socket.close()
        if self.textfile is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.textfile)

    # the textfile

    async def write(self) -> None:
        await trio.to_thread.run_sync(write_atomically, self.textfile, self.metrics.render())
        self.written += 1

    async def _keep_writing(self) -> None:
        failing = False
        while True:
            await trio.sleep(self.interval)
            try:
                await self.write()
            except OSError as exc:
                if not failing:  # once per outage
                    log.warning("metrics file %s: %s", self.textfile, exc)
                failing = True
            else:
                failing = False

    # HTTP: GET /metrics, one request per connection

    async def _answer(self, stream) -> None:
        try:
            with trio.move_on_after(10):
                head = await _read_head(stream)
                if head is not None:
                    await stream.send_all(self._response(head))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the scraper went away
        except Exception:  # noqa: BLE001 — a bad request never stops the mount
            log.exception("metrics request")
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()

    def _response(self, head: bytes) -> bytes:
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _http(405, b"text/plain", b"GET /metrics\n")
        if path == b"/metrics":
            body = self.metrics.render()
            return _http(200, CONTENT_TYPE_LATEST.encode(), body, head_only=method == b"HEAD")
        if path == b"/":
            return _http(200, b"text/html", b'<a href="/metrics">metrics</a>\n')
        return _http(404, b"text/plain", b"not found: GET /metrics\n")


MAX_HEAD = 8192
_REASONS = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed"}


async def _read_head(stream) -> bytes | None:
    """The request's head (request line and headers); None when the client sent none."""
    data = b""
    while b"\r\n\r\n" not in data and b"\n\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_HEAD:
            return None
    return data


def _http(status: int, content_type: bytes, body: bytes, head_only: bool = False) -> bytes:
    head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % (status, _REASONS[status], content_type, len(body)))
    return head if head_only else head + body


def write_atomically(path: str, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part (a worker thread). The
    temporary name does not end in ``.prom``: node_exporter reads only those."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def open_exporter(settings, core, requests: Timings | None) -> Exporter | None:
    """The mount's exporter when ``settings`` ask for one (opened), else None."""
    if not settings.metrics:
        return None
    from delvefs import __version__
    handler = core.handler
    metrics = MountMetrics(core, settings.mountpoint, requests, handler.round_trips,
                           handler=handler.base_url, version=__version__)
    exporter = Exporter(metrics, settings)
    await exporter.open()
    return exporter

