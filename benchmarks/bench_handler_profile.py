"""In-process cost of the handler's per-message path (no broker): the consumer's batch
handling + Engine.apply_events + LevelDB, for the RAW / MATCH / DB_MATCH scenarios.

    .venv/bin/python benchmarks/bench_handler_profile.py [--events N] [--profile]

--profile runs pyinstrument (``.venv/bin/pip install pyinstrument``) around each scenario.
This isolates what the handler adds on top of pika; bench_handler.py measures end to end.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from types import SimpleNamespace

from eventhandler.amqp import Consumer
from eventhandler.engine import Engine
from eventhandler.events import make_message
from eventhandler.metrics import Metrics
from eventhandler.statedb import Store
from eventhandler.tracking import READY, BucketState
from rulesets import View


def bench_views(bucket: str, n: int = 100) -> list[tuple[str, dict]]:
    """n distinct views that all match objects of size >= n in ``bucket``."""
    return [(f"v{i}", View.from_filter_spec(f"v{i}", {"bucket": bucket, "object": "*", "size": [i, None]})
             .filter_spec()) for i in range(n)]


def messages(scenario: str, n: int, objects: int = 100_000, bucket: str = "bench", start: int = 0):
    base = time.time_ns()
    out = []
    for i in range(start, start + n):
        if scenario == "RAW":
            body, headers = make_message("s3:ObjectCreated:Put", "elsewhere", f"obj{i % objects:07d}",
                                         base + i, size=1000, etag=f"e{i}")
        elif scenario == "MATCH":
            body, headers = make_message("s3:ObjectCreated:Put", bucket, "the-object", base + i,
                                         size=1000 + i % 7, etag=f"e{i}")
        else:
            body, headers = make_message("s3:ObjectCreated:Put", bucket, f"obj{i % objects:07d}", base + i,
                                         size=1000 + i % 7, etag=f"e{i}")
        out.append((body, headers))
    return out


class _Channel:
    def basic_ack(self, *a, **k):
        pass

    def basic_nack(self, *a, **k):
        pass


def setup(tmp: str):
    store = Store(tmp)
    metrics = Metrics()
    engine = Engine(store, metrics, s3=None)  # the bucket is scanned already and no view needs tags
    # register 100 views on an (already scanned, empty) bucket without S3
    engine.buckets["bench"] = BucketState("bench", READY, int(time.time() * 1e6))
    engine.register(bench_views("bench"))
    for info in engine.infos:
        info.ready = True
    consumer = Consumer("amqp://unused", "delvefs", engine, metrics)
    return store, engine, consumer


def run(scenario: str, n: int, batch: int, consumer, profile: bool, objects: int):
    msgs = messages(scenario, n, objects)
    deliveries = [(i + 1, SimpleNamespace(headers=h), b) for i, (b, h) in enumerate(msgs)]
    ch = _Channel()
    prof = None
    if profile:
        from pyinstrument import Profiler
        prof = Profiler(interval=0.0005)
        prof.start()
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        consumer._handle(ch, deliveries[i:i + batch])
    dt = time.perf_counter() - t0
    if prof:
        prof.stop()
        print(prof.output_text(unicode=True, color=False, show_all=False))
    return dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--scenario", action="append")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="delvefs-bench-") as tmp:
        store, engine, consumer = setup(tmp + "/db")
        try:
            print(f"{'scenario':10} {'events':>8} {'seconds':>8} {'events/s':>10} {'us/event':>9}")
            for sc in args.scenario or ["RAW", "MATCH", "DB_MATCH", "DB_MATCH"]:
                dt = run(sc, args.events, args.batch, consumer, args.profile, args.objects)
                print(f"{sc:10} {args.events:8d} {dt:8.2f} {args.events / dt:10.0f} {dt / args.events * 1e6:9.1f}")
        finally:
            engine.close()
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
