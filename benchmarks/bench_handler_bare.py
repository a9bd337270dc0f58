"""Baseline for bench_handler.py: a bare pika consumer (json.loads + one multiple-ack per
batch, the same batching loop and prefetch as the handler) draining COUNT messages.

    .venv/bin/python benchmarks/bench_handler_bare.py AMQP_URL QUEUE COUNT [latency]

Prints one JSON line: {"count", "seconds", "rate", "cpu_s"} measured from the first message
to the ack of the last (the same window bench_handler.py measures for the handler); with
``latency``, also percentiles of receive time minus the event's sequencer (= publish time).
"""
from __future__ import annotations

import gc
import json
import sys
import time

import pika


def main(url: str, queue: str, count: int, prefetch: int = 4000, max_batch: int = 2000,
         latency: bool = False) -> dict:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    buf = []
    ch.basic_consume(queue, lambda _c, m, p, b: buf.append((m.delivery_tag, p, b)))
    if latency:  # as the handler's client in bench_handler.py: no collector pauses
        gc.collect()
        gc.freeze()
        gc.disable()
    done = 0
    t_first = None
    lat: list[int] = []
    while done < count:
        conn.process_data_events(time_limit=0.2)
        # take what is already here: keep reading while the socket delivers a backlog (big
        # batches under load), stop at a trickle (waiting for one would add latency)
        deadline = time.monotonic() + 0.02
        while buf and len(buf) < max_batch and time.monotonic() < deadline:
            n = len(buf)
            conn.process_data_events(time_limit=0)
            if len(buf) - n < 8:
                break
        if not buf:
            continue
        if t_first is None:
            t_first, cpu_first = time.perf_counter(), time.process_time()
        for _tag, _props, body in buf:
            doc = json.loads(body)
            if latency:  # the crafted events' sequencer is their publish time in ns
                lat.append(time.time_ns() - int(doc["Records"][0]["s3"]["object"]["sequencer"], 16))
        ch.basic_ack(buf[-1][0], multiple=True)
        done += len(buf)
        buf.clear()
    dt = time.perf_counter() - t_first
    cpu = time.process_time() - cpu_first
    conn.close()
    out = {"count": done, "seconds": dt, "rate": done / dt, "cpu_s": cpu}
    if latency:
        lat.sort()
        out["latency_ms"] = {str(p): lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6
                             for p in (0.5, 0.9, 0.99, 0.999, 1.0)}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                          latency=len(sys.argv) > 4 and sys.argv[4] == "latency")))
