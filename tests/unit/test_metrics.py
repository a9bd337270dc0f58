"""The mount's metrics without a mount: histograms as Prometheus counts them, the
registry's text (as the handler's, parsed back by prometheus_client), the HTTP answer and
the textfile, the options that ask for them, the adapter's request timing and the
handler's shard."""
from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from delvefs.client.mount import metrics as mm
from delvefs.client.mount.options import OptionError, as_flags, parse_address, read
from delvefs.client.mount.settings import MountSettings
from delvefs.shared.histogram import Histogram, Timings, cumulative


def samples(text: bytes | str) -> dict[tuple, float]:
    """{(sample name, frozenset of labels): value} of a Prometheus text."""
    text = text.decode() if isinstance(text, bytes) else text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(found: dict, name: str, **labels) -> float:
    return found[(name, frozenset(labels.items()))]


# ----------------------------------------------------------------- histograms

def test_a_histogram_counts_each_value_in_the_first_bucket_that_holds_it():
    h = Histogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.002, 0.05, 0.5, 7):
        h.observe(v)
    assert h.counts == [2, 1, 1, 2]  # 0.001 is "le 0.001", as Prometheus counts
    assert h.count == 6 and h.total == pytest.approx(7.5535)
    assert cumulative(h.bounds, h.counts) == [("0.001", 2), ("0.01", 3), ("0.1", 4), ("+Inf", 6)]


def test_timings_keep_one_histogram_and_a_failure_count_per_kind():
    t = Timings((0.01, 1))
    t.observe("read", 0.002)
    t.observe("read", 0.5, failed=True)
    t.observe("lookup", 3.0)
    assert t.times["read"].counts == [1, 1, 0] and t.failures == {"read": 1, "lookup": 0}
    assert t.times["lookup"].counts == [0, 0, 1]


# ----------------------------------------------------------------- the registry's text

class FakeCache(SimpleNamespace):
    pass


def fake_core(**over):
    cache = FakeCache(hits=5, misses=2, hit_bytes=5000, miss_bytes=8192, got=1 << 20, gets=3,
                      evictions=4, forced_evictions=3, bytes=4096, limit=1 << 30)
    written = SimpleNamespace(entries=lambda: [SimpleNamespace(size=10), SimpleNamespace(size=32)],
                              failed_writes=3, dropped_files=1)
    report = [{"state": "pending"}, {"state": "failed"}, {"state": "failed"}, {"state": "conflict"}]
    view_state = SimpleNamespace(name="data", bucket="b1", root="data", ttl=2.0, unshown=(),
                                 listing=SimpleNamespace(id="v1", listed=True, version=3,
                                                         fresh_at=0.0, refreshing=None,
                                                         stale="the handler does not answer",
                                                         stale_since=1.0))
    never = SimpleNamespace(name="raw", bucket="b2", root="raw", ttl=2.0, unshown=(),
                            listing=SimpleNamespace(id=None, listed=False, version=0,
                                                    fresh_at=float("-inf"), refreshing=None,
                                                    stale=None, stale_since=None))
    core = SimpleNamespace(cache=cache, written=written, upload_report=lambda: report,
                           uploads=SimpleNamespace(count=9, conflicts=[{}]),
                           views=[view_state, never])
    for k, v in over.items():
        setattr(core, k, v)
    return core


def rendered(core=None) -> dict:
    requests = Timings(mm.REQUEST_BOUNDS)
    requests.observe("read", 0.00003)
    requests.observe("read", 0.002)
    requests.observe("lookup", 0.0001, failed=True)
    trips = Timings((0.01, 1))
    trips.observe("changes", 0.003)
    metrics = mm.MountMetrics(core or fake_core(), "/mnt/x", requests, trips,
                              handler="http://h:8731", version="9.9")

    async def render():  # (views' ages are on the trio clock)
        return metrics.render()
    return samples(trio.run(render))


