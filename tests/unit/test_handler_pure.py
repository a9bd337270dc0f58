"""Pure pieces of the handler: MinIO event parsing, sequencer order, LevelDB key layout and records."""
from __future__ import annotations

from datetime import datetime

import orjson
import pytest

from eventhandler import records
from eventhandler import statedb as st
from eventhandler.events import (CREATE, REMOVE, TAGGING, InvalidEvent, event_kind, make_message,
                                 message_bucket, parse_message, parse_sequencer, seq_newer)

# verbatim from the pinned MinIO (see eventhandler/events.py), trimmed of source/identity fields
MINIO_PUT = b'''{"EventName":"s3:ObjectCreated:Put","Key":"probe/a b+c.txt","Records":[{"eventVersion":"2.0",
"eventSource":"minio:s3","awsRegion":"","eventTime":"2026-11-21T05:46:29.691Z","eventName":"s3:ObjectCreated:Put",
"s3":{"s3SchemaVersion":"1.0","configurationId":"Config","bucket":{"name":"probe","arn":"arn:aws:s3:::probe"},
"object":{"key":"a+b%2Bc.txt","size":5,"eTag":"5d41402abc4b2a76b9719d911017c592","contentType":"binary/octet-stream",
"userMetadata":{"X-Amz-Meta-Color":"red","content-type":"binary/octet-stream"},"sequencer":"18E9F94250012594"}}}]}'''
MINIO_DELETE = b'''{"EventName":"s3:ObjectRemoved:Delete","Key":"probe/a b+c.txt","Records":[{"eventVersion":"2.0",
"eventTime":"2026-11-21T05:46:29.754Z","eventName":"s3:ObjectRemoved:Delete","s3":{"bucket":{"name":"probe"},
"object":{"key":"a+b%2Bc.txt","sequencer":"18E9F94253DF7150"}}}]}'''


def test_parse_minio_put():
    (ev,) = parse_message(MINIO_PUT)
    assert ev.kind == CREATE and ev.bucket == "probe" and ev.key == "a b+c.txt"
    assert ev.size == 5 and ev.etag == "5d41402abc4b2a76b9719d911017c592"
    assert ev.metadata == {"color": "red"}
    assert ev.seq == 0x18E9F94250012594
    # the sequencer is the ModTime in ns: the same instant as eventTime 05:46:29.69
    assert abs(ev.mtime - datetime.fromisoformat("2026-11-21T05:46:29.691+00:00").timestamp()) < 0.01


def test_parse_minio_delete_and_order():
    (put,) = parse_message(MINIO_PUT)
    (delete,) = parse_message(MINIO_DELETE)
    assert delete.kind == REMOVE and delete.key == "a b+c.txt"
    assert seq_newer(delete.seq, put.seq) and not seq_newer(put.seq, delete.seq)
    assert seq_newer(put.seq, None)


@pytest.mark.parametrize("name,kind", [
    ("s3:ObjectCreated:Put", CREATE), ("s3:ObjectCreated:Copy", CREATE),
    ("s3:ObjectCreated:CompleteMultipartUpload", CREATE), ("s3:ObjectCreated:PutTagging", TAGGING),
    ("s3:ObjectCreated:DeleteTagging", TAGGING), ("s3:ObjectRemoved:DeleteTagging", TAGGING),
    ("s3:ObjectRemoved:Delete", REMOVE), ("s3:ObjectRemoved:DeleteMarkerCreated", REMOVE),
    ("s3:ObjectRemoved:NoOP", REMOVE)])
def test_event_kinds(name, kind):
    assert event_kind(name) == kind


def test_sequencer_compare_as_integers():
    # equal-length hex compares like integers; shorter hex is left-padded
    assert parse_sequencer("0F") < parse_sequencer("10")
    assert parse_sequencer("00000000000000FF") == parse_sequencer("FF")
    assert parse_sequencer("18E9F94253DF7150") > parse_sequencer("18E9F94250012594")
    for bad in ("", "xyz", None, 5, "F" * 17, " 1", "-1", "0x1"):
        with pytest.raises(InvalidEvent):
            parse_sequencer(bad)


