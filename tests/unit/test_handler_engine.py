"""The handler's engine on a real LevelDB with a fake of its S3 reader: tags are asked for
only when they can change an answer; failed tag fetches are retried by a reconcile;
listings read only the view's members (the membership index) and always equal a full read
of the object records."""
from __future__ import annotations

import dataclasses
import threading
import time
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_h

from eventhandler import records
from eventhandler import statedb as st
from eventhandler.devtools import spec
from eventhandler.engine import Engine
from eventhandler.events import make_message, parse_message
from eventhandler.metrics import Metrics
from rulesets import View
from tests.unit import test_rulesets_native as native
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
        self.tagged_keys: list[str] = []  # the keys of every tag request, in order
        self.head_calls = 0
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
            self.tagged_keys.append(key)
            if self.tag_failures > 0:
                self.tag_failures -= 1
                raise S3Unavailable("SlowDown: try later")
        if key not in self.objects:
            return None
        return dict(self.objects[key]["tags"])

    def metadata(self, bucket, key):
        with self.lock:
            self.head_calls += 1
        return dict(self.objects[key].get("metadata", {})) if key in self.objects else None


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
    wait_until(lambda: ("b", "k") in engine.tags._failed, 10, "the tag fetch failed")
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
    engine.tags._tickets[("b", "x")] = 1
    wb = engine.store.batch()
    wb.put(records.k_obj("b", "x"),
           records.pack_object(records.new_object(5, 1, 1.0, "e", None, None, records.TAGS_PENDING)))
    wb.put(records.k_tagwait("b", "x"), records.pack_tagwait(5))
    wb.write()
    assert engine.tags.retry_failed("b") == 0


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
    assert {gk: v[:3] for gk, v in index.items()} == expected
    for (g, k), v in index.items():  # props: the values of the names its group's views list
        names = eng.matcher.listed_property_names(records.slots_of(g))
        rec = eng.store.get_object(bucket, k)
        if not names:
            assert len(v) == 3
        elif records.is_settled(rec):
            assert v[3] == records.listed_properties(rec, names)
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
            eng.background.guard(eng.reconcile, "b")  # as the job pool runs it
        assert reasons and set(reasons) == {"LevelDB: IO error: No space left on device"}
    finally:
        eng.close()
        store.close()


def test_a_failed_first_scan_is_retried_until_the_bucket_is_ready(engine):
    engine.scanner.scan_retry = 0.01
    engine.fake.objects["k"] = {"Size": 1, "ETag": "e", "LastModified": datetime.now(timezone.utc), "tags": {}}
    engine.fake.list_failures = 3
    (out,) = engine.register([("all", spec("b"))])
    info = ready(engine, out["id"])
    assert keys(engine, info) == ["k"]
    assert engine.fake.list_failures == 0 and engine.buckets["b"].scan_error is None
    assert engine.metrics.scan_failures._value.get() >= 1


# ---- tags only when they can change an answer -------------------------------------------------

# the views and objects of the matcher's property-based tests, on the one bucket "b"
def registrable(view) -> bool:
    try:
        View.from_filter_spec(view.name, view.filter_spec())
    except ValueError:  # e.g. a block whose only rule is `object: ""`
        return False
    return True


def native_views():
    return native.views().map(lambda view: dataclasses.replace(view, bucket="b")).filter(registrable)


native_keys = native.keys
native_sizes = native.sizes
native_tag_sets = st_h.dictionaries(native.cased_names, native.values, max_size=3)
native_meta_sets = st_h.dictionaries(native.prop_names, native.values, max_size=2)

OLD = datetime(2026, 1, 1, tzinfo=timezone.utc)


def create(key, seq, metadata=None, size=1):
    return parse_message(make_message("s3:ObjectCreated:Put", "b", key, seq, size=size, etag=f"e{seq}",
                                      metadata=metadata)[0])


def put_object(eng, key, seq, tags=None, metadata=None, size=1):
    """An object in the fake store and its create event, applied."""
    eng.fake.objects[key] = {"Size": size, "ETag": f"e{seq}", "LastModified": OLD, "tags": tags or {},
                             "metadata": metadata or {}}
    eng.apply_events(create(key, seq, metadata, size))


def settled(eng):
    wait_until(lambda: not eng.store.has_pending_tags("b"), 10, "no tag fetch owed")


