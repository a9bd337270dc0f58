"""Dispatch overhead of a work-queue group against plain ``watch``.

    .venv/bin/python benchmarks/bench_groups.py [--files 1000] [--members 3]

Real MinIO and RabbitMQ (delvefs.devtools.localservices), the real ``delvefs eventhandler``
process, a bucket wired to it. For each way of receiving files, ``--files`` objects are
PUT one after the other into a view of their own, and each receiver records when it gets
each file; the latency of a file is from its PUT's return to a receiver having it (one
process, one clock):

- ``watch``: ``--members`` subscribers follow the view's change stream (what ``delvefs
  watch`` reads: every subscriber gets every file);
- ``group``: ``--members`` members of one group claim files (a long poll each, one file at a
  time) and acknowledge each at once on a connection of their own while the next claim
  waits (what ``delvefs watch --group --exec CMD -j 2`` does with a command that takes no time);
- ``quorum queue hop``: for the design not taken — a RabbitMQ quorum queue per group,
  filled by the handler after it applied an event — the extra hop alone: publish with
  confirms, ``--members`` consumers with manual acks and prefetch 1 (this RabbitMQ).

Prints a markdown table: p50 and p99 in milliseconds, and the time to hand out all files.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from delvefs.client.handler.api import HandlerError, SyncHandlerClient  # noqa: E402
from delvefs.devtools.localservices import LocalServices  # noqa: E402
from delvefs.shared.s3 import ensure_bucket, make_client, presigned_list_url, wire_notifications  # noqa: E402
from eventhandler.devtools import HandlerProcess, spec  # noqa: E402

BUCKET = "groups-bench"


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


class Writer:
    """PUTs ``n`` objects under ``prefix``, one after the other; when each PUT returned."""

    def __init__(self, s3, prefix: str, n: int):
        self.s3, self.prefix, self.n = s3, prefix, n
        self.put_at: dict[str, float] = {}

    def run(self) -> None:
        for i in range(self.n):
            key = f"{self.prefix}f{i:05d}"
            self.s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
            self.put_at[key] = time.perf_counter()


def latencies(writer: Writer, received: list[tuple[str, float]]) -> list[float]:
    return [(t - writer.put_at[k]) * 1000 for k, t in received if k in writer.put_at]


def drive(writer: Writer, receivers: list[threading.Thread], ready, received: list[tuple[str, float]]):
    """Start the receivers, PUT once ``ready()``, wait for the receivers to end: the
    latencies, and the seconds from the first PUT to the last reception."""
    for t in receivers:
        t.start()
    while not ready():
        time.sleep(0.01)
    t0 = time.perf_counter()
    writer.run()
    for t in receivers:
        t.join(120)
    return latencies(writer, received), max(t for _k, t in received) - t0


def run_watch(h: HandlerProcess, s3, vid: str, members: int, n: int):
    writer = Writer(s3, "watch/", n)
    received: list[tuple[str, float]] = []
    stops = []

    def subscriber() -> None:
        client = SyncHandlerClient(h.url, h.token, timeout=60)
        version = client.list_page(vid, None, 1)["version"]
        stops.append(client)
        seen = 0
        try:
            for change in client.follow(vid, version):
                if change["op"] == "put":
                    received.append((change["key"], time.perf_counter()))
                    seen += 1
                    if seen == n:
                        return
        except HandlerError:
            pass

    return drive(writer, [threading.Thread(target=subscriber, daemon=True) for _ in range(members)],
                 lambda: len(stops) == members, received)


def run_group(h: HandlerProcess, s3, vid: str, members: int, n: int):
    writer = Writer(s3, "group/", n)
    received: list[tuple[str, float]] = []
    joined = []
    lock = threading.Lock()

    def acknowledger(mid: str, acks: queue.Queue) -> None:
        client = SyncHandlerClient(h.url, h.token, timeout=60)
        while (key := acks.get()) is not None:
            client.group_done(vid, "bench", mid, key)

    def member(i: int) -> None:
        # as `watch --group --exec -j 2` does: the next claim waits while the last file's
        # acknowledgement goes out on a connection of its own
        client = SyncHandlerClient(h.url, h.token, timeout=60)
        mid = f"bench-{i}"
        client.group_join(vid, "bench", mid)
        acks: queue.Queue = queue.Queue()
        threading.Thread(target=acknowledger, args=(mid, acks), daemon=True).start()
        joined.append(mid)
        while True:
            with lock:
                if len(received) >= n:
                    acks.put(None)
                    return
            for f in client.group_claim(vid, "bench", mid, 1, wait=2)["files"]:
                with lock:
                    received.append((f["key"], time.perf_counter()))
                acks.put(f["key"])

    result = drive(writer, [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)],
                   lambda: len(joined) == members, received)
    keys = [k for k, _t in received]
    assert len(keys) == len(set(keys)) == n, (len(keys), len(set(keys)))
    return result


def run_quorum_hop(amqp_url: str, members: int, n: int):
    queue = "groups-bench-quorum"
    sent: dict[str, float] = {}
    received: list[tuple[str, float]] = []
    ready = threading.Barrier(members + 1)
    lock = threading.Lock()

    def consumer() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        ready.wait()
        for method, _props, body in ch.consume(queue, inactivity_timeout=1.0):
            if method is None:
                with lock:
                    if len(received) >= n:
                        break
                continue
            with lock:
                received.append((body.decode(), time.perf_counter()))
            ch.basic_ack(method.delivery_tag)
        conn.close()

    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 3})
    ch.confirm_delivery()
    threads = [threading.Thread(target=consumer, daemon=True) for _ in range(members)]
    for t in threads:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    for i in range(n):
        key = f"q{i:05d}"
        sent[key] = time.perf_counter()
        ch.basic_publish("", queue, key.encode(), pika.BasicProperties(delivery_mode=2))
    for t in threads:
        t.join(120)
    ch.queue_delete(queue)
    conn.close()
    return [(t - sent[k]) * 1000 for k, t in received], max(t for _k, t in received) - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--members", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="delvefs-bench-groups-"))
    rows = []
    with LocalServices(base / "services") as svc:
        env = svc.env()
        os.environ.update(env)
        s3 = make_client()
        ensure_bucket(s3, BUCKET)
        wire_notifications(s3, BUCKET, svc.minio.notify_arn)
        h = HandlerProcess(env, base / "state", log_path=base / "handler.log")
        h.start()
        try:
            views = h.api.register("bench", [{"name": "watch", "spec": spec(BUCKET, object="watch/*")},
                                             {"name": "group", "spec": spec(BUCKET, object="group/*")}],
                                   {BUCKET: presigned_list_url(s3, BUCKET)})
            ids = {v["name"]: v["id"] for v in views}
            h.api.list_page(ids["watch"], None, 1)  # the first scan is over
            for label, run in (("watch (change stream, every subscriber gets each file)",
                                lambda: run_watch(h, s3, ids["watch"], args.members, args.files)),
                               ("group (claims; each file to one member, acknowledged)",
                                lambda: run_group(h, s3, ids["group"], args.members, args.files))):
                lat, total = run()
                rows.append((label, len(lat), percentile(lat, 0.5), percentile(lat, 0.99), total))
                print(f"# {label}: p50 {rows[-1][2]:.1f} ms", file=sys.stderr)
        finally:
            h.close()
        lat, total = run_quorum_hop(svc.rabbit.url, args.members, args.files)
        rows.append(("quorum queue hop alone (publish with confirms → consumer, manual ack)",
                     len(lat), percentile(lat, 0.5), percentile(lat, 0.99), total))
    print(f"\n### Dispatch of {args.files} files to {args.members} receivers "
          "(PUT returned → receiver has the file)\n")
    print("| receivers | receptions | p50 | p99 | last file received after |")
    print("|---|---:|---:|---:|---:|")
    for label, count, p50, p99, total in rows:
        print(f"| {label} | {count} | {p50:.1f} ms | {p99:.1f} ms | {total:.1f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
