"""Publishing MinIO-format messages and watching queue depths, for the handler's benchmarks."""
from __future__ import annotations

import time

import pika


def publish(url: str, msgs, exchange: str = "delvefs") -> float:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    t0 = time.perf_counter()
    for body, headers in msgs:
        ch.basic_publish(exchange, "", body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, headers=headers))
    conn.close()
    return time.perf_counter() - t0


def queue_depth(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return conn.channel().queue_declare(queue, durable=True, passive=True).method.message_count
    finally:
        conn.close()


def wait_depth(url, queue, n, timeout=120):
    deadline = time.monotonic() + timeout
    while queue_depth(url, queue) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue} never reached {n} messages")
        time.sleep(0.05)
