"""Millions of objects on one handler: DB_MATCH against a bare consumer as the state grows,
LevelDB bytes per object, restart time, listings of a small and a 1,000,000-file view, and
the memory of a mount that lists the big one.

    .venv/bin/python -m benchmarks.bench_handler_10m [--objects 1000000,10000000]
                                                     [--chunk 1000000] [--save NAME]

Real RabbitMQ, MinIO (an empty bucket: no real objects) and ``delvefs eventhandler``
(benchmarks.bench_tree's ``services``). Registered before any event: the 100 DB_MATCH views
of bench_handler.py (each matches every object here), ``hundred`` (``obj00000*``: 100
objects) and ``million`` (``obj0*``: objects 0-999,999). The handler's LevelDB is filled by
MinIO-format ``ObjectCreated`` events of new keys ``obj0000000``, ``obj0000001``, ...
published to the exchange in chunks of ``--chunk`` while the handler is stopped; two
queues get every message: the handler's, and the bare pika consumer's
(bench_handler_bare.py), which drains its copy first. Each chunk's rates (from the first
message to the last) give DB_MATCH handler / bare as the state grows. Only the chunk that
reaches each size of ``--objects`` is timed so (``--baseline-every-chunk``: every chunk);
the chunks between go through the running handler, untimed.

At each size of ``--objects`` (cumulative: the first is filled, measured, then the next):
the state directory's bytes per object (as LevelDB left it, no forced compaction); the
restart time (SIGTERM, then a new process until it consumes); the listing of ``hundred``
through the API (the mount's client, ``SyncHandlerClient.list_all``, msgpack, 30 times);
the first listing of ``million`` after the restart, with the mount's page size; and a real
FUSE mount of ``million`` (bench_mount_memory's ``mount_and_list``): its ``ls -l`` times and
RSS.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

import msgpack
import pika

from delvefs.client.mount.settings import MountSettings
from delvefs.shared.s3 import presigned_list_url
from eventhandler.amqp import declare

from .bench_handler import BARE_QUEUE, run_bare, run_handler
from .bench_handler_profile import bench_views, messages
from .bench_mount import RESULTS, log
from .bench_mount_memory import mount_and_list
from .bench_tree import BUCKET, services
from .broker import publish, wait_depth

BASE = Path(os.environ.get("DELVEFS_BENCH_10M_DIR", Path.home() / ".cache/delvefs/bench-10m"))
PUBLISH_BATCH = 100_000  # messages built in memory at once
HUNDRED, MILLION = "obj00000*", "obj0*"


def state_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fill(amqp_url: str, handler, start: int, n: int, objects: int) -> dict:
    """Events start .. start+n (new objects) through both queues; both drain them, timed."""
    handler.stop()
    t = time.perf_counter()
    for i in range(start, start + n, PUBLISH_BATCH):
        publish(amqp_url, messages("DB_MATCH", min(PUBLISH_BATCH, start + n - i), objects, BUCKET, start=i))
    published = time.perf_counter() - t
    wait_depth(amqp_url, BARE_QUEUE, n, timeout=600)
    wait_depth(amqp_url, handler.queue, n, timeout=600)
    bare = run_bare(amqp_url, n)
    hand = run_handler(handler, n)  # started on its state, stopped when done
    row = {"from": start, "events": n, "publish_rate": n / published, "bare": bare["rate"],
           "handler": hand["rate"], "ratio": hand["rate"] / bare["rate"],
           # CPU seconds per 100,000 events: what the rates come to when the cores are shared
           "bare_cpu_100k": bare["cpu_s"] / n * 100_000, "handler_cpu_100k": hand["cpu_s"] / n * 100_000,
           "load": os.getloadavg()}
    log(f"# chunk {start:,}+{n:,}: {json.dumps(row)}")
    return row


def fill_running(amqp_url: str, handler, start: int, n: int, objects: int, baseline: bool) -> None:
    """Events start .. start+n into the running handler (no baseline, nothing timed)."""
    before = handler.metric("delvefs_events_processed_total")
    for i in range(start, start + n, PUBLISH_BATCH):
        publish(amqp_url, messages("DB_MATCH", min(PUBLISH_BATCH, start + n - i), objects, BUCKET, start=i))
    while handler.metric("delvefs_events_processed_total") - before < n:
        time.sleep(0.5)
    if baseline:  # the bare consumer's copies of an untimed chunk: not for the next timed one
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        conn.channel().queue_purge(BARE_QUEUE)
        conn.close()
    log(f"# filled {start + n:,} objects")


def measure(handler, ids: dict, s3, objects: int, work: Path, env: dict, repeat: int) -> dict:
    """The figures at ``objects`` objects (the handler left running)."""
    handler.stop()
    t = time.perf_counter()
    handler.start(timeout=600)
    restart_s = time.perf_counter() - t
    # grants live in the handler's memory: a fresh proof, as a mount renews its own
    handler.api.prove({BUCKET: presigned_list_url(s3, BUCKET)})
    page = MountSettings().page_size
    t = time.perf_counter()
    _version, listed = handler.api.list_all(ids["million"], limit=page)
    million_s = time.perf_counter() - t
    million = len(listed)
    del listed
    handler.api.list_all(ids["hundred"])  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        _version, small = handler.api.list_all(ids["hundred"])
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    # the same listing through the client's bare HTTP connection (one GET, msgpack decoded):
    # what the mount's client code adds shows as the difference
    http, bare = handler.api.http, []
    for _ in range(repeat):
        t = time.perf_counter()
        resp = http.get(f"/v1/views/{ids['hundred']}/objects", params={"limit": 5000},
                        headers={"Accept": "application/msgpack"})
        resp.raise_for_status()
        assert len(msgpack.unpackb(resp.content)["objects"]) == len(small)
        bare.append((time.perf_counter() - t) * 1000)
    bare.sort()
    # and through the standard library's HTTP/1.1 client (keep-alive, ~0.1 ms of Python a
    # request where httpx spends ~1 ms on this machine): the handler's own share
    raw = raw_listing_ms(handler.url, handler.token, f"/v1/views/{ids['hundred']}/objects?limit=5000",
                         len(small), repeat)
    health = healthz_ms(handler, repeat)
    size = state_bytes(handler.state_dir)
    mount = mount_and_list(work / f"mount-{objects}", env,
                           f"million:\n  bucket: {BUCKET}\n  object: \"{MILLION}\"\n  ttl: 3600s\n",
                           "million", handler.url, expect=million)
    row = {"objects": objects, "state_bytes": size, "bytes_per_object": size / objects, "restart_s": restart_s,
           "hundred": len(small), "hundred_median_ms": statistics.median(times),
           "hundred_p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))],
           "hundred_bare_median_ms": statistics.median(bare), "hundred_bare_p90_ms": percentile(bare, 0.9),
           "hundred_raw_median_ms": raw, **health,
           "million": million, "million_first_list_s": million_s, "page_size": page, "mount": mount,
           "load": os.getloadavg()}
    log(f"# at {objects:,} objects: {json.dumps(row)}")
    return row


def percentile(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def healthz_ms(handler, repeat: int) -> dict:
    """``GET /healthz`` (a small JSON answer) through the client (``health()``) and by
    http.client: what a request costs the client apart from the handler's work."""
    handler.api.health()  # warm-up: the connection opened
    client = []
    for _ in range(repeat):
        t = time.perf_counter()
        handler.api.health()
        client.append((time.perf_counter() - t) * 1000)
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(handler.url).netloc)
    raw = []
    try:
        for _ in range(repeat + 1):  # the first opens the connection
            t = time.perf_counter()
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            json.loads(resp.read())
            raw.append((time.perf_counter() - t) * 1000)
    finally:
        conn.close()
    return {"healthz_client_median_ms": statistics.median(client), "healthz_client_p90_ms": percentile(client, 0.9),
            "healthz_raw_median_ms": statistics.median(raw[1:]), "healthz_raw_p90_ms": percentile(raw[1:], 0.9)}


