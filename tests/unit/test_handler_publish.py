"""Atomic directory publish in the handler's engine (real LevelDB, crafted events): a batch's
objects are in no view until its manifest and every object it names are in, then all show
in one commit; forged or incomplete manifests release nothing; held state survives a
restart; a batch whose manifest never came is shown at its deadline."""
from __future__ import annotations

import time

import pytest

from delvefs.shared import manifests as batch_format
from eventhandler import statedb as st
from eventhandler.devtools import spec
from eventhandler.engine import Engine
from eventhandler.events import make_message, parse_message
from eventhandler.metrics import Metrics
from tests.unit.test_handler_engine import FakeBucketReader, keys, ready

NOW_NS = time.time_ns()


def open_engine(path, timeout=3600.0):
    store = st.Store(str(path))
    eng = Engine(store, Metrics(), s3=FakeBucketReader(), s3_workers=2, job_workers=1,
                 publish_timeout=timeout)
    eng.start()
    return eng


@pytest.fixture
def db(tmp_path):
    return tmp_path / "db"


@pytest.fixture
def engine(db):
    eng = open_engine(db)
    yield eng
    eng.close()
    eng.store.close()


def obj_event(key, seq, etag, batch=None):
    meta = {batch_format.BATCH_FIELD: batch} if batch else None
    return parse_message(make_message("s3:ObjectCreated:Copy", "b", key, seq, size=3, etag=etag,
                                      metadata=meta)[0])


def manifest_event(parent, batch, items, seq, **override):
    meta = {**batch_format.manifest_metadata(batch, items), **override}
    return parse_message(make_message("s3:ObjectCreated:Put", "b", batch_format.manifest_key(parent, batch),
                                      seq, size=2, etag="m", metadata=meta)[0])


def view(eng):
    (out,) = eng.register([("out", spec("b"))])
    return ready(eng, out["id"])


FILES = [("out/s1/a.sam", "e1"), ("out/s1/a.stats", "e2"), ("out/s1/sub/c", "e3")]


def publish_objects(eng, batch, files=FILES, seq=NOW_NS):
    for i, (key, etag) in enumerate(files):
        eng.apply_events(obj_event(key, seq + i, etag, batch))


def test_objects_show_together_when_the_manifest_arrives(engine):
    info = view(engine)
    engine.apply_events(obj_event("out/other", NOW_NS, "e0"))  # an ordinary object: at once
    before = engine.buckets["b"].committed
    batch = batch_format.new_batch(time.time())
    publish_objects(engine, batch)
    assert keys(engine, info) == ["out/other"]
    assert engine.changes(info, before, 100)["changes"] == []
    assert engine.lookup("b", "out/s1/a.sam")["views"] == []
    engine.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 10))
    assert keys(engine, info) == ["out/other"] + [k for k, _ in FILES]
    delta = engine.changes(info, before, 100)
    assert sorted(c["key"] for c in delta["changes"]) == [k for k, _ in FILES]
    assert all(c["op"] == "put" for c in delta["changes"])
    # the manifest is no object, and its batch is done with
    assert engine.lookup("b", batch_format.manifest_key("out/", batch)) is None
    assert engine.store.held_members("b", batch) == []
    assert engine.metrics.publish_committed._value.get() == 1


def test_a_manifest_before_its_objects_waits_for_all_of_them(engine):
    info = view(engine)
    batch = batch_format.new_batch(time.time())
    engine.apply_events(manifest_event("out/", batch, FILES, NOW_NS))
    publish_objects(engine, batch, FILES[:2])
    assert keys(engine, info) == []
    publish_objects(engine, batch, FILES[2:], seq=NOW_NS + 5)
    assert keys(engine, info) == [k for k, _ in FILES]


@pytest.mark.parametrize("forged", [
    [(k, e) for k, e in FILES[:2]],                   # names a part of the batch only
    [(k, "other") for k, _ in FILES],                 # other ETags
    FILES + [("out/s1/not-there", "e9")],             # one object more
])
def test_a_manifest_that_does_not_name_exactly_the_held_objects_releases_nothing(engine, forged):
    info = view(engine)
    batch = batch_format.new_batch(time.time())
    publish_objects(engine, batch)
    engine.apply_events(manifest_event("out/", batch, forged, NOW_NS + 10))
    assert keys(engine, info) == []


def test_a_replaced_object_is_no_longer_the_version_held(engine):
    info = view(engine)
    batch = batch_format.new_batch(time.time())
    publish_objects(engine, batch)
    engine.apply_events(obj_event("out/s1/a.sam", NOW_NS + 5, "other"))  # someone else's PUT
    assert keys(engine, info) == ["out/s1/a.sam"]
    engine.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 10))
    assert keys(engine, info) == ["out/s1/a.sam"]  # the batch is incomplete: held on


def test_held_objects_and_the_manifest_survive_a_restart(db):
    eng = open_engine(db)
    info = view(eng)
    batch = batch_format.new_batch(time.time())
    publish_objects(eng, batch)
    eng.close()
    eng.store.close()
    eng = open_engine(db)
    try:
        info = eng.views_by_id[info.id]
        assert keys(eng, info) == []
        eng.apply_events(obj_event(FILES[0][0], NOW_NS, FILES[0][1], batch))  # redelivered: stale
        eng.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 10))
        assert keys(eng, info) == [k for k, _ in FILES]
    finally:
        eng.close()
        eng.store.close()


def test_a_batch_without_manifest_is_shown_at_its_deadline(db):
    eng = open_engine(db, timeout=60.0)
    try:
        info = view(eng)
        batch = batch_format.new_batch(time.time())
        publish_objects(eng, batch)
        assert eng.expire_batches(time.time() + 1) == 0
        assert keys(eng, info) == []
        assert eng.expire_batches(time.time() + 61) == 1
        assert keys(eng, info) == [k for k, _ in FILES]
        assert eng.store.load_batches() == {} and eng.store.held_members("b", batch) == []
        # its manifest, late: nothing more to do
        eng.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 10))
        assert keys(eng, info) == [k for k, _ in FILES]
    finally:
        eng.close()
        eng.store.close()


def test_copies_of_published_objects_are_not_held(engine):
    info = view(engine)
    batch = batch_format.new_batch(time.time())
    publish_objects(engine, batch)
    engine.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 10))
    # a later copy carries the metadata along: the batch is committed, so it shows at once
    engine.apply_events(obj_event("out/copy", NOW_NS + 20, "e1", batch))
    assert "out/copy" in keys(engine, info)
    # so does an object naming a batch older than the publish timeout
    old = batch_format.new_batch(time.time() - 7200)
    engine.apply_events(obj_event("out/old", NOW_NS + 30, "e7", old))
    assert "out/old" in keys(engine, info)


def test_an_unusable_manifest_is_ignored(engine):
    info = view(engine)
    batch = batch_format.new_batch(time.time())
    publish_objects(engine, batch)
    engine.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 10,
                                       **{batch_format.COUNT_FIELD: "many"}))
    assert keys(engine, info) == []
    engine.apply_events(manifest_event("out/", batch, FILES, NOW_NS + 11))
    assert keys(engine, info) == [k for k, _ in FILES]
