"""A hot standby on real MinIO and RabbitMQ: a second handler on the same state directory
stands by (503 "standby") and takes over when the active one is SIGKILLed mid-stream;
clients given both URLs follow it and nothing is lost. Two handlers on different state
directories never split the queue (single active consumer), a queue declared by an older
handler is upgraded without losing a message, and what MinIO dropped while the broker was
down is reconciled as soon as it is back."""
from __future__ import annotations

import errno
import os
import threading
import time
import uuid

import pika
import pytest

from delvefs.client.handler.api import HandlerUnavailable, SyncHandlerClient
from delvefs.shared.config import S3Settings
from delvefs.shared.s3 import ensure_bucket, make_client, presigned_list_url, wire_notifications
from eventhandler.amqp import UPGRADE_SUFFIX, queue_arguments, queue_names
from eventhandler.devtools import HandlerGroup, Publisher, spec

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import Mounts, fuse_available

pytestmark = pytest.mark.services

OBJECTS = 300
KILL_AFTER = 100  # objects written before the active handler is killed
WRITE_TIMEOUT = 120.0  # bound on writing the stream (a loaded machine)
CATCH_UP = 60.0


@pytest.fixture
def handlers(services, service_env):
    """Starts handler processes; stops them and deletes their queues afterwards."""
    group = HandlerGroup(service_env, services.rabbit.url)
    yield group.start
    group.close()


def register(client, s3, bucket: str, views: dict[str, dict]) -> dict[str, str]:
    answer = client.register("standby-test", [{"name": n, "spec": s} for n, s in views.items()],
                             {bucket: presigned_list_url(s3, bucket)})
    return {v["name"]: v["id"] for v in answer}


def bucket_keys(s3, bucket: str, prefix: str) -> set[str]:
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update(o["Key"] for o in page.get("Contents", []))
    return keys


class Writer(threading.Thread):
    """PUTs ``OBJECTS`` objects one after the other (bounded by WRITE_TIMEOUT)."""

    def __init__(self, s3, bucket: str):
        super().__init__(daemon=True)
        self.s3, self.bucket = s3, bucket
        self.written = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        deadline = time.monotonic() + WRITE_TIMEOUT
        try:
            for i in range(OBJECTS):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {i} of {OBJECTS} objects written in {WRITE_TIMEOUT} s")
                self.s3.put_object(Bucket=self.bucket, Key=f"s/k{i:04d}", Body=f"object {i}".encode())
                self.written = i + 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class Lister(threading.Thread):
    """Lists a mounted view every 20 ms until stopped: when did the mount fail (EIO)?"""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.failures: list[tuple[float, int]] = []  # (monotonic time, errno)
        self.listings = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.02):
            try:
                os.listdir(self.path)
                self.listings += 1
            except OSError as exc:
                self.failures.append((time.monotonic(), exc.errno))


