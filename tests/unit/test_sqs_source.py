"""The SQS event source's parsing of S3 notifications and its batch contract (delete after
commit, dead letters), with a fake engine and a fake SQS client (eventhandler/sqs.py)."""
from __future__ import annotations

import json

import pytest

from eventhandler import sqs
from eventhandler.events import CREATE, REMOVE, InvalidEvent
from eventhandler.metrics import Metrics
from eventhandler.statedb import StorageError

QUEUE = "https://sqs.eu-west-1.amazonaws.com/123456789012/delvefs"
DEAD = "https://sqs.eu-west-1.amazonaws.com/123456789012/delvefs-dead"


def aws_record(name="ObjectCreated:Put", bucket="runs", key="a+b%2Bc.txt", when="2026-01-02T03:04:05.678Z",
               **obj) -> dict:
    """A record as AWS S3 writes it: event name without ``s3:``, an opaque sequencer."""
    return {"eventVersion": "2.1", "eventSource": "aws:s3", "eventTime": when, "eventName": name,
            "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": 5, "eTag": "abc",
                                                          "sequencer": "0055AED6DCD90281E5", **obj}}}


def body(*records) -> str:
    return json.dumps({"Records": list(records)})


def test_aws_records_are_decoded_and_ordered_by_event_time():
    (ev,) = sqs.parse_body(body(aws_record()))
    assert (ev.kind, ev.bucket, ev.key, ev.size, ev.etag) == (CREATE, "runs", "a b+c.txt", 5, "abc")
    # the sequencer compared with other events and listings: eventTime in ns (ms precision)
    assert ev.seq == 1767323045678 * 1_000_000
    (later,) = sqs.parse_body(body(aws_record("ObjectRemoved:Delete", when="2026-01-02T03:04:05.679Z")))
    assert later.kind == REMOVE and later.seq > ev.seq


def test_minio_sequencers_and_names_are_kept():
    (ev,) = sqs.parse_body(body(aws_record("s3:ObjectCreated:Put", sequencer="1872A5B0C0D0E0F0")))
    assert ev.seq == 0x1872A5B0C0D0E0F0


def test_test_event_sns_wrapping_and_skipped_kinds():
    with pytest.raises(sqs.TestEvent):
        sqs.parse_body(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "runs"}))
    wrapped = json.dumps({"Type": "Notification", "Message": body(aws_record())})
    assert [e.key for e in sqs.parse_body(wrapped)] == ["a b+c.txt"]
    assert sqs.parse_body(body(aws_record("ObjectTagging:Put"), aws_record("ObjectRestore:Completed"))) == []
    (expired,) = sqs.parse_body(body(aws_record("LifecycleExpiration:Delete")))
    assert expired.kind == REMOVE


@pytest.mark.parametrize("text", ["not json", "[1]", json.dumps({"Records": []}),
                                  body({"eventName": 3}), body(aws_record(when="yesterday")),
                                  body(aws_record(key=None))])
def test_unusable_bodies_are_invalid(text):
    with pytest.raises(InvalidEvent):
        sqs.parse_body(text)


class FakeEngine:
    def __init__(self, tracked=("runs",), fail=None):
        self.tracked = frozenset(tracked)
        self.applied = []
        self.fail = fail  # exception raised by apply_events

    def apply_events(self, events):
        if self.fail is not None:
            raise self.fail
        self.applied.extend(events)


class FakeSqs:
    """Records deletes, sends and visibility changes (the calls delvefs.shared.s3 makes)."""

    def __init__(self):
        self.deleted, self.sent, self.hidden = [], [], []

    def delete_message_batch(self, QueueUrl, Entries):
        self.deleted += [e["ReceiptHandle"] for e in Entries]
        return {}

    def send_message(self, QueueUrl, MessageBody, MessageAttributes=None):
        self.sent.append((QueueUrl, MessageBody, MessageAttributes["delvefs-error"]["StringValue"]))

    def change_message_visibility_batch(self, QueueUrl, Entries):
        self.hidden += [(e["ReceiptHandle"], e["VisibilityTimeout"]) for e in Entries]


def messages(*bodies):
    return [{"id": str(i), "receipt": f"r{i}", "body": b, "receives": 1} for i, b in enumerate(bodies)]


def consumer(engine, dead=DEAD):
    return sqs.SqsConsumer(QUEUE, engine, Metrics(), dead_letter_url=dead, client_factory=FakeSqs)


def test_a_batch_is_applied_then_deleted_and_poison_goes_to_the_dead_letters():
    engine, client = FakeEngine(), FakeSqs()
    c = consumer(engine)
    test_event = json.dumps({"Event": "s3:TestEvent", "Bucket": "runs"})
    c._handle(client, messages(body(aws_record()), "garbage", body(aws_record(bucket="other")), test_event))
    assert [e.key for e in engine.applied] == ["a b+c.txt"]
    assert sorted(client.deleted) == ["r0", "r1", "r2", "r3"]  # the poison one after it was sent
    assert client.sent == [(DEAD, "garbage", client.sent[0][2])] and "not JSON" in client.sent[0][2]
    count, recent = c.metrics.dead_letters.snapshot()
    assert count == 1 and "not JSON" in recent[0]["reason"]


def test_without_a_dead_letter_queue_poison_stays_in_the_queue_hidden():
    engine, client = FakeEngine(), FakeSqs()
    consumer(engine, dead=None)._handle(client, messages("garbage", body(aws_record())))
    assert client.deleted == ["r1"] and client.hidden == [("r0", sqs.KEEP_UNUSABLE)]


def test_events_that_fail_to_apply_are_dead_lettered_one_message_at_a_time():
    engine, client = FakeEngine(fail=ValueError("boom")), FakeSqs()
    consumer(engine)._handle(client, messages(body(aws_record())))
    assert client.deleted == ["r0"] and "boom" in client.sent[0][2]


def test_a_failed_state_write_deletes_and_dead_letters_nothing():
    engine, client = FakeEngine(fail=StorageError("disk full")), FakeSqs()
    with pytest.raises(StorageError):
        consumer(engine)._handle(client, messages(body(aws_record()), "garbage"))
    assert client.deleted == [] and client.sent == []


def test_queue_urls_name_their_service_and_region(monkeypatch):
    from delvefs.shared import s3
    monkeypatch.delenv("AWS_ENDPOINT_URL_SQS", raising=False)
    assert s3.sqs_endpoint(QUEUE) == ("https://sqs.eu-west-1.amazonaws.com", "eu-west-1")
    with pytest.raises(ValueError):
        sqs.SqsConsumer("sqs://nowhere", FakeEngine(), Metrics())
