"""``bench_handler.py --shards 1,2,3``: N handler shards draining pre-loaded queues, and
the broker's side of sharding.

For each N: N real ``delvefs eventhandler --shard`` processes (one map), each owning one
bucket with the 100 views of bench_handler.py; while they are stopped, EVENTS DB_MATCH
events per shard are published to MinIO's exchange, routed by the bucket exchange into each
shard's queue; then all N start at once. Per shard: the CPU seconds its process spent from
its first handled event to its last (user + system, /proc), per 100,000 events; aggregate:
N x EVENTS over the time from the first shard's first event to the last shard's last.

The broker: publish and drain rates (bare pika, no publisher confirms) of one classic and
one quorum queue bound to the fanout exchange directly, and of a queue bound to the headers
exchange with 1 and 1,000 bucket bindings (what routing by bucket costs the broker).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pika

from delvefs.devtools.localservices import free_port
from delvefs.shared.s3 import ensure_bucket, presigned_list_url
from delvefs.shared.shards import ShardMap
from eventhandler.amqp import bucket_binding, declare_bucket_exchange, declare_exchange, queue_arguments
from eventhandler.devtools import HandlerProcess

from .bench_handler_profile import bench_views, messages
from .broker import publish, wait_depth

HERE = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def owned_buckets(shard_map: ShardMap) -> dict[str, str]:
    """One bucket name per shard, owned by it."""
    found, i = {}, 0
    while len(found) < len(shard_map.shards):
        found.setdefault(shard_map.owner(f"bench-{i}"), f"bench-{i}")
        i += 1
    return found


def processed(h: HandlerProcess) -> float:
    return h.metric("delvefs_events_processed_total")


def run_shards(svc, base: Path, n: int, events: int, objects: int) -> dict:
    """N shards drain ``events`` each; returns the per-shard and aggregate figures."""
    names = [chr(ord("a") + i) for i in range(n)]
    ports = {name: free_port() for name in names}
    shard_map = ShardMap.parse(",".join(f"{name}=http://127.0.0.1:{ports[name]}" for name in names))
    buckets = owned_buckets(shard_map)
    env = svc.env()
    run = time.time_ns()
    handlers = {name: HandlerProcess(env, base / f"shards{n}-{run}" / name, token=None, port=ports[name],
                                     queue=f"bench.shard{n}.{name}", log_path=base / f"shards{n}-{name}.log",
                                     args=("--shard", name, "--shard-map", shard_map.text()))
                for name in names}
    from delvefs.shared.s3 import make_client
    s3 = make_client()
    try:
        for name, h in handlers.items():
            bucket = buckets[name]
            ensure_bucket(s3, bucket)
            h.start()
            h.register(dict(bench_views(bucket)), {bucket: presigned_list_url(s3, bucket)}).raise_for_status()
            while h.api.health()["buckets"].get(bucket) != "ready":
                time.sleep(0.02)
            h.stop()
        for name in names:  # the queues pre-loaded, routed by the broker
            publish(svc.rabbit.url, messages("DB_MATCH", events, objects, bucket=buckets[name]))
        for name, h in handlers.items():
            wait_depth(svc.rabbit.url, h.queue, events)
        with ThreadPoolExecutor(n) as pool:  # all at once
            list(pool.map(lambda h: h.start(timeout=120), handlers.values()))
        procs = handlers
        first, last, cpu0, cpu1 = {}, {}, {}, {}
        pending = set(names)
        while pending:
            for name in list(pending):
                h = procs[name]
                count = processed(h)
                now = time.perf_counter()
                if name not in first and count > 0:
                    first[name], cpu0[name] = now, cpu_seconds(h.proc.pid)
                if count >= events:
                    last[name], cpu1[name] = now, cpu_seconds(h.proc.pid)
                    pending.discard(name)
            time.sleep(0.05)
        per_shard = {name: {"cpu_per_100k": (cpu1[name] - cpu0[name]) / events * 100_000,
                            "rate": events / (last[name] - first[name])} for name in names}
        span = max(last.values()) - min(first.values())
        foreign = sum(h.api.shard_maps()["foreign_events"] for h in procs.values())
        return {"shards": n, "events": events, "per_shard": per_shard, "aggregate": n * events / span,
                "cpu_per_100k": statistics.mean(s["cpu_per_100k"] for s in per_shard.values()),
                "foreign": foreign}
    finally:
        for h in handlers.values():
            h.close()
        conn = pika.BlockingConnection(pika.URLParameters(svc.rabbit.url))
        ch = conn.channel()
        for h in handlers.values():
            for q in (h.queue, h.queue + ".dead"):
                ch.queue_delete(q)
        conn.close()


def drain(url: str, queue: str, n: int) -> float:
    import json
    out = subprocess.run([sys.executable, str(HERE / "bench_handler_bare.py"), url, queue, str(n)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["rate"]


def broker_rates(svc, events: int) -> list[dict]:
    """Publish and drain rates of one queue: classic, quorum, and behind the bucket exchange."""
    url = svc.rabbit.url
    rows = []
    cases = [("classic queue, fanout binding", False, 0), ("quorum queue, fanout binding", True, 0),
             ("classic queue, bucket exchange, 1 binding", False, 1),
             ("classic queue, bucket exchange, 1,000 bindings", False, 1000),
             ("quorum queue, bucket exchange, 1,000 bindings", True, 1000)]
    for label, quorum, bindings in cases:
        exchange = f"bench-broker-{time.time_ns()}"
        queue = exchange + ".q"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        declare_exchange(ch, exchange)
        args = queue_arguments(queue + ".dead", quorum)
        del args["x-dead-letter-exchange"]
        ch.queue_declare(queue, durable=True, arguments=args)
        if bindings:
            routing = declare_bucket_exchange(ch, exchange)
            if bindings > 1:  # other buckets' bindings, which the broker checks for each event
                ch.queue_declare(exchange + ".other", durable=True)
                for i in range(bindings - 1):
                    ch.queue_bind(exchange + ".other", routing, arguments=bucket_binding(f"b{i}"))
            ch.queue_bind(queue, routing, arguments=bucket_binding(f"b{bindings - 1}"))
        else:
            ch.queue_bind(queue, exchange)
        conn.close()
        bucket = f"b{bindings - 1}" if bindings else "bench"
        pub = events / publish(url, messages("DB_MATCH", events, events, bucket=bucket), exchange)
        wait_depth(url, queue, events)
        rows.append({"case": label, "publish": pub, "drain": drain(url, queue, events)})
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        for q in (queue, exchange + ".other"):
            ch.queue_delete(q)
        ch.exchange_delete(exchange + ".buckets")
        ch.exchange_delete(exchange)
        conn.close()
        print(f"# broker: {rows[-1]}", file=sys.stderr)
    return rows


def main(svc, base: Path, counts: list[int], events: int, objects: int) -> None:
    rows = []
    for n in counts:
        row = run_shards(svc, base, n, events, objects)
        rows.append(row)
        print(f"# shards {n}: {row}", file=sys.stderr)
    one = next((r["cpu_per_100k"] for r in rows if r["shards"] == 1), None)
    print("\n### Shards: N handler shards draining pre-loaded queues\n")
    print(f"{events} DB_MATCH events per shard (100 views on its bucket, {objects} distinct objects), "
          f"{os.cpu_count()} cores shared by every shard, RabbitMQ and the benchmark.\n")
    print("| shards | CPU s per 100,000 events per shard | vs 1 shard | per shard (events/s) | "
          "aggregate (events/s) | foreign events |")
    print("|---:|---:|---:|---|---:|---:|")
    for r in rows:
        rel = f"{r['cpu_per_100k'] / one:.2f}" if one else "-"
        shards = ", ".join(f"{name}: {s['rate']:.0f}" for name, s in r["per_shard"].items())
        print(f"| {r['shards']} | {r['cpu_per_100k']:.2f} | {rel} | {shards} | {r['aggregate']:.0f} "
              f"| {r['foreign']} |")
    broker = broker_rates(svc, events)
    print("\n### The broker: one queue's rates (bare pika, persistent messages, no confirms)\n")
    print("| queue | publish (events/s) | drain (events/s) |")
    print("|---|---:|---:|")
    for b in broker:
        print(f"| {b['case']} | {b['publish']:.0f} | {b['drain']:.0f} |")