@pytest.mark.fuse
def test_standby_takes_over_a_killed_handler_and_clients_follow(handlers, service_env, s3, bucket, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    state = tmp_path / "state"
    active = handlers(state)
    standby = handlers(state, standby=True, queue=active.queue)

    # the standby says what it is, and who holds the state
    r = standby.http.get("/healthz")
    assert r.status_code == 503, r.text
    assert r.json()["status"] == "standby" and r.json()["holder"]["pid"] == active.proc.pid
    assert standby.http.get("/v1/views").status_code == 503

    urls = f"{active.url},{standby.url}"
    client = SyncHandlerClient(urls, active.token, timeout=30)
    vid = register(client, s3, bucket, {"stream": spec(bucket, object="s/*")})["stream"]
    assert client.url == active.url
    # a client that lists the standby first moves on to the active handler and stays there
    reversed_client = SyncHandlerClient(f"{standby.url},{active.url}", active.token, timeout=30)
    assert reversed_client.list_page(vid, None)["objects"] == []
    assert reversed_client.url == active.url
    reversed_client.close()

    mounts = Mounts(tmp_path, {**os.environ, **service_env, "DELVEFS_HANDLER_URL": urls,
                               "DELVEFS_HANDLER_TOKEN": active.token,
                               "DELVEFS_STATE_HOME": str(tmp_path / "mount-state")})
    try:
        mp = mounts.mount(f"""
        stream:
          bucket: {bucket}
          object: "s/*"
          ttl: 0.2s
        """)
        lister = Lister(mp / "stream")
        lister.start()
        writer = Writer(s3, bucket)
        writer.start()
        wait_until(lambda: writer.written >= KILL_AFTER or writer.error, WRITE_TIMEOUT, "the first objects written")
        wait_until(lambda: client.list_page(vid, None, limit=1)["objects"], 30, "events applied by the active handler")

        killed_at = time.monotonic()
        active.kill()
        # the outage a client sees: from the kill until a request through both URLs is
        # answered by the new active handler
        wait_until(lambda: standby.role() == "active", 60, "the standby takes over", interval=0.005)
        took_over_at = time.monotonic()
        wait_until(lambda: answers(client), 30, "the client answered again", interval=0.005)
        client_back_at = time.monotonic()
        assert client.url == standby.url

        writer.join(WRITE_TIMEOUT)
        assert writer.error is None, writer.error
        expected = {k.removeprefix("s/") for k in bucket_keys(s3, bucket, "s/")}
        assert len(expected) == OBJECTS
        # the new active handler knows the view (same LevelDB): no client registers again
        wait_until(lambda: {k.removeprefix("s/") for k in client.list_all(vid)[1]} == expected,
                   CATCH_UP, "the view lists every object of the bucket")
        wait_until(lambda: set(os.listdir(mp / "stream")) == expected, CATCH_UP,
                   "the mount lists every object of the bucket")
        lister.stopping.set()
        lister.join()
        seen = [t for t, _ in lister.failures if t >= killed_at]
        mount_outage = (max(seen) - killed_at) if seen else 0.0
        print(f"\nfailover: kill -> standby active {took_over_at - killed_at:.3f} s; "
              f"-> client answered {client_back_at - killed_at:.3f} s; mount: "
              f"{len(lister.failures)} failed listings (errnos {sorted({e for _, e in lister.failures})}), "
              f"last {mount_outage:.3f} s after the kill, {lister.listings} listings")
        assert {e for _, e in lister.failures} <= {errno.EIO, errno.EAGAIN}
        assert took_over_at - killed_at < 30
        assert standby.metric("delvefs_events_dead_lettered_total") == 0
        mounts.umount(mp)
    finally:
        mounts.cleanup()
        client.close()

    # a handler standing by stops cleanly on SIGTERM
    waiting = handlers(state, standby=True, queue=active.queue)
    assert waiting.stop() == 0


def answers(client: SyncHandlerClient) -> bool:
    try:
        return client.health(timeout=1)["amqp"] == "connected"
    except HandlerUnavailable:
        return False


def test_two_handlers_on_different_state_dirs_never_split_the_queue(handlers, services, s3, bucket, tmp_path):
    first = handlers(tmp_path / "state-1")
    vid = register(first.api, s3, bucket, {"all": spec(bucket)})["all"]
    second = handlers(tmp_path / "state-2", queue=first.queue)  # a misconfiguration
    wait_until(lambda: "other consumer" in second.log_tail(200), 10, "the second handler says it gets nothing")
    pub = Publisher(services.rabbit.url)
    try:
        base = time.time_ns()
        for i in range(200):
            pub.publish("s3:ObjectCreated:Put", bucket, f"k{i:03d}", base + i, size=i, etag=f"e{i}")
        wait_until(lambda: len(first.keys(vid)) == 200, 30, "the first handler applies every event")
        assert second.metric("delvefs_events_processed_total") == 0
        assert second.metric("delvefs_events_dropped_total") == 0  # not even received
        # when the first goes, the broker makes the second the active consumer
        first.kill()
        pub.publish("s3:ObjectCreated:Put", bucket, "after", base + 1000, size=1, etag="after")
        wait_until(lambda: second.metric("delvefs_events_dropped_total") == 1, 30,
                   "the second handler receives the next event (its own state: untracked, dropped)")
    finally:
        pub.close()


def publish_waiting(pub, bucket: str, base: int) -> dict:
    """500 creations published while no handler consumes: key -> ETag."""
    expected = {}
    for i in range(500):
        pub.publish("s3:ObjectCreated:Put", bucket, f"old{i:03d}", base + i, size=i, etag=f"o{i}")
        expected[f"old{i:03d}"] = f"o{i}"
    return expected


def test_a_queue_of_an_older_handler_is_upgraded_without_losing_a_message(handlers, services, s3, bucket, tmp_path):
    state = tmp_path / "state"
    h = handlers(state)
    vid = register(h.api, s3, bucket, {"all": spec(bucket)})["all"]
    assert h.stop() == 0
    queue, dead = queue_names("delvefs", h.queue)
    pub = Publisher(services.rabbit.url)
    conn = pika.BlockingConnection(pika.URLParameters(services.rabbit.url))
    try:
        ch = conn.channel()
        # the queue as handlers before single-active-consumer declared it
        ch.queue_delete(queue)
        ch.queue_declare(queue, durable=True, arguments={"x-dead-letter-exchange": dead})
        ch.queue_bind(queue, "delvefs")
        base = time.time_ns()
        expected = publish_waiting(pub, bucket, base)  # waiting for the upgraded handler

        during = threading.Thread(target=publish_during_start, args=(services.rabbit.url, bucket, base))
        during.start()
        h2 = handlers(state, queue=h.queue)
        during.join(60)
        expected.update({f"new{i:03d}": f"n{i}" for i in range(500)})
        wait_until(lambda: {k: o["etag"] for k, o in h2.list_all(vid)[1].items()} == expected, 60,
                   "every event before and during the upgrade applied")
        assert "declared anew (classic, single-active-consumer)" in h2.log_tail(200)
        ch.queue_declare(queue, durable=True, arguments=queue_arguments(dead))  # equivalent now
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            ch.queue_declare(queue + UPGRADE_SUFFIX, durable=True, passive=True)
        assert gone.value.reply_code == 404
        assert pub.queue_count(dead) == 0
    finally:
        conn.close()
        pub.close()


def test_a_classic_queue_is_moved_to_a_quorum_queue_without_losing_a_message(handlers, services, s3, bucket,
                                                                             tmp_path):
    state = tmp_path / "state"
    h = handlers(state)
    vid = register(h.api, s3, bucket, {"all": spec(bucket)})["all"]
    assert h.stop() == 0
    queue, dead = queue_names("delvefs", h.queue)
    pub = Publisher(services.rabbit.url)
    conn = pika.BlockingConnection(pika.URLParameters(services.rabbit.url))
    try:
        base = time.time_ns()
        expected = publish_waiting(pub, bucket, base)  # waiting in the classic queue
        during = threading.Thread(target=publish_during_start, args=(services.rabbit.url, bucket, base))
        during.start()
        h2 = handlers(state, queue=h.queue, args=("--quorum-queue",))
        during.join(60)
        expected.update({f"new{i:03d}": f"n{i}" for i in range(500)})
        wait_until(lambda: {k: o["etag"] for k, o in h2.list_all(vid)[1].items()} == expected, 60,
                   "every event before and during the move applied")
        assert "declared anew (quorum, single-active-consumer)" in h2.log_tail(200)
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments=queue_arguments(dead, quorum=True))  # equivalent
        assert pub.queue_count(dead) == 0
    finally:
        conn.close()
        pub.close()