def test_the_mount_exports_requests_cache_uploads_handler_and_views():
    s = rendered()
    mp = {"mountpoint": "/mnt/x"}
    assert value(s, "delvefs_mount_info", **mp, handler="http://h:8731", version="9.9") == 1
    assert value(s, "delvefs_mount_fuse_request_seconds_count", **mp, op="read") == 2
    assert value(s, "delvefs_mount_fuse_request_seconds_bucket", **mp, op="read", le="5e-05") == 1
    assert value(s, "delvefs_mount_fuse_request_seconds_bucket", **mp, op="read", le="+Inf") == 2
    assert value(s, "delvefs_mount_fuse_request_seconds_sum", **mp, op="read") == pytest.approx(0.00203)
    assert value(s, "delvefs_mount_fuse_errors_total", **mp, op="lookup") == 1
    assert value(s, "delvefs_mount_fuse_errors_total", **mp, op="read") == 0
    assert value(s, "delvefs_mount_cache_reads_total", **mp, result="hit") == 5
    assert value(s, "delvefs_mount_cache_reads_total", **mp, result="miss") == 2
    assert value(s, "delvefs_mount_cache_read_bytes_total", **mp, result="miss") == 8192
    assert value(s, "delvefs_mount_cache_fetched_bytes_total", **mp) == 1 << 20
    assert value(s, "delvefs_mount_cache_gets_total", **mp) == 3
    assert value(s, "delvefs_mount_cache_evictions_total", **mp) == 4
    assert value(s, "delvefs_mount_cache_forced_evictions_total", **mp) == 3
    assert value(s, "delvefs_mount_cache_bytes", **mp) == 4096
    assert value(s, "delvefs_mount_cache_limit_bytes", **mp) == 1 << 30
    assert value(s, "delvefs_mount_dirty_bytes", **mp) == 42
    for state, n in (("pending", 1), ("uploading", 0), ("failed", 2), ("conflict", 1)):
        assert value(s, "delvefs_mount_uploads", **mp, state=state) == n
    assert value(s, "delvefs_mount_uploads_completed_total", **mp) == 9
    assert value(s, "delvefs_mount_conflicts_total", **mp) == 1
    assert value(s, "delvefs_mount_failed_writes_total", **mp) == 3
    assert value(s, "delvefs_mount_failed_write_drops_total", **mp) == 1
    assert value(s, "delvefs_mount_passthrough", **mp) == 0  # a core without the FUSE adapter
    assert value(s, "delvefs_mount_passthrough_opens_total", **mp) == 0
    assert value(s, "delvefs_mount_handler_request_seconds_count", **mp, request="changes") == 1
    assert value(s, "delvefs_mount_handler_errors_total", **mp, request="changes") == 0
    assert value(s, "delvefs_mount_view_stale", **mp, view="data", bucket="b1") == 1
    assert value(s, "delvefs_mount_view_stale", **mp, view="raw", bucket="b2") == 0
    assert value(s, "delvefs_mount_view_age_seconds", **mp, view="data", bucket="b1") >= 0
    # a view never listed has no age
    assert ("delvefs_mount_view_age_seconds", frozenset({**mp, "view": "raw", "bucket": "b2"}.items())) not in s


def test_a_cache_without_bound_exports_no_limit():
    core = fake_core()
    core.cache.limit = None
    assert not [k for k in rendered(core) if k[0] == "delvefs_mount_cache_limit_bytes"]


# ----------------------------------------------------------------- exporting

def test_the_mount_counts_its_s3_requests_by_operation():
    import collections
    store = SimpleNamespace(requests=collections.Counter(PutObject=3, DeleteObjects=1),
                            errors=collections.Counter(PutObject=1))
    s = rendered(fake_core(store=store))
    mp = {"mountpoint": "/mnt/x"}
    assert value(s, "delvefs_mount_s3_requests_total", **mp, request="PutObject") == 3
    assert value(s, "delvefs_mount_s3_requests_total", **mp, request="DeleteObjects") == 1
    assert value(s, "delvefs_mount_s3_errors_total", **mp, request="PutObject") == 1


