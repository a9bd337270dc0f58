"""End-to-end benchmarks of the event handler (the paper's RAW / MATCH / DB_MATCH scenarios,
property rules on real tagged objects, event latency, first scan), each against a bare
baseline measured in the same run.

    .venv/bin/python benchmarks/bench_handler.py [--events 100000] [--objects 100000]
                                                 [--scan-objects 100000] [--latency-seconds 10]
                                                 [--skip-scan] [--repeat 1]
                                                 [--scenarios RAW,MATCH,DB_MATCH,TAGS,META]
                                                 [--prop-objects 20000]
                                                 [--shards 1,2,3]

TAGS / META: 100 views with a property rule each (``properties: {kind: "k*"}``; META:
``metadata: {kind: "k*"}``) on a bucket of --prop-objects real objects, created in MinIO
while the handler is stopped (TAGS: with the tag kind=k1 and no metadata, so each object's
tags must be fetched; META: with x-amz-meta-kind=k1, so none may be). MinIO's own events
fill both queues. The handler is timed until every object is in the views (for TAGS: after
its GetObjectTagging); the baselines are the bare consumer and, for TAGS, MinIO answering
GetObjectTagging for the same objects at the handler's concurrency (16 threads, boto3),
and in a second row through ``LeanClient`` (the handler's own client when its keys are static).
Tag requests are counted (``delvefs_tag_fetches_total``).

Real RabbitMQ and MinIO (delvefs.devtools.localservices), the real ``delvefs eventhandler`` process.
Throughput: N synthetic MinIO-format events are published to the ``delvefs`` exchange while
nobody consumes; two durable queues are bound to it (the handler's and the baseline's), so
both get identical messages. Then the bare pika consumer (bench_handler_bare.py) drains its
queue, and the handler (restarted on the same state) drains its own; both are timed from the
first message to the last one handled (the handler through its /metrics counters, polled
every 50 ms). Prints markdown tables (for docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pika

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_handler_profile import bench_views, messages  # noqa: E402
from benchmarks.bench_handler_shards import cpu_seconds  # noqa: E402
from benchmarks.broker import publish, wait_depth  # noqa: E402
from delvefs.devtools.localservices import LocalServices  # noqa: E402
from delvefs.shared.config import S3Settings  # noqa: E402
from delvefs.shared.s3 import (LeanClient, ensure_bucket, make_client, presigned_list_url,  # noqa: E402
                               wire_notifications)
from eventhandler.amqp import declare  # noqa: E402
from eventhandler.devtools import HandlerProcess  # noqa: E402
from eventhandler.events import make_message  # noqa: E402
from rulesets import View  # noqa: E402

HERE = Path(__file__).resolve().parent
BARE_QUEUE = "bench.bare"
HANDLER_QUEUE = "bench.handler"


def run_bare(url: str, n: int) -> dict:
    out = subprocess.run([sys.executable, str(HERE / "bench_handler_bare.py"), url, BARE_QUEUE, str(n)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def handled(h: HandlerProcess) -> float:
    text = httpx.get(h.url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("delvefs_events_processed_total ", "delvefs_events_dropped_total ",
                            "delvefs_events_dead_lettered_total ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_handler(h: HandlerProcess, n: int) -> dict:
    """Start the handler on its state, time the drain of n messages (and the CPU seconds
    its process spent on them), stop it."""
    h.start()
    t_first = c_first = None
    while True:
        c = handled(h)
        now = time.perf_counter()
        if t_first is None and c > 0:
            t_first, c_first, cpu_first = now, c, cpu_seconds(h.proc.pid)
        if c >= n:
            cpu = cpu_seconds(h.proc.pid) - cpu_first
            break
        time.sleep(0.05)
    text = httpx.get(h.url + "/metrics", timeout=5).text
    vals = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("delvefs_batch_size_")}
    h.stop()
    dt = now - t_first
    return {"count": n, "seconds": dt, "rate": (n - c_first) / dt if dt > 0 else float("inf"),
            "cpu_s": cpu * n / max(1, n - c_first),  # as if it had timed the first events too
            "batch": vals.get("delvefs_batch_size_sum", 0) / max(1, vals.get("delvefs_batch_size_count", 1))}


PROPERTY_RULES = {"TAGS": "properties", "META": "metadata"}
S3_WORKERS = 16  # the engine's delvefs-s3 pool


def metric(h: HandlerProcess, name: str) -> float:
    text = httpx.get(h.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def property_views(bucket: str, rule: str, n: int = 100) -> list[tuple[str, dict]]:
    """n distinct views with a property rule each, all matching objects of size >= n."""
    return [(f"p{i}", View.from_filter_spec(f"p{i}", {"bucket": bucket, "object": "*", "size": [i, None],
                                                     rule: {"kind": ["k*"]}}).filter_spec()) for i in range(n)]


def property_scenario(svc, h: HandlerProcess, s3, scenario: str, n: int) -> dict:
    """TAGS or META (see the module's docstring): the handler's rate, the bare consumer's,
    and for TAGS MinIO's GetObjectTagging rate, on n real objects."""
    bucket = f"props-{scenario.lower()}-{time.time_ns() % 10**9}"
    ensure_bucket(s3, bucket)
    wire_notifications(s3, bucket, svc.minio.notify_arn)
    h.start()
    r = h.register(dict(property_views(bucket, PROPERTY_RULES[scenario])),
                   {bucket: presigned_list_url(s3, bucket)})
    r.raise_for_status()
    vid = r.json()["views"][0]["id"]
    while httpx.get(h.url + "/healthz").json()["buckets"].get(bucket) != "ready":
        time.sleep(0.02)
    h.stop()
    keys = [f"d{i % 100:02d}/obj{i:07d}" for i in range(n)]
    extra = {"Tagging": "kind=k1"} if scenario == "TAGS" else {"Metadata": {"kind": "k1"}}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=b"x" * 100, **extra), keys))
    print(f"# {scenario}: created {n} objects in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    wait_depth(svc.rabbit.url, BARE_QUEUE, n)
    wait_depth(svc.rabbit.url, HANDLER_QUEUE, n)
    bare = run_bare(svc.rabbit.url, n)
    client = make_client(max_pool=32)
    # the handler asks with LeanClient (static keys): the same requests without botocore's CPU
    lean = LeanClient(S3Settings.from_env())

    def minio_tagging(c=client) -> float:  # MinIO's own answer rate at the handler's concurrency
        t0 = time.perf_counter()
        with ThreadPoolExecutor(S3_WORKERS) as pool:
            list(pool.map(lambda k: c.get_object_tagging(Bucket=bucket, Key=k), keys))
        return n / (time.perf_counter() - t0)
    before = (minio_tagging(), minio_tagging(lean)) if scenario == "TAGS" else None
    h.start()  # a new process: its counters start at 0
    t_first = c_first = None
    deadline = time.monotonic() + 600
    while True:  # every event applied and, for TAGS, every tag fetch asked for (one /metrics read)
        text = httpx.get(h.url + "/metrics", timeout=5).text
        values = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("delvefs_") and " " in line}
        c = sum(values.get(f"delvefs_events_{k}_total", 0) for k in ("processed", "dropped", "dead_lettered"))
        fetches = values.get("delvefs_tag_fetches_total", 0)
        now = time.perf_counter()
        if t_first is None and c > 0:
            t_first, c_first = now, c
        if c >= n and (scenario == "META" or fetches >= n):
            done = now
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{scenario}: {c} of {n} events handled, {fetches:.0f} tag requests")
        time.sleep(0.25 if scenario == "TAGS" else 0.05)  # TAGS runs long: poll it lightly
    # ... and their answers applied: every object in the views (META: it is, once applied)
    while (have := len(h.keys(vid))) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{scenario}: {have} of {n} objects in the view")
        time.sleep(0.05)
        done = time.perf_counter()
    fetches = metric(h, "delvefs_tag_fetches_total")
    h.stop()
    out = {"scenario": scenario, "objects": n, "bare": bare["rate"],
           "handler": (n - c_first) / (done - t_first), "tag_requests": fetches}
    if scenario == "TAGS":  # measured before and after the handler; the faster one counts
        out["minio_tagging"] = max(before[0], minio_tagging())
        out["minio_tagging_lean"] = max(before[1], minio_tagging(lean))
    lean.close()
    return out


