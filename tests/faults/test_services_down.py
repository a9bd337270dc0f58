"""The services around the object store fail under a pipeline: the broker stopped under a
stream of PUTs and the event handler SIGKILLed under a mount's writes. Nothing is lost: every object S3 has shows in the views within the documented bounds, no write fails
for the handler's sake, and every close that returned 0 is byte-exact in S3."""
from __future__ import annotations

import os
import threading

import pytest

from tests.waiting import wait_until

from .test_store_restart import REPAIR_BOUND, Writer, s3_keys, stack, view_keys, views  # noqa: F401

pytestmark = pytest.mark.services


def test_broker_stopped_under_a_stream_of_puts_loses_no_object(stack):
    """MinIO (no queue dir) drops the events it cannot publish while the broker is down; the
    handler reconciles once it is connected again and its queue is drained: within the
    reconnect backoff (≤ 2 s) + 3 s + one listing the view holds every object, and the repair
    counter says how many changed a view (the events that were lost)."""
    m = stack
    m.mount(views(m.bucket))
    with Writer(m.svc.env(), m.bucket) as writer:
        writer.more(50, "PUTs before the broker stops")
        m.svc.rabbit.stop()
        writer.more(50, "PUTs while the broker is down")
        m.svc.rabbit.start()
        writer.more(50, "PUTs after the broker is back")
    truth = s3_keys(m.s3, m.bucket, "runs/")
    wait_until(lambda: m.handler.http.get("/healthz").json()["amqp"] == "connected", 30, "reconnected")
    wait_until(lambda: view_keys(m.handler, m.bucket) == set(truth), REPAIR_BOUND,
               "the view holds every object S3 has")
    assert m.handler.metric("delvefs_reconcile_checks_total") >= len(truth)


def test_handler_killed_under_mount_writes_fails_no_write(stack):
    """The handler SIGKILLed and restarted on its state while a default mount writes: no
    close fails (uploads go to S3 directly), every file is byte-exact, and once the handler
    is back a fresh mount lists them all."""
    m = stack
    mp = m.mount(views(m.bucket))
    written: dict[str, bytes] = {}
    errors: list[OSError] = []
    stop = threading.Event()

    def write_files():
        i = 0
        while not stop.is_set():
            name, body = f"h{i:04d}", b"handler down %d\n" % i * 20
            try:
                (mp / "runs" / name).write_bytes(body)
            except OSError as exc:
                errors.append(exc)
                return
            written[name] = body
            i += 1

    t = threading.Thread(target=write_files, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(written) >= 30, 60, "files written before the kill")
        m.handler.kill()
        n = len(written)
        wait_until(lambda: len(written) >= n + 30 or errors, 60, "files written while it is down")
        m.handler.start()
        n = len(written)
        wait_until(lambda: len(written) >= n + 30 or errors, 60, "files written after its restart")
    finally:
        stop.set()
        t.join(60)
    assert not errors
    for name, body in written.items():
        assert m.s3.get_object(Bucket=m.bucket, Key=f"runs/{name}")["Body"].read() == body, name
    fresh = m.mount(views(m.bucket))
    wait_until(lambda: set(written) <= set(os.listdir(fresh / "runs")), REPAIR_BOUND,
               "a fresh mount lists every file written")
