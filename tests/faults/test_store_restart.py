"""The object store fails under a pipeline: MinIO SIGKILLed and restarted while objects are
written (through boto3, a default mount and an eager mount), and events lost. Afterwards
nothing is missing: every object S3 has shows in the handler's views and in a fresh mount
within the bound docs/SEMANTICS.md states (the store watch's settle and probe, then one
reconcile), and `delvefs sync` returns 0 once S3 has the bytes, whether their events came or
not."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from delvefs.shared import s3 as s3api
from delvefs.shared.config import S3Settings
from tests.integration.mounts import close_private_stack, private_stack
from tests.waiting import wait_until

pytestmark = pytest.mark.services

# after the store answers again: the probe interval (2 s) + the settle (3 s) + a reconcile of
# a few hundred objects; generous for a loaded 2-core machine
REPAIR_BOUND = 60.0


def views(bucket: str) -> str:
    return f"""
    runs:
      bucket: {bucket}
      object: "runs/*"
      ttl: 1s
    """


def s3_keys(client, bucket: str, prefix: str) -> dict[str, str]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.update({o["Key"]: o["ETag"].strip('"') for o in page.get("Contents", [])})
    return out


def view_keys(handler, bucket: str) -> set[str]:
    vids = [v["id"] for v in handler.http.get("/v1/status").json()["views"] if v["bucket"] == bucket]
    out: set[str] = set()
    for vid in vids:
        out |= set(handler.keys(vid))
    return out


class Writer(threading.Thread):
    """PUTs runs/w0000, runs/w0001, ... with boto3 as a pipeline would: a PUT that fails is
    tried again (same key) until the store takes it."""

    def __init__(self, env: dict, bucket: str):
        super().__init__(daemon=True)
        self.client = s3api.make_client(S3Settings.from_env(env), retries=1, connect_timeout=1,
                                        read_timeout=5)
        self.bucket = bucket
        self.done: list[str] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"runs/w{i:04d}"
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=b"w%d" % i)
            except Exception:  # noqa: BLE001 — the store is down: the same key again
                self.failures += 1
                self.stop.wait(0.05)
                continue
            self.done.append(key)
            i += 1

    def more(self, n: int, what: str) -> None:
        """Wait until ``n`` more PUTs than now have returned."""
        start = len(self.done)
        wait_until(lambda: len(self.done) >= start + n, 60, what)

    def __enter__(self) -> "Writer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join(30)


@pytest.fixture
def stack(private_services, tmp_path):
    m = private_stack(private_services, tmp_path)
    yield m
    close_private_stack(m)


def test_minio_killed_under_writes_every_object_shows_in_a_fresh_mount(stack):
    m = stack
    first = m.mount(views(m.bucket))  # registers the view: the handler tracks the bucket
    with Writer(m.svc.env(), m.bucket) as writer:
        writer.more(100, "100 PUTs before the kill")
        m.svc.minio.kill()
        wait_until(lambda: writer.failures > 0, 30, "PUTs failing while the store is down")
        m.svc.minio.start()
        # the PUTs of the store's first moments are the ones MinIO sends no event for
        writer.more(200, "200 PUTs after the restart")
    truth = s3_keys(m.s3, m.bucket, "runs/")
    assert set(writer.done) <= set(truth)
    wait_until(lambda: view_keys(m.handler, m.bucket) >= set(truth), REPAIR_BOUND,
               "the handler's view holds every object S3 has")
    assert m.handler.metric("delvefs_store_outages_total") >= 1
    fresh = m.mount(views(m.bucket))
    names = {f"runs/{n}" for n in os.listdir(fresh / "runs")}
    assert names == set(truth)
    wait_until(lambda: {f"runs/{n}" for n in os.listdir(first / "runs")} == set(truth), 10,
               "the mount that was up throughout lists them too")


def test_sync_returns_once_s3_has_the_bytes_even_without_their_events(stack):
    """The bucket's events stop (as they do for the PUTs of a restarting MinIO's first
    moments): files written through the mount are in S3, and `delvefs sync` asks the handler,
    which checks the keys in S3 and applies them — exit 0, and another mount lists them."""
    m = stack
    mp = m.mount(views(m.bucket))
    m.s3.put_bucket_notification_configuration(Bucket=m.bucket, NotificationConfiguration={})
    for i in range(20):
        (mp / "runs" / f"quiet{i:02d}").write_bytes(b"q%d" % i)
    r = m.run("sync", str(mp))
    assert r.returncode == 0, r.stderr
    assert m.handler.metric("delvefs_reconcile_repairs_total") >= 20
    other = m.mount(views(m.bucket))
    assert sorted(os.listdir(other / "runs")) == [f"quiet{i:02d}" for i in range(20)]


@pytest.mark.parametrize("mode", ["default", "eager"])
def test_mount_writes_across_a_minio_kill_land_whole(stack, mode):
    """A mount writes files while MinIO is SIGKILLed and restarted. Default mode: a close
    during the outage fails (EIO) and the writer writes the file again, as a pipeline's retry
    would; eager mode: every close returns 0 and the uploads wait for the store. Then `delvefs
    sync` returns 0, every file whose close returned 0 is byte-exact in S3, and a fresh mount
    lists them all."""
    m = stack
    extra = ("--eager",) if mode == "eager" else ()
    mp = m.mount(views(m.bucket), *extra)
    written: dict[str, bytes] = {}
    failed_closes = 0
    stop = threading.Event()
    killed = threading.Event()

    def write_files():
        nonlocal failed_closes
        i = 0
        while not stop.is_set():
            name = f"m{i:04d}"
            body = (b"%s %d " % (mode.encode(), i)) * 50
            try:
                with open(mp / "runs" / name, "wb") as f:
                    f.write(body)
            except OSError as exc:
                assert exc.errno in (errno.EIO, errno.EAGAIN, errno.ETIMEDOUT), exc
                failed_closes += 1
                stop.wait(0.1)
                continue  # the same file again
            written[name] = body
            i += 1

    t = threading.Thread(target=write_files, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(written) >= 30, 60, "files written before the kill")
        m.svc.minio.kill()
        killed.set()
        n = len(written)
        if mode == "eager":
            wait_until(lambda: len(written) >= n + 20, 60, "eager closes while the store is down")
        else:
            wait_until(lambda: failed_closes > 0, 60, "a default close failing while the store is down")
        m.svc.minio.start()
        n = len(written)
        wait_until(lambda: len(written) >= n + 30, 60, "files written after the restart")
    finally:
        stop.set()
        t.join(60)
    r = m.run("sync", str(mp), timeout=180)
    assert r.returncode == 0, r.stderr
    for name, body in written.items():
        got = m.s3.get_object(Bucket=m.bucket, Key=f"runs/{name}")["Body"].read()
        assert got == body, name
    fresh = m.mount(views(m.bucket))
    wait_until(lambda: set(written) <= set(os.listdir(fresh / "runs")), REPAIR_BOUND,
               "a fresh mount lists every file written")
