"""The handler's engine on a real LevelDB with a fake of its S3 reader: failed tag
fetches are retried by a reconcile; listings read only the view's members (the membership
index) and always equal a full read of the object records."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_h

from eventhandler import records
from eventhandler import statedb as st
from eventhandler.engine import Engine
from eventhandler.events import make_message, parse_message
from eventhandler.metrics import Metrics
from delvefs.devtools.handlerprocess import spec
from tests.waiting import wait_until

DATE = "Sat, 21 Nov 2026 06:00:00 GMT"


class S3Unavailable(Exception):
    pass


class FakeBucketReader:
    """What the engine reads from S3 (delvefs.shared.s3.BucketReader): listings, tags, metadata."""

    def __init__(self):
        self.objects: dict[str, dict] = {}  # key -> {"Size", "ETag", "LastModified", "tags"}
        self.tag_failures = 0  # the next n tag fetches fail
        self.list_failures = 0  # the next n listing requests (pages or the clock probe) fail
        self.tag_calls = 0
        self.lock = threading.Lock()

    def _listing_request(self) -> None:
        if self.list_failures > 0:
            self.list_failures -= 1
            raise S3Unavailable("ServiceUnavailable: down")

    def store_date(self, bucket):
        self._listing_request()
        return DATE

    def list_pages(self, bucket):
        self._listing_request()
        yield [{"Key": k, "Size": o["Size"], "ETag": f'"{o["ETag"]}"', "LastModified": o["LastModified"]}
               for k, o in sorted(self.objects.items())], DATE

    def tags(self, bucket, key):
        with self.lock:
            self.tag_calls += 1
            if self.tag_failures > 0:
                self.tag_failures -= 1
                raise S3Unavailable("SlowDown: try later")
        if key not in self.objects:
            return None
        return dict(self.objects[key]["tags"])

    def metadata(self, bucket, key):
        return {} if key in self.objects else None


@pytest.fixture
def engine(tmp_path):
    fake = FakeBucketReader()
    store = st.Store(str(tmp_path / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=2, job_workers=1)
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
    wait_until(lambda: ("b", "k") in engine._tag_failed, 10, "the tag fetch failed")
    assert keys(engine, info) == []                         # still pending
    assert list(engine.store.pending_tags()) == [("b", "k", seq)]
    counts = engine.reconcile("b")["b"]
    assert counts["tags_retried"] == 1 and counts["removed"] == 0
    wait_until(lambda: keys(engine, info) == ["k"], 10, "the retried fetch brought the tags")
    assert list(engine.store.pending_tags()) == []
    assert engine.reconcile("b")["b"]["tags_retried"] == 0  # nothing owed any more
    assert_index_matches_records(engine)
    # retagged: the tagging event fetches the tags again and the key leaves the view
    engine.fake.objects["k"]["tags"] = {"stage": "done"}
    engine.apply_events(parse_message(make_message("s3:ObjectCreated:PutTagging", "b", "k", seq)[0]))
    wait_until(lambda: keys(engine, info) == [], 10, "the retag moved the key out")
    assert_index_matches_records(engine)


def test_reconcile_does_not_refetch_tags_under_way(engine):
    (out,) = engine.register([("raw", spec("b", properties={"stage": ["raw"]}))])
    ready(engine, out["id"])
    # a pending record whose fetch is (as far as the engine knows) still under way
    engine._tag_ticket[("b", "x")] = 1
    wb = engine.store.batch()
    wb.put(records.k_obj("b", "x"),
           records.pack_object(records.new_object(5, 1, 1.0, "e", None, None, records.TAGS_PENDING)))
    wb.put(records.k_tagwait("b", "x"), records.pack_tagwait(5))
    wb.write()
    assert engine._retry_failed_tags("b") == 0


def put_event(key, seq, size=1, etag="e"):
    return parse_message(make_message("s3:ObjectCreated:Put", "b", key, seq, size=size, etag=etag)[0])


def remove_event(key, seq):
    return parse_message(make_message("s3:ObjectRemoved:Delete", "b", key, seq)[0])


def brute_listing(eng, info):
    """A view's members by reading every object record (what the index must agree with)."""
    return [{"key": k, "size": r[records.OBJ_SIZE], "mtime": r[records.OBJ_MTIME], "etag": r[records.OBJ_ETAG]}
            for k, r in eng.store.iter_objects(info.bucket) if records.bits_has(r[records.OBJ_SLOTS], info.slot)]


def paged_listing(eng, info, limit):
    out, after = [], None
    while True:
        page = eng.list_view(info, after, limit)
        out += page["objects"]
        if page["next"] is None:
            return out
        after = page["next"]


def assert_index_matches_records(eng, bucket="b"):
    """``m`` entries are exactly the objects with views, filed under their slots."""
    index = {(g, k): v for g in eng.store.member_groups(bucket)
             for k, v in eng.store.iter_members(bucket, [g])}
    expected = {(r[records.OBJ_SLOTS], k): [r[records.OBJ_SIZE], r[records.OBJ_MTIME], r[records.OBJ_ETAG]]
                for k, r in eng.store.iter_objects(bucket) if r[records.OBJ_SLOTS]}
    assert index == expected
    assert set(eng.store.member_groups(bucket)) <= eng.buckets[bucket].groups