def publish_during_start(amqp_url: str, bucket: str, base: int) -> None:
    pub = Publisher(amqp_url)
    try:
        for i in range(500):
            pub.publish("s3:ObjectCreated:Put", bucket, f"new{i:03d}", base + 1000 + i, size=i, etag=f"n{i}")
    finally:
        pub.close()


def test_events_minio_dropped_while_the_broker_was_down_are_reconciled_when_it_is_back(
        private_services, tmp_path):
    """Without a queue dir MinIO drops the events it cannot publish (publisher confirms make
    it log them): the handler re-lists its buckets once the broker is back, not an hour later
    (HandlerProcess turns the periodic reconcile off)."""
    svc = private_services()
    s3 = make_client(S3Settings.from_env(svc.env()))
    bucket = f"o-{uuid.uuid4().hex[:8]}"
    ensure_bucket(s3, bucket)
    wire_notifications(s3, bucket, svc.minio.notify_arn)
    group = HandlerGroup(svc.env(), svc.rabbit.url)
    try:
        h = group.start(tmp_path / "state")
        vid = register(h.api, s3, bucket, {"all": spec(bucket)})["all"]
        s3.put_object(Bucket=bucket, Key="before", Body=b"x")
        wait_until(lambda: h.keys(vid) == {"before"}, 30, "the event before the outage applied")
        svc.rabbit.stop()
        s3.put_object(Bucket=bucket, Key="during", Body=b"x")  # its event has nowhere to go
        wait_until(lambda: h.role() == "starting", 30, "the handler noticed the broker is gone")
        svc.rabbit.start()
        wait_until(lambda: h.keys(vid) == {"before", "during"}, 60, "the object put during the outage listed")
        assert "reconciling the tracked buckets" in h.log_tail(5000)
    finally:
        group.close()