def test_the_store_names_each_request_it_sends():
    from delvefs.client.mount.s3async import S3Store
    from delvefs.client.mount.errors import StoreError

    def head_object(client, bucket, key):
        return {"etag": "e"}

    def put_file(client, *a, **kw):
        raise OSError("refused")
    store = S3Store(object())

    async def main():
        await store._call("HEAD b/k", head_object, None, "b", "k")
        with pytest.raises(StoreError):
            await store._call("PUT b/k", put_file, None, "b", "k")
    trio.run(main)
    assert store.requests == {"HeadObject": 1, "PutObject": 1} and store.errors == {"PutObject": 1}


def exporter(tmp_path, **settings) -> mm.Exporter:
    metrics = SimpleNamespace(render=lambda: b"# a metric\nx 1\n")
    return mm.Exporter(metrics, MountSettings.defaults(**settings))


async def http_get(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        await stream.send_eof()  # (the "silent" client: nothing more comes)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


def test_the_http_server_answers_get_metrics_and_nothing_else(tmp_path):
    ex = exporter(tmp_path, metrics_addr=("127.0.0.1", 0))
    answers = {}

    async def main():
        await ex.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ex.run)
            for path in ("/metrics", "/metrics?x=1", "/nothing"):
                answers[path] = await http_get(ex.port, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
            answers["POST"] = await http_get(ex.port, b"POST /metrics HTTP/1.0\r\n\r\n")
            answers["HEAD"] = await http_get(ex.port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
            answers["silent"] = await http_get(ex.port, b"")
            nursery.cancel_scope.cancel()
        ex.close()
    trio.run(main)
    head, _, body = answers["/metrics"].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Content-Type: text/plain; version=" in head
    assert body == b"# a metric\nx 1\n" and answers["/metrics?x=1"].endswith(body)
    assert answers["/nothing"].startswith(b"HTTP/1.1 404 ")
    assert answers["POST"].startswith(b"HTTP/1.1 405 ")
    assert answers["HEAD"].startswith(b"HTTP/1.1 200 ") and answers["HEAD"].endswith(b"\r\n\r\n")
    assert answers["silent"] == b""


def test_a_busy_address_fails_the_mount(tmp_path):
    from delvefs.client.mount.mountpoints import MountError

    async def main():
        first = exporter(tmp_path, metrics_addr=("127.0.0.1", 0))
        await first.open()
        try:
            second = exporter(tmp_path, metrics_addr=("127.0.0.1", first.port))
            with pytest.raises(MountError, match="metrics address 127.0.0.1:"):
                await second.open()
        finally:
            first.close()
    trio.run(main)


def test_the_textfile_is_written_at_once_then_every_interval_and_removed_at_the_end(tmp_path):
    path = tmp_path / "delvefs.prom"
    ex = exporter(tmp_path, metrics_textfile=str(path), metrics_interval=0.01)

    async def main():
        await ex.open()
        assert path.read_bytes() == b"# a metric\nx 1\n"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ex.run)
            while ex.written < 3:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    trio.run(main)
    assert sorted(os.listdir(tmp_path)) == ["delvefs.prom"]  # no temporary file left
    ex.close()
    assert not path.exists()


def test_an_unwritable_textfile_fails_the_mount(tmp_path):
    from delvefs.client.mount.mountpoints import MountError
    ex = exporter(tmp_path, metrics_textfile=str(tmp_path / "missing" / "x.prom"))
    with pytest.raises(MountError, match="metrics file"):
        trio.run(ex.open)


def test_write_atomically_leaves_the_old_file_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "m.prom"
    mm.write_atomically(str(path), b"old\n")

    def refuse(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(mm.os, "replace", refuse)
    with pytest.raises(OSError):
        mm.write_atomically(str(path), b"new\n")
    assert path.read_bytes() == b"old\n" and sorted(os.listdir(tmp_path)) == ["m.prom"]


# ----------------------------------------------------------------- options

@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:9101", ("127.0.0.1", 9101)), (":9101", ("", 9101)),
    ("localhost:80", ("localhost", 80)), ("[::1]:9101", ("::1", 9101))])
