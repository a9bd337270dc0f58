"""Listing a small view of a huge bucket through the handler's API.

    .venv/bin/python benchmarks/bench_handler_small_view.py [--objects 100000] [--members 100]
                                                            [--repeat 30]

Real RabbitMQ and MinIO (delvefs.devtools.localservices), the real ``delvefs eventhandler`` process.
The bucket is created empty (so the first scan is instant); then the handler's LevelDB is
filled with ``--objects`` objects through crafted MinIO-format events published to the
exchange (as bench_handler.py does): ``--members`` of them under ``sel/`` and ``--members``
ending in ``.sel`` (scattered over the key space), the rest under ``data/``. Three views:

- ``prefix``: ``object: "sel/*"`` — a small view carved out by key prefix (the target case);
- ``suffix``: ``object: "*.sel"`` — a small view without a literal prefix;
- ``all``: ``object: "*"`` with ``size >= 0`` — the whole bucket, first page of 5000.

Each listing (``GET /v1/views/{id}/objects``, msgpack as the FUSE client asks, all pages) is
timed ``--repeat`` times; prints a markdown table with median and p90 in milliseconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgpack
import pika

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from delvefs.devtools.localservices import LocalServices  # noqa: E402
from delvefs.shared.s3 import ensure_bucket, make_client, presigned_list_url  # noqa: E402
from eventhandler.devtools import HandlerProcess, spec  # noqa: E402
from eventhandler.events import make_message  # noqa: E402

BUCKET = "small-view-bench"


def keys(n_objects: int, members: int) -> list[str]:
    out = [f"sel/f{i:04d}.dat" for i in range(members)]
    step = max(1, (n_objects - 2 * members) // max(1, members))
    rest = n_objects - 2 * members
    scattered = {i * step for i in range(members)}
    for i in range(rest):
        out.append(f"data/d{i % 100:02d}/obj{i:07d}.dat")
        if i in scattered:
            out.append(f"data/d{i % 100:02d}/obj{i:07d}.sel")
    return out


def publish(url: str, names: list[str]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    base = time.time_ns()
    props = pika.BasicProperties(content_type="application/json", delivery_mode=2,
                                 headers={"minio-bucket": BUCKET})
    for i, key in enumerate(names):
        body, _ = make_message("s3:ObjectCreated:Put", BUCKET, key, base + i, size=1000, etag=f"e{i}")
        ch.basic_publish("delvefs", "", body, props)
    conn.close()


def processed(h: HandlerProcess) -> float:
    return h.metric("delvefs_events_processed_total")


def list_view(client: httpx.Client, vid: str, max_pages: int | None = None) -> int:
    after, n, pages = None, 0, 0
    while True:
        params = {"limit": 5000, **({"after": after} if after else {})}
        r = client.get(f"/v1/views/{vid}/objects", params=params)
        r.raise_for_status()
        page = msgpack.unpackb(r.content, raw=False)
        n += len(page["objects"])
        pages += 1
        if not page["next"] or (max_pages and pages >= max_pages):
            return n
        after = page["next"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="delvefs-bench-small-"))
    with LocalServices(base / "services") as svc:
        env = svc.env()
        import os
        os.environ.update(env)
        s3 = make_client()
        ensure_bucket(s3, BUCKET)
        h = HandlerProcess(env, base / "state", token=None, log_path=base / "handler.log")
        h.start()
        try:
            views = {"prefix": spec(BUCKET, object="sel/*"), "suffix": spec(BUCKET, object="*.sel"),
                     "all": spec(BUCKET, object="*", size=[0, None])}
            r = h.register(views, {BUCKET: presigned_list_url(s3, BUCKET)})
            r.raise_for_status()
            ids = {v["name"]: v["id"] for v in r.json()["views"]}
            while httpx.get(h.url + "/healthz").json()["buckets"].get(BUCKET) != "ready":
                time.sleep(0.02)
            names = keys(args.objects, args.members)
            t0 = time.perf_counter()
            publish(svc.rabbit.url, names)
            while processed(h) < len(names):
                time.sleep(0.1)
            print(f"# {len(names)} objects stored through events in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
            client = httpx.Client(base_url=h.url, timeout=120, headers={"Accept": "application/msgpack"})
            rows = []
            for name, max_pages in (("prefix", None), ("suffix", None), ("all", 1)):
                count = list_view(client, ids[name], max_pages)  # warm-up
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    list_view(client, ids[name], max_pages)
                    times.append((time.perf_counter() - t) * 1000)
                times.sort()
                rows.append((name, views[name]["object"], count, statistics.median(times),
                             times[min(len(times) - 1, int(0.9 * len(times)))]))
                print(f"# {name}: {count} objects, median {rows[-1][3]:.2f} ms", file=sys.stderr)
            client.close()
        finally:
            h.close()
    print(f"\n### Listing a view of a {len(names)}-object bucket (all pages, msgpack)\n")
    print("| view | object glob | objects listed | median | p90 |")
    print("|---|---|---:|---:|---:|")
    for name, glob, count, med, p90 in rows:
        label = name + (" (first page only)" if name == "all" else "")
        print(f"| {label} | `{glob}` | {count} | {med:.2f} ms | {p90:.2f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