def test_listing_reads_only_the_views_members(engine):
    outs = engine.register([("runs", spec("b", object="runs/r1/*.fq")),
                            ("sel", spec("b", object="*.sel")),
                            ("big", spec("b", object="*", size=[100, None]))])
    runs, sel, big = (ready(engine, o["id"]) for o in outs)
    now = time.time_ns()
    events = []
    for i in range(50):
        for key in (f"runs/r1/{i:03d}.fq", f"runs/r0/{i:03d}.fq", f"data/{i:03d}.sel", f"a{i}.fq"):
            events += put_event(key, now + len(events), size=100 if i % 10 == 0 else 1)
    engine.apply_events(events)
    read = []
    orig = engine.store.iter_members

    def counting(*a, **kw):
        for item in orig(*a, **kw):
            read.append(item[0])
            yield item
    engine.store.iter_members = counting
    listed = keys(engine, runs)
    assert listed == [f"runs/r1/{i:03d}.fq" for i in range(50)]
    assert read == listed  # its members, nothing else of the bucket
    read.clear()
    listed = keys(engine, sel)
    assert listed == [f"data/{i:03d}.sel" for i in range(50)]  # no literal prefix
    assert read == listed
    assert len(keys(engine, big)) == 20
    page = engine.list_view(runs, "runs/r1/010.fq", 5)
    assert [o["key"] for o in page["objects"]] == [f"runs/r1/{i:03d}.fq" for i in range(11, 16)]
    assert page["next"] == "runs/r1/015.fq"
    # an object that changes size moves between groups; one removed leaves the index
    engine.apply_events(put_event("data/001.sel", now + 10**6, size=500, etag="new")
                        + remove_event("runs/r1/000.fq", now + 10**6 + 1))
    assert "data/001.sel" in keys(engine, big) and "data/001.sel" in keys(engine, sel)
    assert "runs/r1/000.fq" not in keys(engine, runs) + keys(engine, big)
    assert next(o for o in engine.list_view(sel, None, 100)["objects"]
                if o["key"] == "data/001.sel")["etag"] == "new"
    assert_index_matches_records(engine)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st_h.lists(st_h.tuples(st_h.sampled_from(["put", "put", "remove", "register", "compact"]),
                                  st_h.sampled_from(["a", "b/x.sel", "b/y", "c.sel", "runs/1", "runs/2.sel", "ü"]),
                                  st_h.integers(0, 300)), max_size=40),
       limit=st_h.integers(1, 4))
