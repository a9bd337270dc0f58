"""The SQS event source end to end (eventhandler/sqs.py): moto in server mode plays AWS —
S3 and SQS on one loopback port, S3 delivering bucket notifications to an SQS queue — and a
real ``delvefs eventhandler --sqs-queue`` consumes them; a kernel mount whose S3 endpoint is
moto shows what is PUT through S3. Plus: a poison message lands in the dead-letter queue
(and in ``GET /v1/status``), and a notification delivered twice is applied once."""
from __future__ import annotations

import json
import os
import uuid

import pytest

from delvefs.devtools.localservices import MotoServer, ServiceError
from delvefs.shared import s3
from eventhandler.devtools import HandlerProcess

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import Mounts, fuse_available, listdir

pytestmark = [pytest.mark.services]

EVENT_DELAY = 20.0  # S3 -> SQS -> handler -> mount, generous for a loaded machine


class Aws:
    """moto, a queue with its dead-letter queue, and a handler consuming the queue."""

    def __init__(self, moto: MotoServer, handler: HandlerProcess, queue: str, dead: str):
        self.moto, self.handler, self.queue, self.dead = moto, handler, queue, dead
        self.env = moto.env()
        settings = s3.S3Settings.from_env(self.env)
        self.s3 = s3.make_client(settings)
        self.sqs = s3.make_sqs_client(queue, settings)

    def bucket(self) -> str:
        """A new bucket whose notifications go to the queue (`delvefs notify`)."""
        name = f"sqs-{uuid.uuid4().hex[:10]}"
        self.s3.create_bucket(Bucket=name)
        arn = s3.sqs_attributes(self.sqs, self.queue)["QueueArn"]
        r = Mounts(None, {}).run("notify", name, "--arn", arn, env={**os.environ, **self.env})
        assert r.returncode == 0 and arn in r.stdout, r.stderr
        return name

    def register(self, bucket: str) -> str:
        """Register a view of ``data/*`` in ``bucket`` (with a proof); its id."""
        proof = s3.presigned_list_url(self.s3, bucket, principal="default")
        resp = self.handler.register({"data": {"bucket": bucket, "object": "data/*"}}, {bucket: proof})
        assert resp.status_code == 200, resp.text
        return resp.json()["views"][0]["id"]


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    base = tmp_path_factory.mktemp("aws")
    moto = MotoServer(base / "moto")
    try:
        moto.start()
    except ServiceError as exc:
        service_unavailable(str(exc))
    handler = None
    try:
        sqs = s3.make_sqs_client(f"{moto.endpoint}/123456789012/x", s3.S3Settings.from_env(moto.env()))
        queue = sqs.create_queue(QueueName="delvefs-events")["QueueUrl"]
        dead = sqs.create_queue(QueueName="delvefs-events-dead")["QueueUrl"]
        handler = HandlerProcess(moto.env(), base / "handler-state",
                                 args=("--sqs-queue", queue, "--sqs-dead-letter-queue", dead),
                                 extra_env={"DELVEFS_SQS_POLLERS": "2"})
        try:
            handler.start()
        except RuntimeError as exc:
            service_unavailable(f"event handler on SQS: {exc}")
        yield Aws(moto, handler, queue, dead)
    finally:
        if handler is not None:
            handler.close()
        moto.stop()


