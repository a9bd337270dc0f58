"""MinIO's AMQP target with and without QUEUE_DIR: event latency and loss while the
broker is down. Informs the default documented in docs/ARCHITECTURE.md.

    .venv/bin/python -m benchmarks.bench_notify_queue_dir [--objects 200]

For each mode: (1) latency from put_object returning to a bare pika consumer
receiving the event, over N sequential puts; (2) stop RabbitMQ, put K objects,
start RabbitMQ again, count how many of the K events ever arrive.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pika

from delvefs.devtools.localservices import LocalServices
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications
from delvefs.shared.config import S3Settings


class Receiver(threading.Thread):
    """Bare consumer on a durable queue: records arrival time per key."""

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
                        self.arrivals.setdefault(urllib.parse.unquote_plus(rec["s3"]["object"]["key"]), now)
                    ch.basic_ack(method.delivery_tag)
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.2)


def run_mode(queue_dir: bool, n: int, k: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-qd-") as d, LocalServices(Path(d), queue_dir=queue_dir) as svc:
        env = svc.env()
        s3 = make_client(S3Settings(env["AWS_ENDPOINT_URL"], env["AWS_ACCESS_KEY_ID"],
                                    env["AWS_SECRET_ACCESS_KEY"], "us-east-1"))
        ensure_bucket(s3, "bench")
        wire_notifications(s3, "bench", svc.minio.notify_arn)
        rx = Receiver(svc.rabbit.url, svc.minio.exchange)
        rx.start()
        # warm-up: wait until the consumer sees events at all
        s3.put_object(Bucket="bench", Key="warmup", Body=b"")
        deadline = time.monotonic() + 30
        while "warmup" not in rx.arrivals and time.monotonic() < deadline:
            time.sleep(0.01)
        sent = {}
        for i in range(n):
            key = f"lat/{i}"
            s3.put_object(Bucket="bench", Key=key, Body=b"x")
            sent[key] = time.monotonic()
        deadline = time.monotonic() + 30
        while any(key not in rx.arrivals for key in sent) and time.monotonic() < deadline:
            time.sleep(0.01)
        lat = sorted((rx.arrivals[k_] - t) * 1000 for k_, t in sent.items() if k_ in rx.arrivals)

        svc.rabbit.stop()
        outage_keys = [f"outage/{i}" for i in range(k)]
        put_errors = 0
        for key in outage_keys:
            try:
                s3.put_object(Bucket="bench", Key=key, Body=b"x")
            except Exception:  # noqa: BLE001 - counted, reported
                put_errors += 1
        svc.rabbit.start()
        deadline = time.monotonic() + 60
        while any(key not in rx.arrivals for key in outage_keys) and time.monotonic() < deadline:
            time.sleep(0.1)
        delivered = sum(key in rx.arrivals for key in outage_keys)
        rx.stop_flag.set()
        return {
            "mode": "QUEUE_DIR" if queue_dir else "no queue dir",
            "n": len(lat), "p50": statistics.median(lat), "p99": lat[int(len(lat) * 0.99) - 1],
            "max": lat[-1], "outage_delivered": f"{delivered}/{k}", "put_errors": put_errors,
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=200)
    ap.add_argument("--outage-objects", type=int, default=20)
    args = ap.parse_args()
    rows = [run_mode(False, args.objects, args.outage_objects), run_mode(True, args.objects, args.outage_objects)]
    print(f"{'MinIO AMQP target':<16} {'events':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'delivered after broker outage':>30} {'put errors':>10}")
    for r in rows:
        print(f"{r['mode']:<16} {r['n']:>6} {r['p50']:>8.1f} {r['p99']:>8.1f} {r['max']:>8.1f} "
              f"{r['outage_delivered']:>30} {r['put_errors']:>10}")


if __name__ == "__main__":
    main()