def test_metrics_addresses(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["9101", "host:", "host:port", "h:0", "h:70000", "::1:9101"])
def test_refused_metrics_addresses(text):
    with pytest.raises(OptionError, match="HOST:PORT"):
        parse_address(text)


def test_metrics_options_by_flag_and_by_o_reach_the_daemon_again():
    args = SimpleNamespace(options=["metrics_addr=[::1]:9101,metrics_textfile=/var/lib/m.prom,"
                                    "metrics_interval=2.5"])
    values = read(args)
    assert values["metrics_addr"] == ("::1", 9101)
    assert values["metrics_textfile"] == "/var/lib/m.prom" and values["metrics_interval"] == 2.5
    settings = MountSettings.defaults(**values)
    assert settings.metrics
    flags = as_flags(settings)
    assert flags[flags.index("--metrics-addr") + 1] == "[::1]:9101"
    assert flags[flags.index("--metrics-interval") + 1] == "2.5"
    assert not MountSettings.defaults().metrics
    with pytest.raises(OptionError, match="seconds above 0"):
        read(SimpleNamespace(options=["metrics_interval=0"]))


# ----------------------------------------------------------------- the adapter's timing

def test_the_adapter_times_each_request_by_operation_and_counts_failures():
    pytest.importorskip("pyfuse3")
    import pyfuse3

    from delvefs.client.mount.errors import FsError
    from delvefs.client.mount.fuse_adapter import Adapter

    class Core(SimpleNamespace):
        async def fallocate(self, *args):
            if args[2]:
                raise FsError(errno.EOPNOTSUPP)

    times = mm.request_times()
    adapter = Adapter(Core(writeback_cache=False), request_times=times)
    trio.run(adapter.fallocate, 7, 1, 0, 0, 10)
    with pytest.raises(pyfuse3.FUSEError):
        trio.run(adapter.fallocate, 7, 1, 1, 0, 10)
    assert times.times["fallocate"].count == 2 and times.failures["fallocate"] == 1
    # off: nothing is timed
    trio.run(Adapter(Core(writeback_cache=False)).fallocate, 7, 1, 0, 0, 10)
    assert times.times["fallocate"].count == 2


# ----------------------------------------------------------------- the handler

def test_the_handlers_metrics_name_its_shard_and_keep_their_latency_histogram():
    from prometheus_client import generate_latest

    from eventhandler.metrics import Metrics
    m = Metrics(shard="b")
    m.latency.observe_many([0.0004, 0.003, 50])
    s = samples(generate_latest(m.registry))
    assert value(s, "delvefs_handler_info", shard="b") == 1
    assert value(s, "delvefs_event_latency_seconds_bucket", le="0.0005") == 1
    assert value(s, "delvefs_event_latency_seconds_bucket", le="0.005") == 2
    assert value(s, "delvefs_event_latency_seconds_count") == 3
    assert value(samples(generate_latest(Metrics().registry)), "delvefs_handler_info", shard="0") == 1


# ----------------------------------------------------------------- the dashboard

def test_the_dashboard_asks_only_for_metrics_that_exist():
    import json
    import re
    from pathlib import Path

    from prometheus_client import generate_latest

    from eventhandler.metrics import Metrics
    board = json.loads((Path(__file__).resolve().parents[2] / "contrib/grafana/delvefs.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert exprs
    known = {name for name, _ in rendered()} | {name for name, _ in samples(generate_latest(Metrics().registry))}
    used = {name for e in exprs for name in re.findall(r"\bdelvefs_[a-z_]+", e)}
    assert used - known == set()
    for e in exprs:
        assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), e
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {re.sub(r"\W", "", m) for e in exprs for m in re.findall(r"\$[a-z]+\b", e)} - {"__rate_interval"} <= variables