@pytest.mark.parametrize("body", [
    b"\x00garbage", b"[]", b"{}", b'{"Records": []}', b'{"Records": [1]}',
    b'{"Records": [{"eventName": "s3:ObjectCreated:Put"}]}',
    b'{"Records": [{"eventName": "s3:Other", "s3": {"bucket": {"name": "b"}, "object": {"key": "k", "sequencer": "1"}}}]}',
    b'{"Records": [{"eventName": "s3:ObjectCreated:Put", "s3": {"bucket": {"name": "b"}, "object": {"key": "k", "sequencer": "1", "size": -1}}}]}',
])
def test_invalid_messages(body):
    with pytest.raises(InvalidEvent):
        parse_message(body)


def test_crafted_messages_round_trip():
    body, headers = make_message("s3:ObjectCreated:Put", "bkt", "dir/a b+c%.txt", 0x18E9F94250012594,
                                 size=7, etag="e", metadata={"color": "red"})
    assert message_bucket(headers) == "bkt" and message_bucket({"minio-bucket": b"bkt"}) == "bkt"
    assert message_bucket(None) is None
    (ev,) = parse_message(body)
    assert (ev.bucket, ev.key, ev.size, ev.etag, ev.metadata) == ("bkt", "dir/a b+c%.txt", 7, "e", {"color": "red"})
    assert orjson.loads(body)["Records"][0]["s3"]["object"]["key"] == "dir/a+b%2Bc%25.txt"


def test_key_layout():
    vid = "3f9c0e1d2a4b5c6d"
    assert records.k_view(vid) == b"V" + bytes.fromhex(vid)
    assert records.k_obj("b", "a/b") == b"ob\x00a/b"
    assert records.split_obj_key(records.k_obj("bucket", "x\u00e9/y")) == ("bucket", "x\u00e9/y")
    # change-log keys sort numerically by version
    versions = [1, 255, 256, 2**40, 2**63]
    assert sorted(records.k_change("b", v) for v in versions) == [records.k_change("b", v) for v in versions]
    # a bucket's prefix never covers another bucket whose name extends it
    assert not records.k_obj("ab", "x").startswith(records.obj_prefix("a"))
    assert st._prefix_end(b"o\xff\xff") == b"p" and st._prefix_end(b"ab") == b"ac"
    rec = records.new_object(5, 10, 1.5, "e", None, {})
    assert records.unpackb(records.packb(rec)) == rec


def test_store_iterators(tmp_path):
    s = st.Store(str(tmp_path / "db"))
    try:
        wb = s.batch()
        for key in ("a", "b", "c", "d"):
            wb.put(records.k_obj("bk", key), records.packb(records.new_object(1, 1, 1.0, key, None, {})))
        wb.put(records.k_obj("bk2", "a"), records.packb(records.new_object(1, 1, 1.0, "other", None, {})))
        for v in (3, 7, 9):
            wb.put(records.k_change("bk", v), records.packb([f"k{v}", 0, [], [], 0, 0.0, ""]))
        s.write(wb)
        assert [k for k, _ in s.iter_objects("bk")] == ["a", "b", "c", "d"]
        assert [k for k, _ in s.iter_objects("bk", after="a", upto="c")] == ["b", "c"]
        assert [k for k, _ in s.iter_objects("bk", after="c")] == ["d"]
        assert [k for k, _ in s.iter_objects("bk", after=None, upto="b")] == ["a", "b"]
        assert [v for v, _ in s.iter_changes("bk", 3)] == [7, 9]
    finally:
        s.close()
    with pytest.raises(RuntimeError):  # wrong schema is refused, not misread
        import plyvel
        db = plyvel.DB(str(tmp_path / "db"))
        db.put(b"Sschema", records.packb(99))
        db.close()
        st.Store(str(tmp_path / "db"))


