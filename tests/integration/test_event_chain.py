"""The foundation's proof of the chain: boto3 put -> MinIO -> RabbitMQ -> a consumer.

The consumer here is a bare pika consumer on purpose (it is the baseline the handler
is measured against); the handler itself is tested in test_handler_*.py.
"""
from __future__ import annotations

import json
import urllib.parse

import pika
import pytest

from tests.waiting import wait_until


@pytest.fixture
def event_queue(services):
    """An exclusive queue bound to the notification exchange, declared as MinIO declares it."""
    conn = pika.BlockingConnection(pika.URLParameters(services.rabbit.url))
    channel = conn.channel()
    channel.exchange_declare(services.minio.exchange, exchange_type="fanout", durable=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, services.minio.exchange)
    yield channel, queue
    conn.close()


def drain_records(channel, queue, bucket):
    records = []
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return records
        for record in json.loads(body).get("Records", []):
            if record["s3"]["bucket"]["name"] == bucket:
                records.append(record)


def test_put_object_produces_decoded_event(s3, bucket, event_queue):
    channel, queue = event_queue
    key = "runs/a b+c ü.txt"
    body = b"ACGT" * 100
    put = s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"sample": "S1"})

    seen = []
    wait_until(lambda: seen.extend(drain_records(channel, queue, bucket)) or seen,
               timeout=15, what="the ObjectCreated event")
    record = seen[0]
    assert record["eventName"].startswith("s3:ObjectCreated:")
    obj = record["s3"]["object"]
    # Keys arrive URL-encoded with '+' for space.
    assert "+" in obj["key"] and "%2B" in obj["key"]
    assert urllib.parse.unquote_plus(obj["key"]) == key
    assert obj["size"] == len(body)
    assert obj["eTag"] == put["ETag"].strip('"')
    metadata = {k.lower(): v for k, v in obj.get("userMetadata", {}).items()}
    assert metadata.get("x-amz-meta-sample") == "S1"
    assert obj["sequencer"]
    assert "tagging" not in json.dumps(obj).lower()  # tags are never in events


def test_delete_object_produces_removed_event(s3, bucket, event_queue):
    channel, queue = event_queue
    s3.put_object(Bucket=bucket, Key="gone.txt", Body=b"x")
    s3.delete_object(Bucket=bucket, Key="gone.txt")
    seen = []
    wait_until(lambda: seen.extend(drain_records(channel, queue, bucket))
               or any(r["eventName"].startswith("s3:ObjectRemoved:") for r in seen),
               timeout=15, what="the ObjectRemoved event")
    names = [r["eventName"] for r in seen]
    assert names[0].startswith("s3:ObjectCreated:")
