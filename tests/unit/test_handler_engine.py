"""The handler's engine on a real LevelDB with a fake S3 client (one layer): failed tag
fetches are retried by a reconcile; listings read only the view's key prefix range."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest
from botocore.exceptions import ClientError

from eventhandler import store as st
from eventhandler.engine import Engine
from eventhandler.events import make_message, parse_message
from eventhandler.metrics import Metrics
from eventhandler.testing import spec
from tests.waiting import wait_until

DATE = "Sat, 21 Nov 2026 06:00:00 GMT"


class FakeS3:
    """Just the calls the engine makes: ListObjectsV2, GetObjectTagging, HeadObject."""

    def __init__(self):
        self.objects: dict[str, dict] = {}  # key -> {"Size", "ETag", "LastModified", "tags"}
        self.tag_failures = 0  # the next n GetObjectTagging calls fail
        self.tag_calls = 0
        self.lock = threading.Lock()

    def list_objects_v2(self, Bucket, MaxKeys=1000, **kw):
        contents = [] if MaxKeys == 0 else [
            {"Key": k, "Size": o["Size"], "ETag": f'"{o["ETag"]}"', "LastModified": o["LastModified"]}
            for k, o in sorted(self.objects.items())]
        return {"Contents": contents, "IsTruncated": False,
                "ResponseMetadata": {"HTTPHeaders": {"date": DATE}}}

    def get_object_tagging(self, Bucket, Key):
        with self.lock:
            self.tag_calls += 1
            if self.tag_failures > 0:
                self.tag_failures -= 1
                raise ClientError({"Error": {"Code": "SlowDown", "Message": "try later"}}, "GetObjectTagging")
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "gone"}}, "GetObjectTagging")
        return {"TagSet": [{"Key": k, "Value": v} for k, v in self.objects[Key]["tags"].items()]}

    def head_object(self, Bucket, Key):
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "404", "Message": "gone"}}, "HeadObject")
        return {"Metadata": {}}


@pytest.fixture
def engine(tmp_path):
    fake = FakeS3()
    store = st.Store(str(tmp_path / "db"))
    eng = Engine(store, Metrics(), s3_factory=lambda: fake, s3_workers=2, job_workers=1)
    eng.start()
    eng.fake = fake
    yield eng
    eng.close()
    store.close()


def ready(eng, vid):
    info = eng.views_by_id[vid]
    wait_until(lambda: eng.view_ready(info), 10, "view ready")
    return info


def keys(eng, info, **kw):
    return [o["key"] for o in eng.list_view(info, None, 5000, **kw)["objects"]]


def test_failed_tag_fetch_is_retried_by_reconcile(engine):
    (out,) = engine.register([("raw", spec("b", properties={"stage": ["raw"]}))])
    info = ready(engine, out["id"])
    mtime = datetime(2026, 11, 21, 5, 0, 0, tzinfo=timezone.utc)
    seq = int(mtime.timestamp() * 1e6) * 1000  # what a listing of the same version says
    engine.fake.objects["k"] = {"Size": 3, "ETag": "e1", "LastModified": mtime, "tags": {"stage": "raw"}}
    engine.fake.tag_failures = 1
    body, _ = make_message("s3:ObjectCreated:Put", "b", "k", seq, size=3, etag="e1")
    engine.apply_events(parse_message(body))
    wait_until(lambda: engine.fake.tag_calls >= 1, 10, "the tag fetch was tried")
    time.sleep(0.3)
    assert keys(engine, info) == []                         # the fetch failed: still pending
    assert list(engine.store.pending_tags()) == [("b", "k", seq)]
    counts = engine.reconcile("b")["b"]
    assert counts["tags_retried"] == 1 and counts["removed"] == 0
    wait_until(lambda: keys(engine, info) == ["k"], 10, "the retried fetch brought the tags")
    assert list(engine.store.pending_tags()) == []
    assert engine.reconcile("b")["b"]["tags_retried"] == 0  # nothing owed any more


def test_reconcile_does_not_refetch_tags_under_way(engine):
    (out,) = engine.register([("raw", spec("b", properties={"stage": ["raw"]}))])
    ready(engine, out["id"])
    # a pending record whose fetch is (as far as the engine knows) still under way
    engine._tag_ticket[("b", "x")] = 1
    wb = engine.store.batch()
    wb.put(st.k_obj("b", "x"), st.packb([5, 1, 1.0, "e", None, None, b"", b"", 0, st.TAGS_PENDING]))
    wb.put(st.k_tagwait("b", "x"), st.packb(5))
    wb.write()
    assert engine._retry_failed_tags("b") == 0


def test_listing_reads_only_the_views_prefix(engine):
    (out,) = engine.register([("runs", spec("b", object="runs/r1/*.fq"))])
    info = ready(engine, out["id"])
    assert info.key_prefix == "runs/r1/"
    now = time.time_ns()
    events = []
    for i in range(50):
        for key in (f"runs/r1/{i:03d}.fq", f"runs/r0/{i:03d}.fq", f"runs/r2/{i:03d}.fq", f"a{i}.fq"):
            events += parse_message(make_message("s3:ObjectCreated:Put", "b", key, now + len(events),
                                                 size=1, etag="e")[0])
    engine.apply_events(events)
    read = []
    orig = engine.store.iter_objects

    def counting(*a, **kw):
        for item in orig(*a, **kw):
            read.append(item[0])
            yield item
    engine.store.iter_objects = counting
    assert keys(engine, info) == [f"runs/r1/{i:03d}.fq" for i in range(50)]
    assert all(k.startswith("runs/r1/") for k in read)
    page = engine.list_view(info, "runs/r1/010.fq", 5)
    assert [o["key"] for o in page["objects"]] == [f"runs/r1/{i:03d}.fq" for i in range(11, 16)]
    assert page["next"] == "runs/r1/015.fq"