def test_store_membership_index_groups_and_merge(tmp_path):
    s = st.Store(str(tmp_path / "db"))
    # bitmaps with NUL and 0xFF bytes, of different lengths (the group's length prefix
    # keeps one group's keys from running into another's)
    groups = {b"\x01": ["b", "d", "ü/1"], b"\x03": ["a", "c"], b"\x00\x01": ["e"],
              b"\xff": ["f", "g"], b"\xff\xff": ["h"], b"\x01\xff": ["0"]}
    try:
        wb = s.batch()
        for g, ks in groups.items():
            for key in ks:
                wb.put(records.k_member("bk", g, key), records.packb([len(key), 1.0, key]))
        wb.put(records.k_member("bk2", b"\x01", "zz"), records.packb([0, 0.0, "other"]))
        wb.put(records.k_member("bj", b"\x01", "zz"), records.packb([0, 0.0, "other"]))
        s.write(wb)
        assert sorted(s.member_groups("bk")) == sorted(groups)
        assert s.member_groups("bk2") == [b"\x01"]
        assert s.member_groups("none") == []

        def keys(gs, after=None):
            return [k for k, _ in s.iter_members("bk", gs, after)]
        every = sorted(k for ks in groups.values() for k in ks)
        assert keys(list(groups)) == every  # merged in key order (ü after ASCII)
        assert keys(list(groups), after="c") == [k for k in every if k > "c"]
        assert keys([b"\xff", b"\x03"]) == ["a", "c", "f", "g"]
        assert keys([b"\xff"], after="f") == ["g"]
        assert keys([]) == []
        assert dict(s.iter_members("bk", [b"\x01"])) == {"b": [1, 1.0, "b"], "d": [1, 1.0, "d"],
                                                           "ü/1": [3, 1.0, "ü/1"]}
    finally:
        s.close()


def test_a_schema_1_state_gets_its_membership_index(tmp_path):
    import plyvel
    db = plyvel.DB(str(tmp_path / "db"), create_if_missing=True)
    db.put(b"Sschema", records.packb(1))
    for key, slots in (("in", b"\x05"), ("out", b""), ("also", b"\x01")):
        rec = records.new_object(1, 7, 2.0, "e-" + key, None, {})
        rec[records.OBJ_SLOTS] = slots
        db.put(records.k_obj("bk", key), records.packb(rec))
    db.close()
    s = st.Store(str(tmp_path / "db"))
    try:
        assert sorted(s.member_groups("bk")) == [b"\x01", b"\x05"]
        assert list(s.iter_members("bk", [b"\x01", b"\x05"])) == [
            ("also", [7, 2.0, "e-also"]), ("in", [7, 2.0, "e-in"])]
        assert records.unpackb(s.get_raw(b"Sschema")) == records.SCHEMA
    finally:
        s.close()