def test_property_rule_the_metadata_satisfies_needs_no_tags(engine):
    (out,) = engine.register([("k", spec("b", properties={"kind": ["k*"]}))])
    info = ready(engine, out["id"])
    seq = int(OLD.timestamp() * 1e9)
    put_object(engine, "by-meta", seq, metadata={"kind": "kx"})           # decided by metadata
    put_object(engine, "by-tags", seq + 1, tags={"kind": "ky"})           # only the tags can tell
    put_object(engine, "neither", seq + 2, tags={"kind": "z"}, metadata={"kind": "z"})
    settled(engine)
    assert keys(engine, info) == ["by-meta", "by-tags"]
    assert sorted(engine.fake.tagged_keys) == ["by-tags", "neither"]
    assert engine.metrics.tag_fetches._value.get() == 2
    assert engine.fake.head_calls == 0                                    # events carry the metadata
    assert_index_matches_records(engine)


def props_of(eng, info, **kw):
    return {o["key"]: o["properties"] for o in eng.list_view(info, None, 5000)["objects"]}


def test_views_listing_property_values_carry_them_and_log_their_changes(engine):
    """A view with ``layout_by`` lists each member's values (tag, else metadata; names
    lowercase) and logs a retag as a put; tags and metadata are read for its members only,
    and views without it list and log as before."""
    outs = engine.register([("by", spec("b", object="runs/*", layout_by=["sample", "lane"])),
                            ("plain", spec("b", object="runs/*")),
                            ("other", spec("b", object="other/*"))])
    by, plain, other = (ready(engine, o["id"]) for o in outs)
    assert by.id != plain.id
    seq = int(OLD.timestamp() * 1e9)
    put_object(engine, "runs/a", seq, tags={"Sample": "S1", "lane": "2"})
    put_object(engine, "runs/b", seq + 1, tags={"sample": "S1"}, metadata={"lane": "3", "x": "y"})
    put_object(engine, "other/c", seq + 2, tags={"sample": "S9"})
    # a listed object (no metadata in a listing): its metadata is read with its tags
    engine.fake.objects["runs/listed"] = {"Size": 1, "ETag": "l", "LastModified": OLD,
                                          "tags": {"lane": "1"}, "metadata": {"sample": "S2"}}
    engine.reconcile("b")
    settled(engine)
    assert props_of(engine, by) == {"runs/a": {"sample": "S1", "lane": "2"},
                                    "runs/b": {"sample": "S1", "lane": "3"},
                                    "runs/listed": {"sample": "S2", "lane": "1"}}
    assert sorted(engine.fake.tagged_keys) == ["runs/a", "runs/b", "runs/listed"]  # not other/c
    assert engine.fake.head_calls == 1                                  # the listed one only
    assert all("properties" not in o for o in engine.list_view(plain, None, 100)["objects"])
    assert keys(engine, other) == ["other/c"]
    assert_index_matches_records(engine)
    # a retag that changes a value: a put change of the view, with the new values; nothing
    # for views without layout_by (nothing they show changed)
    v0 = engine.buckets["b"].committed
    engine.fake.objects["runs/a"]["tags"] = {"sample": "S2", "lane": "2"}
    engine.apply_events(parse_message(make_message("s3:ObjectCreated:PutTagging", "b", "runs/a", seq)[0]))
    wait_until(lambda: engine.changes(by, v0, 100)["changes"], 10, "the retag logged")
    settled(engine)
    (change,) = engine.changes(by, v0, 100)["changes"]
    assert change["op"] == "put" and change["object"]["properties"] == {"sample": "S2", "lane": "2"}
    (plain_change,) = engine.changes(plain, v0, 100)["changes"]
    assert "properties" not in plain_change["object"]
    assert props_of(engine, by)["runs/a"] == {"sample": "S2", "lane": "2"}
    # a retag of a tag no view lists changes nothing
    v1 = engine.buckets["b"].committed
    engine.fake.objects["runs/a"]["tags"] = {"sample": "S2", "lane": "2", "note": "n"}
    engine.apply_events(parse_message(make_message("s3:ObjectCreated:PutTagging", "b", "runs/a", seq)[0]))
    wait_until(lambda: engine.fake.tagged_keys.count("runs/a") == 3, 10, "the retag fetched")
    settled(engine)
    assert engine.changes(by, v1, 100)["changes"] == []
    # an overwrite with other metadata, same size: its values follow; while its tags are
    # fetched the entries keep the values they had
    put_object(engine, "runs/b", seq + 10, tags={"sample": "S1"}, metadata={"lane": "4"})
    settled(engine)
    assert props_of(engine, by)["runs/b"] == {"sample": "S1", "lane": "4"}
    assert engine.changes(by, v1, 100)["changes"][-1]["object"]["properties"] == {"sample": "S1", "lane": "4"}
    assert_index_matches_records(engine)
    # the layout view forgotten: its members' entries lose the props
    with engine.lock:
        engine.views.forget(by, None, "test")
    wait_until(lambda: not engine.catalog.clearing, 10, "slot cleared")
    assert_index_matches_records(engine)


