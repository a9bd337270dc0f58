"""The handler survives what production throws at it: SIGKILL mid-stream, a RabbitMQ
restart underneath it, events racing a bucket's first scan, notifications that never came
(reconcile), and restarts that must keep views and clients' versions."""
from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from delvefs.shared.config import S3Settings
from delvefs.shared.s3 import ensure_bucket, make_client, presigned_list_url, wire_notifications
from eventhandler.devtools import HandlerProcess, Publisher, spec
from tests.waiting import wait_until

pytestmark = pytest.mark.services


@pytest.fixture
def handler(services, service_env, tmp_path):
    started = []

    def start(env=None, state_dir=None, **kw):
        h = HandlerProcess(env or service_env, state_dir or tmp_path / f"state{len(started)}", **kw)
        started.append(h)
        return h.start()

    yield start
    for h in started:
        h.close()
    pub = Publisher(services.rabbit.url)
    pub.delete_queue(*{h.queue for h in started})
    pub.close()


def register(h, s3, views):
    r = h.register(views, {b: presigned_list_url(s3, b) for b in {v["bucket"] for v in views.values()}})
    assert r.status_code == 200, r.text
    return {v["name"]: v["id"] for v in r.json()["views"]}


def listing(s3, bucket) -> dict[str, str]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        out.update({o["Key"]: o["ETag"].strip('"') for o in page.get("Contents", [])})
    return out


def view_state(h, vid) -> dict[str, str]:
    return {k: o["etag"] for k, o in h.list_all(vid)[1].items()}


def test_sigkill_mid_stream_loses_nothing(handler, services, s3, bucket, tmp_path):
    h = handler()
    vid = register(h, s3, {"all": spec(bucket), "even": spec(bucket, object="*[02468]")})
    pub = Publisher(services.rabbit.url)
    rng = random.Random(7)
    base = time.time_ns()
    expected: dict[str, str] = {}
    n = 6000
    for i in range(n):
        key = f"k{rng.randrange(800):04d}"
        seq = base + i * 1000
        if rng.random() < 0.2:
            pub.publish("s3:ObjectRemoved:Delete", bucket, key, seq)
            expected.pop(key, None)
        else:
            pub.publish("s3:ObjectCreated:Put", bucket, key, seq, size=i, etag=f"e{i}")
            expected[key] = f"e{i}"
        if i == 1500:
            wait_until(lambda: h.metric("delvefs_events_processed_total") > 0, 10, "first events applied")
            h.stop(signal.SIGKILL)
    pub.publish("s3:ObjectCreated:Put", bucket, "zz-end", base + n * 1000, size=1, etag="end")
    expected["zz-end"] = "end"
    pub.close()
    h2 = handler(state_dir=h.state_dir, queue=h.queue)  # same state, same queue
    # the events the killed handler had received but not acknowledged come again, after
    # the newer ones on a busy machine: wait for all of them, not for the last published
    wait_until(lambda: view_state(h2, vid["all"]) == expected, 60, "all events consumed after restart")
    assert view_state(h2, vid["all"]) == expected
    assert set(view_state(h2, vid["even"])) == {k for k in expected if k[-1] in "02468"}


def test_a_full_disk_stops_the_handler_and_loses_nothing(handler, services, s3, bucket):
    """LevelDB writes start failing (a file size limit: EFBIG, as on a full disk): the handler
    dead-letters nothing, acks nothing it did not write, exits 3 with a log line; restarted
    with room, it applies every event."""
    h = handler(file_size_limit=512 * 1024)
    vid = register(h, s3, {"all": spec(bucket)})
    pub = Publisher(services.rabbit.url)
    base = time.time_ns()
    expected = {}
    for i in range(4000):  # ~2 MB of LevelDB log: well past the limit
        key = f"k{i:05d}/" + "x" * 200
        pub.publish("s3:ObjectCreated:Put", bucket, key, base + i, size=i, etag=f"e{i}")
        expected[key] = f"e{i}"
    wait_until(lambda: h.proc.poll() is not None, 60, "the handler stopped on the write error")
    assert h.proc.returncode == 3, h.log_tail()
    assert "writing the state failed" in h.log_tail(200)
    assert pub.queue_count(f"{h.queue}.dead") == 0
    assert pub.queue_count(h.queue) > 0  # what it could not write waits for it
    pub.close()
    h2 = handler(state_dir=h.state_dir, queue=h.queue)  # same state and queue, room to write
    wait_until(lambda: len(h2.keys(vid["all"])) == len(expected), 60, "every event applied after the restart")
    assert view_state(h2, vid["all"]) == expected
    assert h2.metric("delvefs_events_dead_lettered_total") == 0