def test_listings_from_the_index_equal_a_full_read(tmp_path_factory, ops, limit):
    """Whatever sequence of creates, size changes, removes, new views and compactions:
    every view's paged listing equals the brute-force filter of the object records."""
    fake = FakeBucketReader()
    store = st.Store(str(tmp_path_factory.mktemp("db") / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=1, job_workers=1)
    eng.start()
    try:
        more_views = iter([spec("b", object="runs/*"), spec("b", object="*", size=[0, 99]),
                           spec("b", object="b/*.sel", size=[50, None]), spec("b", object="?")])
        out = eng.register([("sel", spec("b", object="*.sel")), ("big", spec("b", object="*", size=[100, None]))])
        infos = [ready(eng, o["id"]) for o in out]
        seq = time.time_ns() - 10**12
        for op, key, size in ops:
            seq += 1000
            if op == "put":
                eng.apply_events(put_event(key, seq, size=size, etag=f"e{seq}"))
            elif op == "remove":
                eng.apply_events(remove_event(key, seq))
            elif op == "register":
                view = next(more_views, None)
                if view is not None:
                    (o,) = eng.register([(f"v{len(infos)}", view)])
                    infos.append(ready(eng, o["id"]))  # after the rematch of the bucket
            else:
                eng.compact("b", horizon=0)
            for info in infos:
                assert paged_listing(eng, info, limit) == brute_listing(eng, info)
        assert_index_matches_records(eng)
    finally:
        eng.close()
        store.close()


def test_compaction_removes_old_tombstones_and_raises_the_change_floor(engine):
    (out,) = engine.register([("all", spec("b", object="*"))])
    info = ready(engine, out["id"])
    hour_ago = time.time_ns() - 3600 * 10**9

    def event(name, key, seq):
        return parse_message(make_message(name, "b", key, seq, size=1, etag="e")[0])

    engine.apply_events(event("s3:ObjectCreated:Put", "old", hour_ago)
                        + event("s3:ObjectCreated:Put", "young", hour_ago + 1)
                        + event("s3:ObjectCreated:Put", "kept", hour_ago + 2))
    listed_at = engine.list_view(info, None, 100)["version"]
    engine.apply_events(event("s3:ObjectRemoved:Delete", "old", hour_ago + 10))
    engine.apply_events(event("s3:ObjectRemoved:Delete", "young", time.time_ns()))
    delete_of_old = next(v for v, e in engine.store.iter_changes("b", 0) if e[records.CH_KEY] == "old")
    top = engine.buckets["b"].committed
    assert engine.change_floor(info) <= listed_at

    assert engine.compact("b", horizon=600) == 1        # only the tombstone older than 10 min
    assert engine.store.get_object("b", "old") is None
    assert engine.store.get_object("b", "young")[records.OBJ_FLAGS] & records.DELETED
    assert "old" not in [e[records.CH_KEY] for _v, e in engine.store.iter_changes("b", 0)]
    # a client that had listed before the delete must list again; one past it need not
    assert engine.change_floor(info) == delete_of_old > listed_at
    assert engine.changes(info, top, 100)["changes"] == []
    assert keys(engine, info) == ["kept"]
    # the floor survives a restart (it is in the bucket record)
    assert records.unpack_bucket(engine.store.get_raw(records.k_bucket("b")))["purged"] == delete_of_old
    assert engine.compact("b", horizon=600) == 0        # idempotent


def test_a_purged_key_can_be_created_again(engine):
    (out,) = engine.register([("all", spec("b", object="*"))])
    info = ready(engine, out["id"])
    t = time.time_ns() - 3600 * 10**9
    engine.apply_events(parse_message(make_message("s3:ObjectCreated:Put", "b", "k", t, size=1, etag="e")[0]))
    engine.apply_events(parse_message(make_message("s3:ObjectRemoved:Delete", "b", "k", t + 1)[0]))
    assert engine.compact("b", horizon=0) == 1
    since = engine.buckets["b"].committed
    engine.apply_events(parse_message(make_message("s3:ObjectCreated:Put", "b", "k", time.time_ns(),
                                                   size=2, etag="f")[0]))
    assert keys(engine, info) == ["k"]
    assert [c["op"] for c in engine.changes(info, since, 100)["changes"]] == ["put"]


def test_events_during_the_first_scan_are_held_in_leveldb_then_applied(engine):
    gate = threading.Event()
    listing = engine.fake.list_pages

    def slow_listing(bucket):  # the listing itself, not the clock probe
        assert gate.wait(10)
        return listing(bucket)
    engine.fake.list_pages = slow_listing
    mtime = datetime(2026, 11, 21, 5, 0, 0, tzinfo=timezone.utc)
    engine.fake.objects["listed"] = {"Size": 1, "ETag": "l", "LastModified": mtime, "tags": {}}
    (out,) = engine.register([("all", spec("b", object="*"))])
    info = engine.views_by_id[out["id"]]
    now = time.time_ns()
    events = []
    for i in range(12_000):  # more than one replay chunk
        events += parse_message(make_message("s3:ObjectCreated:Put", "b", f"k{i % 7000:05d}", now + i,
                                             size=i, etag=f"e{i}")[0])
    events += parse_message(make_message("s3:ObjectRemoved:Delete", "b", "k00003", now + 20_000)[0])
    for start in range(0, len(events), 1000):
        engine.apply_events(events[start:start + 1000])
    assert not engine.view_ready(info)
    assert len(engine.store.iter_held("b", 100_000)) == len(events)   # on disk, not in memory
    gate.set()
    wait_until(lambda: engine.view_ready(info), 20, "scan done")
    assert engine.store.iter_held("b", 1) == []
    got = {o["key"]: o["size"] for o in engine.list_view(info, None, 10_000)["objects"]}
    expected = {f"k{j:05d}": j + 7000 if j + 7000 < 12_000 else j for j in range(7000)}
    del expected["k00003"]
    expected["listed"] = 1
    assert got == expected


def test_a_failed_write_in_a_background_job_stops_the_handler(tmp_path):
    import plyvel

    class FailingBatch:  # a WriteBatch whose commit fails as on a full disk
        def __init__(self, batch):
            self.put, self.delete = batch.put, batch.delete

        def write(self):
            raise plyvel.IOError("IO error: No space left on device")

    reasons = []
    fake = FakeBucketReader()
    store = st.Store(str(tmp_path / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=1, job_workers=1,
                 on_storage_error=reasons.append)
    eng.start()
    try:
        (out,) = eng.register([("all", spec("b"))])
        ready(eng, out["id"])
        fake.objects["k"] = {"Size": 1, "ETag": "e", "LastModified": datetime.now(timezone.utc), "tags": {}}
        real_batch = store.batch
        store.batch = lambda: FailingBatch(real_batch())
        with pytest.raises(st.StorageError):
            eng._guard(eng.reconcile, "b")  # as the job pool runs it
        assert reasons and set(reasons) == {"LevelDB: IO error: No space left on device"}
    finally:
        eng.close()
        store.close()


def test_a_failed_first_scan_is_retried_until_the_bucket_is_ready(engine):
    engine.scan_retry = 0.01
    engine.fake.objects["k"] = {"Size": 1, "ETag": "e", "LastModified": datetime.now(timezone.utc), "tags": {}}
    engine.fake.list_failures = 3
    (out,) = engine.register([("all", spec("b"))])
    info = ready(engine, out["id"])
    assert keys(engine, info) == ["k"]
    assert engine.fake.list_failures == 0 and engine.buckets["b"].scan_error is None
    assert engine.metrics.scan_failures._value.get() >= 1