def print_properties(rows) -> None:
    print("\n### Property rules: tags only when they can change an answer\n")
    print("100 views, each with a property rule `kind: \"k*\"`, over real objects created in MinIO "
          "(MinIO's own events, pre-filled queues).\n")
    print("| scenario | objects | tag requests | bare pika (events/s) | MinIO GetObjectTagging, 16 threads (/s) "
          "| handler (objects/s, in the views) | handler / MinIO | handler / bare | target |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        if row["scenario"] == "TAGS":
            print(f"| `properties`, objects tagged kind=k1 (each object's tags fetched) | {row['objects']} "
                  f"| {row['tag_requests']:.0f} | {row['bare']:.0f} | {row['minio_tagging']:.0f} "
                  f"| {row['handler']:.0f} | {row['handler'] / row['minio_tagging']:.2f} "
                  f"| {row['handler'] / row['bare']:.2f} | ≥ 0.8 of MinIO |")
            # the same run against MinIO as the handler's own S3 client sees it (no botocore)
            print(f"| same run, MinIO baseline through LeanClient (the handler's client) | {row['objects']} "
                  f"| {row['tag_requests']:.0f} | {row['bare']:.0f} | {row['minio_tagging_lean']:.0f} "
                  f"| {row['handler']:.0f} | {row['handler'] / row['minio_tagging_lean']:.2f} "
                  f"| {row['handler'] / row['bare']:.2f} | — |")
        else:
            print(f"| `metadata`, objects with x-amz-meta-kind=k1 | {row['objects']} | {row['tag_requests']:.0f} "
                  f"| {row['bare']:.0f} | — | {row['handler']:.0f} | — | {row['handler'] / row['bare']:.2f} "
                  "| ≥ 0.5 of bare, 0 tag requests |")


def throughput(svc, h, scenario: str, n: int, objects: int, start: int = 0) -> tuple[dict, dict, float]:
    msgs = messages(scenario, n, objects, start=start)
    pub_s = publish(svc.rabbit.url, msgs)
    wait_depth(svc.rabbit.url, BARE_QUEUE, n)
    wait_depth(svc.rabbit.url, HANDLER_QUEUE, n)
    bare = run_bare(svc.rabbit.url, n)
    hand = run_handler(h, n)
    return bare, hand, n / pub_s


def the_object(_i: int) -> str:
    return "the-object"


def paced_publish(url: str, n: int, rate: float, published: list | None = None, *,
                  bucket: str = "bench", key=the_object):
    """Publish n events at `rate`/s, event i creating ``key(i)`` with etag ``e{i}`` (by
    default MATCH events: one object); their sequencer is the publish time in ns."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    base = time.time_ns() + 10**9  # later than every event of the throughput runs
    t0 = time.perf_counter()
    for i in range(n):
        d = t0 + i / rate - time.perf_counter()
        if d > 0:
            time.sleep(d)  # no spinning: the polling thread needs the GIL
        seq = max(time.time_ns(), base + i)  # the sequencer is the event time, as MinIO's
        body, headers = make_message("s3:ObjectCreated:Put", bucket, key(i), seq, size=1000, etag=f"e{i}")
        if published is not None:
            published[i] = time.perf_counter()
        ch.basic_publish("delvefs", "", body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, headers={"minio-bucket": bucket}))
    return conn


def publish_times(url: str, n: int, rate: float, **where) -> list[float]:
    """When each event was published (time.perf_counter; ``where``: see paced_publish)."""
    published = [0.0] * n
    paced_publish(url, n, rate, published, **where).close()
    return published


def latency_bare(svc, rate: float, seconds: float) -> dict:
    """The same paced events through RabbitMQ to a bare pika consumer (transport baseline)."""
    n = int(rate * seconds)
    proc = subprocess.Popen([sys.executable, str(HERE / "bench_handler_bare.py"), svc.rabbit.url,
                             BARE_QUEUE, str(n), "latency"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # let it connect (its queue is durable: nothing is lost if it is late)
    paced_publish(svc.rabbit.url, n, rate).close()
    out = json.loads(proc.communicate(timeout=120)[0])
    conn = pika.BlockingConnection(pika.URLParameters(svc.rabbit.url))
    conn.channel().queue_purge(HANDLER_QUEUE)  # the handler was not running: drop its copies
    conn.close()
    return out["latency_ms"]


def latency(svc, h, vid: str, rate: float, seconds: float, mode: str = "poll") -> dict:
    """Publish MATCH events at `rate`/s; a client records when each became visible (an event
    is visible once a change with its index or a later one is served): ``poll`` long-polls
    ``changes?wait=``, ``stream`` reads the server-sent event stream (what `watch` uses)."""
    h.start()
    client = httpx.Client(base_url=h.url, timeout=30)
    version = client.get(f"/v1/views/{vid}/objects").json()["version"]
    n = int(rate * seconds)
    published = [0.0] * n
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def poll():
        since = version
        while not stop.is_set():
            r = client.get(f"/v1/views/{vid}/changes", params={"since": since, "wait": 1}).json()
            t = time.perf_counter()
            if r["changes"]:
                seen.append((t, max(int(c["object"]["etag"][1:]) for c in r["changes"] if c["object"])))
            since = r["version"]

    def listen():
        try:
            with client.stream("GET", f"/v1/views/{vid}/stream", params={"since": version},
                               timeout=None) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        t = time.perf_counter()
                        obj = json.loads(line[6:])["object"]
                        if obj:
                            seen.append((t, int(obj["etag"][1:])))
                    if stop.is_set():
                        return
        except httpx.HTTPError:  # the handler stopped under it
            pass

    # this client's own garbage collections must not count as the handler's latency: one
    # full collection of this process paused the polling client for ~80 ms (gc.callbacks)
    gc.collect()
    gc.freeze()
    gc.disable()
    poller = threading.Thread(target=poll if mode == "poll" else listen, daemon=True)
    poller.start()
    # the publisher runs in its own process: the poller must not wait for it (GIL); both
    # processes read CLOCK_MONOTONIC (time.perf_counter), so their times compare
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        published[:] = pool.apply(publish_times, (svc.rabbit.url, n, rate))
    deadline = time.monotonic() + 10
    while (not seen or seen[-1][1] < n - 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    poller.join(5)
    gc.enable()
    gc.unfreeze()
    text = httpx.get(h.url + "/metrics", timeout=5).text
    handler_hist = [(line.split('le="')[1].split('"')[0], float(line.rsplit(" ", 1)[1]))
                    for line in text.splitlines() if line.startswith("delvefs_event_latency_seconds_bucket")]
    h.stop()
    # first visibility of each event
    lat = []
    j = 0
    for i in range(n):
        while j < len(seen) and seen[j][1] < i:
            j += 1
        if j == len(seen):
            break
        lat.append((seen[j][0] - published[i]) * 1000)
    lat.sort()

    def q(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))]
    hist = {}
    for bound in (0.5, 1, 2, 5, 10, 20, 50, float("inf")):
        hist[bound] = sum(1 for x in lat if x <= bound)
    return {"mode": mode, "n": n, "visible": len(lat), "rate": rate, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
            "p999": q(0.999), "max": lat[-1], "hist": hist, "handler_hist": handler_hist}


def scan(svc, h, s3, n: int) -> dict:
    bucket = "scan-bench"
    ensure_bucket(s3, bucket)
    have = sum(len(p.get("Contents", [])) for p in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket))
    if have < n:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"dir{i % 100:02d}/obj{i:07d}.dat", Body=b""),
                          range(have, n)))
        print(f"# created {n - have} objects in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    t0 = time.perf_counter()
    listed = sum(len(p.get("Contents", [])) for p in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket))
    bare = time.perf_counter() - t0
    h.start()
    t0 = time.perf_counter()
    r = h.register({"scan": {"bucket": bucket, "object": "*.dat", "size": None, "modified": None,
                             "accessed": None, "properties": {}}},
                   {bucket: presigned_list_url(s3, bucket)})
    r.raise_for_status()
    while httpx.get(h.url + "/healthz").json()["buckets"].get(bucket) != "ready":
        time.sleep(0.02)
    handler_s = time.perf_counter() - t0
    vid = r.json()["views"][0]["id"]
    t0 = time.perf_counter()
    count = len(h.list_all(vid, limit=50000)[1])
    list_s = time.perf_counter() - t0
    # what a repair after an object-store outage costs: one reconcile (nothing to repair)
    t0 = time.perf_counter()
    r = h.http.post("/v1/reconcile", params={"bucket": bucket}, timeout=3600)
    r.raise_for_status()
    reconcile_s = time.perf_counter() - t0
    h.stop()
    return {"objects": listed, "bare": bare, "handler": handler_s, "view_objects": count, "view_list": list_s,
            "reconcile": reconcile_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--scan-objects", type=int, default=100_000)
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="per latency client; 0: none")
    ap.add_argument("--skip-scan", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--scenarios", default="RAW,MATCH,DB_MATCH,TAGS,META",
                    help="comma-separated subset of RAW, MATCH, DB_MATCH, TAGS, META")
    ap.add_argument("--prop-objects", type=int, default=20_000, help="objects of TAGS and META")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--latency-rate", type=float, help="events/s for the latency run "
                    "(default: 20%% of the measured MATCH rate)")
    ap.add_argument("--keep", help="keep services and state in this directory (reuses the scan bucket)")
    ap.add_argument("--shards", help="only the shard benchmark, for these shard counts (e.g. 1,2,3; "
                    "--events per shard): benchmarks/bench_handler_shards.py")
    args = ap.parse_args()
    sys.setswitchinterval(0.0005)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="delvefs-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    with LocalServices(base / "services") as svc:
        env = svc.env()
        os.environ.update(env)
        if args.shards:
            from benchmarks import bench_handler_shards
            bench_handler_shards.main(svc, base, [int(n) for n in args.shards.split(",")], args.events,
                                      args.objects)
            return 0
        s3 = make_client()
        ensure_bucket(s3, "bench")
        h = HandlerProcess(env, base / f"state-{time.time_ns()}", token=None, queue=HANDLER_QUEUE,
                           log_path=base / "handler.log")
        h.start()
        r = h.register({name: spec for name, spec in bench_views("bench")}, {"bench": presigned_list_url(s3, "bench")})
        r.raise_for_status()
        vid = r.json()["views"][0]["id"]
        while httpx.get(h.url + "/healthz").json()["buckets"].get("bench") != "ready":
            time.sleep(0.02)
        conn = pika.BlockingConnection(pika.URLParameters(svc.rabbit.url))
        declare(conn.channel(), "delvefs", BARE_QUEUE, BARE_QUEUE + ".dead")
        conn.close()
        h.stop()
        rows = []
        wanted = set(args.scenarios.split(","))
        plan = [(label, start) for label, start in
                [("RAW", 0), ("MATCH", 0), ("DB_MATCH (first events: creates)", 0),
                 ("DB_MATCH (updates)", args.objects)] if label.split()[0] in wanted]
        for _ in range(0 if args.skip_throughput else args.repeat):
            for label, start in plan:
                sc = label.split()[0]
                bare, hand, pub_rate = throughput(svc, h, sc, args.events, args.objects, start)
                rows.append((label, bare, hand))
                print(f"# {label}: bare {bare['rate']:.0f}/s handler {hand['rate']:.0f}/s "
                      f"ratio {hand['rate'] / bare['rate']:.2f} (published at {pub_rate:.0f}/s, "
                      f"mean batch {hand['batch']:.0f})", file=sys.stderr)
        if rows:
            print_throughput(args, rows)
        prop_rows = [property_scenario(svc, h, s3, sc, args.prop_objects)
                     for _ in range(0 if args.skip_throughput else args.repeat)
                     for sc in ("TAGS", "META") if sc in wanted]
        for row in prop_rows:
            print(f"# {row}", file=sys.stderr)
        if prop_rows:
            print_properties(prop_rows)
        match_rate = statistics.median(h_['rate'] for lab, _, h_ in rows if lab == "MATCH") \
            if "MATCH" in wanted and rows else 15_000
        rate = args.latency_rate or 0.2 * match_rate
        if args.latency_seconds > 0:  # 0: no latency runs
            bare_lat = latency_bare(svc, rate, args.latency_seconds)
            lats = [latency(svc, h, vid, rate, args.latency_seconds, mode) for mode in ("poll", "stream")]
            print_latency(args, lats, bare_lat)
        if not args.skip_scan:
            sc = scan(svc, h, s3, args.scan_objects)
            print("\n### First scan of a bucket\n")
            print("| objects | bare boto3 ListObjectsV2 | handler scan (register → ready) | ratio | target | "
                  "then listing the view via API | a reconcile (the repair after a store outage) | "
                  "reconcile ÷ bare listing |")
            print("|---:|---:|---:|---:|---|---:|---:|---:|")
            print(f"| {sc['objects']} | {sc['bare']:.1f} s | {sc['handler']:.1f} s | "
                  f"{sc['handler'] / sc['bare']:.2f} | ≤ 1.2 | {sc['view_list']:.1f} s ({sc['view_objects']} objects) | "
                  f"{sc['reconcile']:.1f} s ({sc['objects'] / sc['reconcile']:.0f} objects/s) | "
                  f"{sc['reconcile'] / sc['bare']:.2f} |")
        h.http.close()
    return 0


def print_throughput(args, rows):
    print("\n### Throughput (events drained from a pre-filled durable queue)\n")
    print(f"{args.events} events per run, 100 views on the bucket, {args.objects} distinct objects in DB_MATCH.\n")
    print("| scenario | bare pika (events/s) | handler (events/s) | handler / bare | target |")
    print("|---|---:|---:|---:|---:|")
    targets = {"RAW": 0.8, "MATCH": 0.7, "DB_MATCH": 0.5}
    for label, bare, hand in rows:
        print(f"| {label} | {bare['rate']:.0f} | {hand['rate']:.0f} | {hand['rate'] / bare['rate']:.2f} "
              f"| ≥ {targets[label.split()[0]]} |")


def print_latency(args, lats, bare):
    print("\n### Latency: publish → visible through the API\n")
    print(f"MATCH events at {lats[0]['rate']:.0f}/s (20% of the handler's MATCH rate) for "
          f"{args.latency_seconds:.0f} s per client; "
          + ", ".join(f"{lat['mode']}: {lat['visible']} of {lat['n']} events observed" for lat in lats) + ".\n")
    print("| path | p50 | p90 | p99 | p99.9 | max | target |")
    print("|---|---:|---:|---:|---:|---:|---|")
    names = {"poll": "long poll (`changes?wait=`)", "stream": "event stream (SSE)"}
    for lat in lats:
        print(f"| handler: publish → visible via {names[lat['mode']]} | {lat['p50']:.2f} ms | {lat['p90']:.2f} ms "
              f"| {lat['p99']:.2f} ms | {lat['p999']:.2f} ms | {lat['max']:.1f} ms | p99 ≤ 5 ms, p99.9 ≤ 20 ms |")
    print(f"| bare pika consumer, same events: publish → received | {bare['0.5']:.2f} ms | {bare['0.9']:.2f} ms "
          f"| {bare['0.99']:.2f} ms | {bare['0.999']:.2f} ms | {bare['1.0']:.1f} ms | (transport baseline) |")
    print("\n| latency ≤ | " + " | ".join(f"{b:g} ms" for b in lats[0]["hist"]) + " |")
    print("|---|" + "---:|" * len(lats[0]["hist"]))
    for lat in lats:
        print(f"| {lat['mode']} | " + " | ".join(f"{100 * c / max(1, lat['visible']):.2f}%"
                                              for c in lat["hist"].values()) + " |")
    for lat in lats:
        hh = lat["handler_hist"]
        if hh:
            total = hh[-1][1] or 1
            print(f"\nInside the handler during the {lat['mode']} run (`delvefs_event_latency_seconds`: "
                  "event time → batch committed):\n")
            print("| ≤ | " + " | ".join(f"{float(b) * 1000:g} ms" if b != "+Inf" else "inf" for b, _ in hh) + " |")
            print("|---|" + "---:|" * len(hh))
            print("| events | " + " | ".join(f"{100 * c / total:.2f}%" for _, c in hh) + " |")

if __name__ == "__main__":
    raise SystemExit(main())