def test_rabbitmq_restart_under_the_handler(handler, private_services, tmp_path):
    svc = private_services(queue_dir=True)  # MinIO keeps events while the broker is down
    env = svc.env()
    s3 = make_client(S3Settings.from_env(env))
    bucket = f"r-{uuid.uuid4().hex[:8]}"
    ensure_bucket(s3, bucket)
    wire_notifications(s3, bucket, svc.minio.notify_arn)
    h = handler(env={**env})
    vid = register(h, s3, {"all": spec(bucket)})["all"]
    s3.put_object(Bucket=bucket, Key="before", Body=b"x")
    wait_until(lambda: h.keys(vid) == {"before"}, 10, "before restart")
    svc.rabbit.restart()
    s3.put_object(Bucket=bucket, Key="after", Body=b"x")
    wait_until(lambda: h.http.get("/healthz").json()["amqp"] == "connected", 30, "reconnected")
    wait_until(lambda: h.keys(vid) == {"before", "after"}, 60, "caught up after the restart")
    s3.delete_object(Bucket=bucket, Key="before")
    wait_until(lambda: h.keys(vid) == {"after"}, 30, "live again")


def test_minio_down_during_a_first_scan_is_retried(handler, private_services):
    """S3 goes away while a bucket is scanned the first time: the bucket says so in /healthz
    and stays "scanning" (views answer 503), the scan is retried with backoff, and once
    MinIO is back the bucket becomes ready with every object."""
    svc = private_services()
    env = svc.env()
    s3 = make_client(S3Settings.from_env(env))
    bucket = f"r-{uuid.uuid4().hex[:8]}"
    ensure_bucket(s3, bucket)
    with ThreadPoolExecutor(16) as pool:  # 3 pages: no scan ends in the moment before the stop
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"o{i:05d}", Body=b""), range(3000)))
    h = handler(env={**env})
    vid = register(h, s3, {"all": spec(bucket)})["all"]
    svc.minio.stop()
    wait_until(lambda: bucket in h.http.get("/healthz").json().get("scan_errors", {}), 60,
               "the failed scan reported")
    health = h.http.get("/healthz").json()
    assert health["status"] == "degraded" and health["buckets"][bucket] == "scanning"
    assert h.http.get(f"/v1/views/{vid}/objects", params={"wait": 0}).status_code == 503
    svc.minio.start()
    wait_until(lambda: h.http.get("/healthz").json()["buckets"][bucket] == "ready", 120,
               "the retried scan finished")
    assert len(h.keys(vid)) == 3000
    assert "scan_errors" not in h.http.get("/healthz").json()
    assert h.metric("delvefs_scan_failures_total") >= 1


def test_scan_while_events_arrive_ends_consistent(handler, s3, bucket):
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"obj{i:05d}", Body=b"x" * (i % 7)),
                      range(3000)))
    h = handler()
    stop = threading.Event()

    def churn():
        c = make_client()
        rng = random.Random(3)
        while not stop.is_set():
            i = rng.randrange(3500)
            if rng.random() < 0.4:
                c.delete_object(Bucket=bucket, Key=f"obj{i:05d}")
            else:
                c.put_object(Bucket=bucket, Key=f"obj{i:05d}", Body=b"y" * rng.randrange(9))

    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(churn) for _ in range(4)]
        time.sleep(0.2)  # let churn start before the scan (not a wait for a result)
        vid = register(h, s3, {"all": spec(bucket)})["all"]
        wait_until(lambda: h.http.get("/healthz").json()["buckets"][bucket] == "ready", 60, "scan done")
        stop.set()
        for f in futs:
            f.result()
    truth = listing(s3, bucket)
    wait_until(lambda: view_state(h, vid) == truth, 30, "view equals a fresh listing")


def test_reconcile_repairs_missed_notifications_and_state_survives_restart(handler, s3, bucket):
    h = handler()
    vid = register(h, s3, {"all": spec(bucket)})["all"]
    for k in ("keep", "drop"):
        s3.put_object(Bucket=bucket, Key=k, Body=b"x")
    wait_until(lambda: h.keys(vid) == {"keep", "drop"}, 10, "created")
    version = h.list_all(vid)[0]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={})
    s3.delete_object(Bucket=bucket, Key="drop")
    s3.put_object(Bucket=bucket, Key="unseen", Body=b"x")
    from delvefs.shared.config import notify_arn
    wire_notifications(s3, bucket, notify_arn())
    r = h.http.post("/v1/reconcile", params={"bucket": bucket})
    assert r.status_code == 200, r.text
    assert h.keys(vid) == {"keep", "unseen"}
    changes = h.http.get(f"/v1/views/{vid}/changes", params={"since": version}).json()["changes"]
    assert sorted((c["op"], c["key"]) for c in changes) == [("delete", "drop"), ("put", "unseen")]
    assert h.http.post("/v1/reconcile", params={"bucket": "nope-not-tracked"}).status_code == 404
    # restart: views, listing and the client's version survive; no re-registration needed
    assert h.stop() == 0  # clean exit on SIGTERM
    h2 = handler(state_dir=h.state_dir, queue=h.queue)
    assert h2.keys(vid) == {"keep", "unseen"}
    v2 = h2.list_all(vid)[0]
    assert h2.http.get(f"/v1/views/{vid}/changes", params={"since": version}).status_code == 200
    s3.put_object(Bucket=bucket, Key="later", Body=b"x")
    r = h2.http.get(f"/v1/views/{vid}/changes", params={"since": v2, "wait": 10}).json()
    assert [(c["op"], c["key"]) for c in r["changes"]] == [("put", "later")]