def test_an_object_put_through_s3_appears_in_a_mounted_view(aws, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    bucket = aws.bucket()
    aws.s3.put_object(Bucket=bucket, Key="data/before.txt", Body=b"listed by the first scan")
    env = {**os.environ, **aws.env, "DELVEFS_HANDLER_URL": aws.handler.url,
           "DELVEFS_HANDLER_TOKEN": aws.handler.token, "DELVEFS_STATE_HOME": str(tmp_path / "state")}
    mounts = Mounts(tmp_path, env)
    try:
        mp = mounts.mount(f"""
        data:
          bucket: {bucket}
          object: "data/*"
          ttl: 0.3s
        """)
        assert wait_until(lambda: listdir(mp / "data") == ["before.txt"], EVENT_DELAY, "the first scan")
        # a key with a space and a plus: S3 sends it URL-encoded ("a+b%2Bc.txt")
        aws.s3.put_object(Bucket=bucket, Key="data/a b+c.txt", Body=b"through SQS")
        wait_until(lambda: "a b+c.txt" in (listdir(mp / "data") or []), EVENT_DELAY,
                   "the PUT's notification in the view")
        assert (mp / "data" / "a b+c.txt").read_bytes() == b"through SQS"
        aws.s3.delete_object(Bucket=bucket, Key="data/before.txt")
        wait_until(lambda: listdir(mp / "data") == ["a b+c.txt"], EVENT_DELAY, "the DELETE's notification")
    finally:
        mounts.cleanup()


def test_a_poison_message_goes_to_the_dead_letter_queue(aws):
    bucket = aws.bucket()
    aws.register(bucket)
    before = aws.handler.api.status()["dead_letters"]["count"]
    s3.sqs_send(aws.sqs, aws.queue, "this is no S3 notification")
    dead = wait_until(lambda: s3.sqs_receive(aws.sqs, aws.dead, wait=1), EVENT_DELAY, "a dead letter")
    assert dead[0]["body"] == "this is no S3 notification"
    status = wait_until(lambda: (st := aws.handler.api.status())["dead_letters"]["count"] > before and st,
                        EVENT_DELAY, "the dead letter counted")
    assert "not JSON" in status["dead_letters"]["recent"][-1]["reason"]
    assert status["source"]["kind"] == "sqs" and status["source"]["state"] == "connected"
    # the handler goes on consuming
    aws.s3.put_object(Bucket=bucket, Key="data/after-poison.txt", Body=b"x")
    vid = aws.register(bucket)
    wait_until(lambda: "data/after-poison.txt" in aws.handler.keys(vid), EVENT_DELAY, "a later event applied")


def test_a_notification_delivered_twice_is_applied_once(aws):
    bucket = aws.bucket()
    vid = aws.register(bucket)
    aws.handler.api.list_all(vid)  # the first scan is done
    aws.s3.put_object(Bucket=bucket, Key="data/once.txt", Body=b"v1")
    wait_until(lambda: "data/once.txt" in aws.handler.keys(vid), EVENT_DELAY, "the PUT applied")
    version, _ = aws.handler.list_all(vid)
    stale = aws.handler.metric("delvefs_events_stale_total")
    head = aws.s3.head_object(Bucket=bucket, Key="data/once.txt")
    record = {"eventVersion": "2.1", "eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
              "eventTime": head["LastModified"].strftime("%Y-%m-%dT%H:%M:%S.999Z"),
              "s3": {"bucket": {"name": bucket}, "object": {
                  "key": "data/once.txt", "size": 2, "eTag": head["ETag"].strip('"'),
                  "sequencer": "0055AED6DCD90281E5"}}}
    duplicate = json.dumps({"Records": [record]})
    s3.sqs_send(aws.sqs, aws.queue, duplicate)
    s3.sqs_send(aws.sqs, aws.queue, duplicate)
    # both consumed: the first may change the state (a newer event time than the one moto
    # sent), the second changes nothing
    wait_until(lambda: aws.handler.metric("delvefs_events_stale_total") >= stale + 1, EVENT_DELAY,
               "the duplicate recognised as already applied")
    changes = aws.handler.api.changes(vid, version)["changes"]
    assert len([c for c in changes if c["key"] == "data/once.txt"]) <= 1
    assert aws.handler.keys(vid) == {"data/once.txt"}


def test_two_shards_each_consume_their_own_queue(aws, tmp_path):
    """One queue per shard; `delvefs notify` wires each bucket to its owner's queue."""
    from delvefs.client.handler.api import SyncHandlerClient
    from delvefs.devtools.localservices import free_port
    from delvefs.shared.shards import ShardMap
    ports = {name: free_port() for name in ("a", "b")}
    shard_map = ShardMap.parse(",".join(f"{n}=http://127.0.0.1:{p}" for n, p in ports.items()))
    queues = {n: aws.sqs.create_queue(QueueName=f"delvefs-shard-{n}-{uuid.uuid4().hex[:6]}")["QueueUrl"]
              for n in ports}
    arns = ",".join(f"{n}={s3.sqs_attributes(aws.sqs, q)['QueueArn']}" for n, q in queues.items())
    shards = {n: HandlerProcess(aws.env, tmp_path / f"shard-{n}", port=ports[n],
                                args=("--sqs-queue", queues[n], "--shard", n, "--shard-map", shard_map.text()))
              for n in ports}
    try:
        for h in shards.values():
            try:
                h.start()
            except RuntimeError as exc:
                service_unavailable(f"event handler shard on SQS: {exc}")
        buckets = {}
        while len(buckets) < 2:
            b = f"sqs-{uuid.uuid4().hex[:10]}"
            buckets.setdefault(shard_map.owner(b), b)
        env = {**os.environ, **aws.env, "DELVEFS_HANDLER_URL": shard_map.text(), "DELVEFS_NOTIFY_ARN": arns}
        with SyncHandlerClient(shard_map.text(), "test-token") as client:
            vids = {}
            for owner, b in buckets.items():
                aws.s3.create_bucket(Bucket=b)
                r = Mounts(None, {}).run("notify", b, env=env)
                assert r.returncode == 0 and queues[owner].rsplit("/", 1)[1] in r.stdout, r.stderr
                proof = s3.presigned_list_url(aws.s3, b, principal="default")
                vids[b] = client.register("sqs-shards", [{"name": "data", "spec": {"bucket": b, "object": "data/*"}}],
                                          {b: proof})[0]["id"]
            for b in buckets.values():
                aws.s3.put_object(Bucket=b, Key="data/x.txt", Body=b"x")
            for b, vid in vids.items():
                wait_until(lambda: set(client.list_all(vid)[1]) == {"data/x.txt"}, EVENT_DELAY, f"{b} on its shard")
        for n, h in shards.items():
            answer = h.api.shard_maps()
            assert answer["buckets"] == [buckets[n]] and answer["foreign_events"] == 0
    finally:
        for h in shards.values():
            h.close()