def test_tags_are_asked_for_only_objects_that_pass_every_other_rule(engine):
    outs = engine.register([("bams", spec("b", object="*.bam", size=[10, None], tags={"stage": ["raw"]})),
                            ("any", spec("b", object="x/*", any=[{"tags": {"a": ["1"]}}, {"size": [0, 5]}])),
                            ("not", spec("b", object="y/*", **{"not": [{"tags": {"a": ["1"]}}]}))])
    bams, any_view, not_view = (ready(engine, o["id"]) for o in outs)
    seq = int(OLD.timestamp() * 1e9)
    put_object(engine, "a.txt", seq, tags={"stage": "raw"}, size=20)      # object rule fails
    put_object(engine, "small.bam", seq + 1, tags={"stage": "raw"}, size=5)  # size rule fails
    put_object(engine, "big.bam", seq + 2, tags={"stage": "raw"}, size=20)
    put_object(engine, "x/small", seq + 3, size=1)                         # `any` holds by its size
    put_object(engine, "x/big", seq + 4, tags={"a": "1"}, size=50)
    put_object(engine, "y/k", seq + 5, tags={"a": "2"})
    settled(engine)
    assert sorted(engine.fake.tagged_keys) == ["big.bam", "x/big", "y/k"]
    assert keys(engine, bams) == ["big.bam"]
    assert keys(engine, any_view) == ["x/big", "x/small"]
    assert keys(engine, not_view) == ["y/k"]


def test_views_without_tag_rules_never_cause_a_tag_request(engine):
    outs = engine.register([("meta", spec("b", metadata={"kind": ["k*"]})),
                            ("plain", spec("b", object="*.bam"))])
    meta, plain = (ready(engine, o["id"]) for o in outs)
    seq = int(OLD.timestamp() * 1e9)
    put_object(engine, "a.bam", seq, tags={"kind": "k1"}, metadata={"kind": "k1"})
    put_object(engine, "b.bam", seq + 1, tags={"kind": "k1"})
    engine.apply_events(parse_message(make_message("s3:ObjectCreated:PutTagging", "b", "a.bam", seq)[0]))
    # a listing (which carries no metadata) reads the metadata, never the tags
    engine.fake.objects["listed"] = {"Size": 1, "ETag": "l", "LastModified": OLD, "tags": {"kind": "k2"},
                                     "metadata": {"kind": "k2"}}
    engine.reconcile("b")
    settled(engine)
    assert engine.fake.tagged_keys == [] and engine.metrics.tag_fetches._value.get() == 0
    assert keys(engine, meta) == ["a.bam", "listed"] and keys(engine, plain) == ["a.bam", "b.bam"]
    assert engine.fake.head_calls == 1


def test_a_retag_is_fetched_only_when_the_tags_can_matter(engine):
    (out,) = engine.register([("raw", spec("b", object="*.bam", tags={"stage": ["raw"]}))])
    info = ready(engine, out["id"])
    seq = int(OLD.timestamp() * 1e9)
    put_object(engine, "a.bam", seq, tags={"stage": "raw"})
    put_object(engine, "a.txt", seq + 1, tags={"stage": "raw"})
    settled(engine)
    assert engine.fake.tagged_keys == ["a.bam"]
    engine.fake.objects["a.bam"]["tags"] = engine.fake.objects["a.txt"]["tags"] = {"stage": "done"}
    for key, s in (("a.bam", seq), ("a.txt", seq + 1)):
        engine.apply_events(parse_message(make_message("s3:ObjectCreated:PutTagging", "b", key, s)[0]))
    wait_until(lambda: keys(engine, info) == [], 10, "the retag moved a.bam out")
    assert engine.fake.tagged_keys == ["a.bam", "a.bam"]


def test_a_new_view_fetches_the_tags_it_needs_that_were_never_fetched(engine):
    (first,) = engine.register([("meta", spec("b", metadata={"kind": ["k*"]}))])
    ready(engine, first["id"])
    seq = int(OLD.timestamp() * 1e9)
    put_object(engine, "a", seq, tags={"stage": "raw"}, metadata={"kind": "k1"})
    put_object(engine, "b", seq + 1, tags={"stage": "raw"})
    put_object(engine, "c.txt", seq + 2, tags={"stage": "raw"})
    settled(engine)
    assert engine.fake.tagged_keys == []
    (second,) = engine.register([("raw", spec("b", object="[ab]", tags={"stage": ["raw"]}))])
    info = ready(engine, second["id"])               # ready once the tags it needs are in
    assert keys(engine, info) == ["a", "b"]
    assert sorted(engine.fake.tagged_keys) == ["a", "b"]


