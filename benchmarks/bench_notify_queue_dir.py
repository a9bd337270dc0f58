"""MinIO's AMQP target with publisher confirms off and on, without and with QUEUE_DIR:
event latency, throughput and loss while the broker is down, in one run. Informs the
defaults documented in docs/ARCHITECTURE.md ("Notification delivery").

    .venv/bin/python -m benchmarks.bench_notify_queue_dir [--objects 300] [--burst 400]

For each queue-dir setting, two MinIO servers publish to one RabbitMQ, one with publisher
confirms off and one with them on, so that both see the same machine (other load on it
moves both alike): (1) latency from put_object returning to a bare pika consumer
receiving the event, over N sequential puts alternating between the two servers;
(2) throughput: B puts from 8 threads to one server at a time, events received per second
from the first put to the last event; (3) stop RabbitMQ, put K objects to each server,
start RabbitMQ again, count how many of the K events ever arrive.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import botocore.exceptions
import pika

from delvefs.devtools.localservices import ACCESS_KEY, SECRET_KEY, MinIO, RabbitMQ
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications
from delvefs.shared.config import S3Settings

BURST_THREADS = 8


class Receiver(threading.Thread):
    """Bare consumer on a durable queue: records the arrival time of each bucket/key."""

    def __init__(self, url: str, exchange: str):
        super().__init__(daemon=True)
        self.url, self.exchange = url, exchange
        self.arrivals: dict[str, float] = {}
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.is_set():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.url))
                ch = conn.channel()
                ch.exchange_declare(self.exchange, exchange_type="fanout", durable=True)
                ch.queue_declare("bench-latency", durable=True)
                ch.queue_bind("bench-latency", self.exchange)
                for method, _props, body in ch.consume("bench-latency", inactivity_timeout=0.1):
                    if self.stop_flag.is_set():
                        break
                    if method is None:
                        continue
                    now = time.monotonic()
                    for rec in json.loads(body).get("Records", []):
                        name = (rec["s3"]["bucket"]["name"] + "/"
                                + urllib.parse.unquote_plus(rec["s3"]["object"]["key"]))
                        self.arrivals.setdefault(name, now)
                    ch.basic_ack(method.delivery_tag)
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.2)

    def wait_for(self, names, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(name not in self.arrivals for name in names) and time.monotonic() < deadline:
            time.sleep(0.01)


class Target:
    """One MinIO server (one mode) and its bucket."""

    def __init__(self, base: Path, rabbit: RabbitMQ, queue_dir: bool, confirms: bool):
        self.mode = (f"{'QUEUE_DIR' if queue_dir else 'no queue dir'}, "
                     f"confirms {'on' if confirms else 'off'}")
        self.bucket = f"bench-{'qd' if queue_dir else 'direct'}-{'on' if confirms else 'off'}"
        self.minio = MinIO(base / self.bucket / "data", rabbit.url,
                           queue_dir=base / self.bucket / "events" if queue_dir else None,
                           publisher_confirms=confirms)
        self.s3 = None

    def start(self) -> "Target":
        self.minio.start()
        self.s3 = make_client(S3Settings(self.minio.endpoint, ACCESS_KEY, SECRET_KEY, "us-east-1"))
        deadline = time.monotonic() + 60
        while True:  # "ready" may come before the object layer is (XMinioServerNotInitialized)
            try:
                ensure_bucket(self.s3, self.bucket)
                break
            except botocore.exceptions.ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        wire_notifications(self.s3, self.bucket, self.minio.notify_arn)
        return self

    def put(self, key: str) -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"x")
        return f"{self.bucket}/{key}"


def measure(targets: list[Target], rx: Receiver, rabbit: RabbitMQ, n: int, burst: int, k: int) -> list[dict]:
    rx.wait_for([t.put("warmup") for t in targets], 30)
    sent: dict[str, dict[str, float]] = {t.mode: {} for t in targets}
    for i in range(n):  # alternating: both modes see the same moments of the machine
        for t in targets:
            name = t.put(f"lat/{i}")
            sent[t.mode][name] = time.monotonic()
    rx.wait_for([name for by_mode in sent.values() for name in by_mode], 30)

    rates = {}
    for t in targets:
        started = time.monotonic()
        with ThreadPoolExecutor(BURST_THREADS) as pool:
            names = list(pool.map(t.put, (f"burst/{i}" for i in range(burst))))
        rx.wait_for(names, 60)
        arrived = [rx.arrivals[name] for name in names if name in rx.arrivals]
        rates[t.mode] = (len(arrived) / (max(arrived) - started) if arrived else 0.0, len(arrived))

    rabbit.stop()
    outage: dict[str, list[str]] = {t.mode: [] for t in targets}
    put_errors = dict.fromkeys(outage, 0)
    for i in range(k):
        for t in targets:
            try:
                outage[t.mode].append(t.put(f"outage/{i}"))
            except Exception:  # noqa: BLE001 - counted, reported
                put_errors[t.mode] += 1
    rabbit.start()
    rx.wait_for([name for names in outage.values() for name in names], 60)

    rows = []
    for t in targets:
        lat = sorted((rx.arrivals[name] - at) * 1000 for name, at in sent[t.mode].items() if name in rx.arrivals)
        rows.append({"mode": t.mode, "n": len(lat), "p50": statistics.median(lat),
                     "p99": lat[max(0, int(len(lat) * 0.99) - 1)], "max": lat[-1],
                     "rate": rates[t.mode][0], "burst": f"{rates[t.mode][1]}/{burst}",
                     "outage_delivered": f"{sum(name in rx.arrivals for name in outage[t.mode])}/{k}",
                     "put_errors": put_errors[t.mode]})
    return rows


def run_pair(queue_dir: bool, n: int, burst: int, k: int) -> list[dict]:
    """Confirms off and on, side by side, with or without the queue dir."""
    with tempfile.TemporaryDirectory(prefix="bench-qd-") as d, contextlib.ExitStack() as stack:
        rabbit = RabbitMQ(Path(d) / "rabbitmq").start()
        stack.callback(rabbit.close)
        targets = []
        for confirms in (False, True):
            t = Target(Path(d), rabbit, queue_dir, confirms)
            stack.callback(t.minio.stop)
            targets.append(t.start())
        rx = Receiver(rabbit.url, targets[0].minio.exchange)
        rx.start()
        stack.callback(rx.stop_flag.set)
        return measure(targets, rx, rabbit, n, burst, k)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=300, help="sequential puts per mode (latency)")
    ap.add_argument("--burst", type=int, default=400, help=f"puts from {BURST_THREADS} threads (throughput)")
    ap.add_argument("--outage-objects", type=int, default=20, help="puts while RabbitMQ is stopped")
    args = ap.parse_args()
    rows = [row for queue_dir in (False, True)
            for row in run_pair(queue_dir, args.objects, args.burst, args.outage_objects)]
    print("| MinIO AMQP target | p50 put→event | p99 | max | burst: events/s (received) "
          "| delivered after a broker outage | put errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['p50']:,.1f} ms | {r['p99']:,.1f} ms | {r['max']:,.1f} ms "
              f"| {r['rate']:,.0f} ({r['burst']}) | {r['outage_delivered']} | {r['put_errors']} |")


if __name__ == "__main__":
    main()