def raw_listing_ms(url: str, token: str | None, path: str, expect: int, repeat: int) -> float:
    """Median milliseconds of ``repeat`` GETs of ``path`` by http.client (msgpack decoded)."""
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc)
    headers = {"Accept": "application/msgpack"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    times = []
    try:
        for _ in range(repeat + 1):  # the first opens the connection
            t = time.perf_counter()
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.status == 200, (resp.status, body[:200])
            assert len(msgpack.unpackb(body)["objects"]) == expect
            times.append((time.perf_counter() - t) * 1000)
    finally:
        conn.close()
    return statistics.median(times[1:])


def tables(chunks: list[dict], points: list[dict]) -> str:
    out = ["| events (objects before → after) | bare pika (events/s) | handler (events/s) | handler / bare "
           "| target | CPU s per 100,000 events: bare / handler | load average |",
           "|---|---:|---:|---:|---|---|---|"]
    for c in chunks:
        cpu = f"{c['bare_cpu_100k']:.1f} / {c['handler_cpu_100k']:.1f}" if "bare_cpu_100k" in c else "—"
        out.append(f"| {c['from']:,} → {c['from'] + c['events']:,} | {c['bare']:,.0f} | {c['handler']:,.0f} "
                   f"| {c['ratio']:.2f} | ≥ 0.5 | {cpu} | {c['load'][0]:.1f} |")
    out += ["", "| objects | LevelDB (state dir) | bytes per object | restart | 100-file view, median / p90 "
            "| (bare GET + decode: httpx / http.client) | first listing of the 1,000,000-file view (API) | mount: `ls -l` of it, first / again "
            "| mount RSS, idle → listed | load average |",
            "|---:|---:|---:|---:|---|---:|---:|---|---|---|"]
    for p in points:
        m = p["mount"]
        out.append(f"| {p['objects']:,} | {p['state_bytes'] / 2**20:,.0f} MiB | {p['bytes_per_object']:.0f} "
                   f"| {p['restart_s']:.1f} s | {p['hundred_median_ms']:.2f} / {p['hundred_p90_ms']:.2f} ms "
                   f"| {p.get('hundred_bare_median_ms', float('nan')):.2f} / "
                   f"{p.get('hundred_raw_median_ms', float('nan')):.2f} ms "
                   f"| {p['million_first_list_s']:.1f} s ({p['million']:,} objects) "
                   f"| {m['ls_l_0_s']:.1f} s / {m['ls_l_1_s']:.1f} s "
                   f"| {m['rss_mounted_mib']:.0f} → {m['rss_listed_mib']:.0f} MiB | {p['load'][0]:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", default="1000000,10000000", help="comma-separated sizes, increasing")
    ap.add_argument("--chunk", type=int, default=1_000_000, help="events published (and drained) at once")
    ap.add_argument("--repeat", type=int, default=30, help="listings of the 100-file view")
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="fill through the running handler only: no bare consumer, no DB_MATCH rates")
    ap.add_argument("--baseline-every-chunk", action="store_true",
                    help="time every chunk against the bare consumer (default: only the chunk that "
                         "reaches each size of --objects; the others go through the running handler)")
    ap.add_argument("--save", metavar="NAME", help="keep the results as results/handler-10m-NAME.json")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.objects.split(",")]
    chunks, points = [], []
    out = RESULTS / f"handler-10m-{args.save or 'last'}.json"
    RESULTS.mkdir(exist_ok=True)
    with services("bench-10m-", BASE) as (work, env, s3, handler):
        amqp_url = os.environ["DELVEFS_AMQP_URL"]
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        ch = conn.channel()
        if args.baseline:
            declare(ch, "delvefs", BARE_QUEUE, BARE_QUEUE + ".dead")
            ch.queue_purge(BARE_QUEUE)  # a copy of an earlier run's events
        conn.close()
        views = dict(bench_views(BUCKET))
        views.update(hundred={"bucket": BUCKET, "object": HUNDRED}, million={"bucket": BUCKET, "object": MILLION})
        r = handler.register(views, {BUCKET: presigned_list_url(s3, BUCKET)})
        r.raise_for_status()
        ids = {v["name"]: v["id"] for v in r.json()["views"]}
        while handler.api.health()["buckets"].get(BUCKET) != "ready":
            time.sleep(0.05)
        filled = 0
        try:
            for size in sizes:
                while filled < size:
                    n = min(args.chunk, size - filled)
                    if args.baseline and (args.baseline_every_chunk or filled + n in sizes):
                        chunks.append(fill(amqp_url, handler, filled, n, sizes[-1]))
                        handler.start(timeout=600)
                    else:
                        fill_running(amqp_url, handler, filled, n, sizes[-1], args.baseline)
                    filled += n
                points.append(measure(handler, ids, s3, size, work, env, args.repeat))
                out.write_text(json.dumps({"chunks": chunks, "points": points}, indent=2))
        finally:
            out.write_text(json.dumps({"chunks": chunks, "points": points}, indent=2))
            if args.baseline:
                conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
                conn.channel().queue_delete(BARE_QUEUE)
                conn.close()
    log(f"results: {out}")
    print(tables(chunks, points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