def test_tags_that_cannot_matter_yet_are_fetched_when_time_makes_them_matter(engine):
    """A view on old objects with a tag rule: a young object's tags cannot matter until it
    is old enough; then (a time flip) they are fetched and it joins."""
    (out,) = engine.register([("old_raw", spec("b", modified={"kind": "age", "lo": 0.5},
                                               tags={"stage": ["raw"]}))])
    info = ready(engine, out["id"])
    put_object(engine, "young", time.time_ns(), tags={"stage": "raw"})
    assert engine.fake.tagged_keys == [] and keys(engine, info) == []
    wait_until(lambda: keys(engine, info) == ["young"], 10, "the object grew old and its tags were read")
    assert engine.fake.tagged_keys == ["young"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(view_list=st_h.lists(native_views(), min_size=1, max_size=5),
       objs=st_h.dictionaries(native_keys.filter(bool),
                              st_h.tuples(native_sizes, native_tag_sets, native_meta_sets), min_size=1, max_size=6))
def test_tags_are_fetched_exactly_when_the_reference_leaves_an_answer_open(tmp_path_factory, view_list, objs):
    """Random views (any/not, braces, comparisons, tags/metadata/properties rules) and
    objects: the engine asks for an object's tags iff the reference's partial answer (tags
    unknown, metadata from the event) leaves some view undecided, and every object ends in
    exactly the views the reference gives it with its tags."""
    from rulesets import ObjectInfo, reference

    fake = FakeBucketReader()
    store = st.Store(str(tmp_path_factory.mktemp("db") / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=2, job_workers=1)
    eng.fake = fake
    eng.start()
    try:
        outs = eng.register([(f"v{i}", view.filter_spec()) for i, view in enumerate(view_list)])
        for o in outs:
            ready(eng, o["id"])
        seq = int(OLD.timestamp() * 1e9)
        for i, (key, (size, tags, meta)) in enumerate(sorted(objs.items())):
            put_object(eng, key, seq + i, tags=tags, metadata=meta, size=size)
        settled(eng)
        now = time.time()
        expected_fetches = []
        for i, (key, (size, tags, meta)) in enumerate(sorted(objs.items())):
            mtime = (seq + i) / 1e9
            meta = {k.lower(): v for k, v in meta.items()}  # as the event carries it
            partial = reference.match_partial(view_list, ObjectInfo("b", key, size, mtime, None, {}, meta), now)
            if partial[1]:
                expected_fetches.append(key)
            full = reference.match(view_list, ObjectInfo("b", key, size, mtime, None, tags, meta), now)
            assert eng.lookup("b", key)["views"] == sorted({outs[v]["id"] for v in full},
                                                           key=lambda vid: eng.views_by_id[vid].slot), key
        assert sorted(fake.tagged_keys) == expected_fetches
    finally:
        eng.close()
        store.close()


# ---- views that live: unregistering, forgetting, reusing slots ---------------------------------

def test_unregister_drops_one_principals_registration_and_the_last_forgets_the_view(engine):
    (a,) = engine.register([("x", spec("b", object="x/*"))], principal="alice")
    (b,) = engine.register([("y", spec("b", object="x/*"))], principal="bob")
    assert a["id"] == b["id"]
    assert engine.unregister(a["id"], "mallory") is None          # holds no registration
    assert engine.unregister(a["id"], "alice") is False           # bob still has it
    assert a["id"] in engine.views_by_id
    assert engine.unregister(a["id"], "alice") is None
    assert engine.unregister(a["id"], "bob") is True
    assert a["id"] not in engine.views_by_id and engine.lookup("b", "x/1") is None
    log = [(e["op"], e["principal"]) for e in engine.view_log()]
    assert log == [("registered", "alice"), ("registered", "bob"), ("unregistered", "alice"),
                   ("forgotten", "bob")]
    assert [e["n"] for e in engine.view_log(after=2)] == [3, 4]


def test_a_forgotten_views_slot_is_reused_only_after_its_members_were_cleared(engine):
    old, keep = engine.register([("old", spec("b", object="a/*")), ("keep", spec("b", object="*"))])
    old_info, keep_info = ready(engine, old["id"]), ready(engine, keep["id"])
    seq = int(OLD.timestamp() * 1e9)
    events = []
    for i in range(2500):  # more than one chunk of the clearing
        events += create(f"a/{i:04d}", seq + i)
    engine.apply_events(events + create("b/1", seq + 3000))
    engine.apply_events(parse_message(make_message("s3:ObjectRemoved:Delete", "b", "a/0000", seq + 4000)[0]))
    assert len(keys(engine, old_info)) == 2499
    slot = old_info.slot
    gate = threading.Event()
    real_clear = engine.scanner.clear_slot

    def gated_clear(*args):
        assert gate.wait(10)
        return real_clear(*args)
    engine.scanner.clear_slot = gated_clear
    with engine.lock:
        engine.views.forget(old_info, None, "test")
    # while the slot is being cleared, a new view gets another slot
    (new,) = engine.register([("new", spec("b", object="b/*"))])
    assert engine.views_by_id[new["id"]].slot != slot
    gate.set()
    wait_until(lambda: slot in engine.catalog.free_slots, 10, "the slot cleared")
    ready(engine, new["id"])  # its rematch done too
    for key, rec in engine.store.iter_objects("b"):
        assert not records.bits_has(rec[records.OBJ_SLOTS], slot), key
        assert not records.bits_has(rec[records.OBJ_EVER], slot), key
    assert_index_matches_records(engine)
    assert records.unpackb(engine.store.get_raw(records.k_freeing(slot)) or records.packb(None)) is None
    # the next view takes the cleared slot and inherits none of the old members
    (reused,) = engine.register([("reused", spec("b", object="b/*", size=[0, 5]))])
    info = ready(engine, reused["id"])
    assert info.slot == slot
    assert keys(engine, info) == ["b/1"] and len(keys(engine, keep_info)) == 2500
    since = engine.list_view(info, None, 10)["version"]
    engine.apply_events(create("a/0001", seq + 5000) + create("b/2", seq + 5001))
    assert [(c["op"], c["key"]) for c in engine.changes(info, since, 100)["changes"]] == [("put", "b/2")]
    assert_index_matches_records(engine)


def test_a_restart_during_the_clearing_resumes_it(tmp_path):
    fake = FakeBucketReader()
    store = st.Store(str(tmp_path / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=1, job_workers=1)
    eng.start()
    (out,) = eng.register([("all", spec("b"))])
    info = ready(eng, out["id"])
    eng.apply_events(create("k", int(OLD.timestamp() * 1e9)))
    eng.scanner.clear_slot = lambda *args: 0   # the process dies before clearing anything
    with eng.lock:
        eng.views.forget(info, None, "test")
    eng.close()
    store.close()
    store = st.Store(str(tmp_path / "db"))
    eng = Engine(store, Metrics(), s3=fake, s3_workers=1, job_workers=1)
    try:
        assert eng.catalog.clearing == {0: "b"} and not eng.catalog.free_slots and eng.views_by_id == {}
        eng.start()
        wait_until(lambda: eng.catalog.free_slots == {0}, 10, "the clearing resumed and finished")
        assert store.get_object("b", "k")[records.OBJ_SLOTS] == b""
        assert store.get_object("b", "k")[records.OBJ_EVER] == b""
        assert [e["op"] for e in eng.view_log()] == ["registered", "forgotten"]
    finally:
        eng.close()
        store.close()


def test_views_no_mount_used_for_the_ttl_are_forgotten(engine):
    engine.views.view_ttl = 100.0
    used, unused = engine.register([("used", spec("b", object="u/*")), ("unused", spec("b", object="n/*"))],
                                   principal="alice")
    t0 = time.time()
    engine.views_by_id[unused["id"]].used = t0 - 60          # registered a minute ago, never used
    engine.touch(engine.views_by_id[used["id"]])
    assert engine.sweep_views(t0 + 30) == []
    engine.touch_covered("alice", "b", "u/")                 # a renewed proof covers "used" only
    later = engine.views_by_id[used["id"]].used
    assert engine.sweep_views(later + 99, grace=1e9) == []   # just after a start: nothing yet
    assert engine.sweep_views(later + 99) == [unused["id"]]
    assert engine.view_log()[-1]["op"] == "forgotten" and "no mount used it" in engine.view_log()[-1]["reason"]
    # used times are kept in the records (restarts count from them) once they moved on enough
    info = engine.views_by_id[used["id"]]
    info.used = later + 20
    assert engine.sweep_views(later + 21) == []
    rec = records.unpack_view(engine.store.get_raw(records.k_view(used["id"])))
    assert rec["used"] == later + 20 and rec["principals"].keys() == {"alice"}