def test_object_records_keep_their_membership_history():
    from eventhandler.events import Event
    prev = records.new_object(5, 10, 1.5, "e", {"t": "1"}, {})
    prev[records.OBJ_SLOTS], prev[records.OBJ_EVER], prev[records.OBJ_LV] = b"\x01", b"\x03", 42
    newer = records.new_version(prev, 6, 11, 2.5, "f", None, {"m": "x"}, records.TAGS_PENDING)
    assert newer == [6, 11, 2.5, "f", None, {"m": "x"}, b"\x01", b"\x03", 42, records.TAGS_PENDING]
    assert records.new_version(None, 6, 11, 2.5, "f", None, {}, 0) == records.new_object(6, 11, 2.5, "f", None, {})
    gone = records.tombstone(7, prev)
    assert records.is_deleted(gone) and not records.is_settled(gone) and records.seq_of(gone) == 7
    assert gone[records.OBJ_SLOTS] == b"\x01" and records.change_version(gone) == 42
    assert records.tombstone(7, None)[records.OBJ_EVER] == b""
    retagged = records.with_tags_unknown(prev)
    assert records.tags_unknown(retagged) and prev[records.OBJ_TAGS] == {"t": "1"}  # a copy
    pending = records.new_object(5, 1, 1.0, "e", None, None, records.TAGS_PENDING)
    tagged = records.with_tags(pending, {"t": "2"}, None)
    assert tagged[records.OBJ_TAGS] == {"t": "2"} and tagged[records.OBJ_META] == {} and records.is_settled(tagged)
    # tags not fetched (they could not change an answer) stay unknown, the metadata is in
    meta_only = records.with_tags(pending, None, {"m": "x"})
    assert records.tags_unknown(meta_only) and meta_only[records.OBJ_META] == {"m": "x"}
    assert records.is_settled(meta_only) and records.is_tags_pending(pending)
    again = records.to_match_again(prev)
    assert again == prev and again is not prev
    # a change entry: put for the views in slots, delete for those only in ever
    gone[records.OBJ_SLOTS] = b""
    entry = records.unpackb(records.pack_change("k", gone))
    assert records.change_key(entry) == "k" and entry[records.CH_DELETED] == 1
    assert [records.change_view_op(entry, s) for s in range(3)] == ["delete", "delete", None]
    entry = records.unpackb(records.pack_change("k", prev))
    assert entry[records.CH_EVER] == b"\x03"  # differs from slots, so kept
    assert [records.change_view_op(entry, s) for s in range(3)] == ["put", "delete", None]
    assert records.change_object(entry) == {"key": "k", "size": 10, "mtime": 1.5, "etag": "e"}
    ev = Event(0, "b", "k", 9, 3, "e", 1.0, {"m": "x"}, "s3:ObjectCreated:Put")
    back = records.held_event("b", records.unpackb(records.pack_held(ev)))
    assert [getattr(back, f) for f in Event.__slots__] == [getattr(ev, f) for f in Event.__slots__]
    assert records.unpack_bucket(records.packb({"state": "ready", "version": 3})) == {
        "state": "ready", "version": 3, "tags": False, "scanned": 0.0, "purged": 0}


def test_notify_merges_its_own_rule_into_the_configuration():
    from delvefs.shared.s3 import merged_notifications
    other_queue = {"Id": "theirs", "QueueArn": "arn:aws:sqs:us-east-1:1:q", "Events": ["s3:ObjectRemoved:*"]}
    topic = {"Id": "delvefs-topic", "TopicArn": "arn:aws:sns:us-east-1:1:t", "Events": ["s3:ObjectCreated:*"]}
    current = {"QueueConfigurations": [other_queue, {"Id": "delvefs", "QueueArn": "old", "Events": []}],
               "TopicConfigurations": [topic], "EventBridgeConfiguration": {},
               "ResponseMetadata": {"HTTPStatusCode": 200}}
    ours = {"Id": "delvefs", "QueueArn": "arn:minio:sqs::PRIMARY:amqp",
            "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}
    assert merged_notifications(current, "arn:minio:sqs::PRIMARY:amqp") == {
        "QueueConfigurations": [other_queue, ours], "TopicConfigurations": [topic],
        "EventBridgeConfiguration": {}}
    assert merged_notifications(current, None) == {
        "QueueConfigurations": [other_queue], "TopicConfigurations": [topic], "EventBridgeConfiguration": {}}
    assert merged_notifications({}, None) == {}
    # the ARN's service picks the kind of rule; a rule of ours elsewhere moves
    sns = merged_notifications(current, "arn:aws:sns:us-east-1:1:mine")
    assert sns["QueueConfigurations"] == [other_queue]
    assert sns["TopicConfigurations"][-1] == {"Id": "delvefs", "TopicArn": "arn:aws:sns:us-east-1:1:mine",
                                              "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}


def test_event_keys_are_utf8_and_may_hold_a_nul_byte():
    body, _ = make_message("s3:ObjectCreated:Put", "bkt", "a\0b.txt", 0x18E9F94250012594, size=1)
    (ev,) = parse_message(body)
    assert ev.key == "a\0b.txt"                   # taken as it is: the mounts skip it
    doc = orjson.loads(body)
    doc["Records"][0]["s3"]["object"]["key"] = "a%FFb.txt"   # escapes of no UTF-8 name no key
    with pytest.raises(InvalidEvent, match="UTF-8"):
        parse_message(orjson.dumps(doc))
