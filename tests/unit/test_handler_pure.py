"""Pure pieces of the handler: MinIO event parsing, sequencer order, LevelDB key layout."""
from __future__ import annotations

from datetime import datetime

import orjson
import pytest

from eventhandler import store as st
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
    assert st.k_view(vid) == b"V" + bytes.fromhex(vid)
    assert st.k_obj("b", "a/b") == b"ob\x00a/b"
    assert st.split_obj_key(st.k_obj("bucket", "x\u00e9/y")) == ("bucket", "x\u00e9/y")
    # change-log keys sort numerically by version
    versions = [1, 255, 256, 2**40, 2**63]
    assert sorted(st.k_change("b", v) for v in versions) == [st.k_change("b", v) for v in versions]
    # a bucket's prefix never covers another bucket whose name extends it
    assert not st.k_obj("ab", "x").startswith(st.obj_prefix("a"))
    assert st._prefix_end(b"o\xff\xff") == b"p" and st._prefix_end(b"ab") == b"ac"
    rec = st.new_object(5, 10, 1.5, "e", None, {})
    assert st.unpackb(st.packb(rec)) == rec


def test_store_iterators(tmp_path):
    s = st.Store(str(tmp_path / "db"))
    try:
        wb = s.batch()
        for key in ("a", "b", "c", "d"):
            wb.put(st.k_obj("bk", key), st.packb(st.new_object(1, 1, 1.0, key, None, {})))
        wb.put(st.k_obj("bk2", "a"), st.packb(st.new_object(1, 1, 1.0, "other", None, {})))
        for v in (3, 7, 9):
            wb.put(st.k_change("bk", v), st.packb([f"k{v}", 0, [], [], 0, 0.0, ""]))
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
        db.put(b"Sschema", st.packb(99))
        db.close()
        st.Store(str(tmp_path / "db"))


def test_store_iterates_only_a_key_prefix(tmp_path):
    s = st.Store(str(tmp_path / "db"))
    try:
        wb = s.batch()
        for key in ("a", "run/", "run/1", "run/2/x", "run0", "rum", "z", "ü/1"):
            wb.put(st.k_obj("bk", key), st.packb(st.new_object(1, 1, 1.0, key, None, {})))
        wb.put(st.k_obj("bk2", "run/9"), st.packb(st.new_object(1, 1, 1.0, "other", None, {})))
        s.write(wb)

        def keys(**kw):
            return [k for k, _ in s.iter_objects("bk", **kw)]
        assert keys(key_prefix="run/") == ["run/", "run/1", "run/2/x"]
        assert keys(key_prefix="run/", after="run/") == ["run/1", "run/2/x"]
        assert keys(key_prefix="run/", after="run/1") == ["run/2/x"]
        assert keys(key_prefix="run/", after="a") == ["run/", "run/1", "run/2/x"]  # after < prefix
        assert keys(key_prefix="run/", after="run0") == []                       # after > range
        assert keys(key_prefix="run") == ["run/", "run/1", "run/2/x", "run0"]
        assert keys(key_prefix="ü") == ["ü/1"]
        assert keys(key_prefix="nothing") == []
        assert keys(key_prefix="") == keys()
    finally:
        s.close()
