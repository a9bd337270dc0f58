"""Directory renames are published as one batch: every new object carries the batch id in
its metadata, then a manifest names them (count and digest of keys and ETags) and is deleted;
a mount that died before the manifest finishes the batch at its next start."""
from __future__ import annotations

import errno

import pytest

from delvefs.client.mount.errors import FsError, StoreError
from delvefs.shared import manifests as batch_format

from .conftest import view

pytestmark = pytest.mark.trio


def wview(name="v", **kw):
    kw.setdefault("writable", True)
    return view(name, **kw)


def batch_objects(w, bucket="b"):
    """{key: (batch, etag)} of the objects of ``bucket`` that name a batch."""
    return {k: (o["metadata"][batch_format.BATCH_FIELD], o["etag"]) for (b, k), o in w.store.objects.items()
            if b == bucket and batch_format.BATCH_FIELD in o["metadata"]}


def assert_manifest_names(w, manifest: dict, objects: dict) -> None:
    batch = manifest["metadata"][batch_format.BATCH_FIELD]
    items = [(k, etag) for k, (b, etag) in objects.items() if b == batch]
    assert manifest["metadata"] == batch_format.manifest_metadata(batch, items)
    assert manifest["key"] == batch_format.manifest_key(manifest["key"].rsplit(".delvefs-publish-", 1)[0], batch)
    assert batch_format.manifest_batch(manifest["key"]) == batch


async def test_a_renamed_directory_is_published_as_one_batch(make_world):
    w = make_world(wview())
    for k in ["data/tmp/a.sam", "data/tmp/sub/b.stats"]:
        w.add("v", k, k.encode())
    await w.start()
    top = await w.path("v")
    await w.write("v/tmp/c.log", b"written here")  # a dirty file: uploaded with the batch
    await w.fs.rename(top.ino, "tmp", top.ino, "s1")
    objects = batch_objects(w)
    assert sorted(objects) == ["data/s1/a.sam", "data/s1/c.log", "data/s1/sub/b.stats"]
    assert len({b for b, _ in objects.values()}) == 1
    (manifest,) = w.store.manifests
    assert manifest["key"] == "data/" + batch_format.MANIFEST_NAME + objects["data/s1/a.sam"][0]
    assert_manifest_names(w, manifest, objects)
    # the manifest is deleted once written; nothing is left in the journal
    assert sorted(k for _, k in w.store.objects) == sorted(objects)
    assert w.cache.publishes.read() == []
    assert sorted(await w.names("v/s1")) == ["a.sam", "c.log", "sub"]


async def test_scratch_directory_renamed_into_the_view_publishes_its_files(make_world):
    # a view of the samples ("data/s*"): a directory ".tmp-s1" is scratch
    w = await make_world(wview("v", object="data/s*.sam", root="data/")).start()
    top = await w.path("v")
    await w.fs.mkdir(top.ino, ".tmp-s1")
    for name in ("x.sam", "y.sam"):
        await w.write(f"v/.tmp-s1/{name}", name.encode())
    await w.write("v/.tmp-s1/notes.txt", b"stays a scratch file")
    assert w.store.objects == {}                      # scratch: nothing uploaded yet
    await w.fs.rename(top.ino, ".tmp-s1", top.ino, "s1")
    objects = batch_objects(w)
    assert sorted(objects) == ["data/s1/x.sam", "data/s1/y.sam"]
    (manifest,) = w.store.manifests
    assert_manifest_names(w, manifest, objects)


async def test_renaming_a_file_is_no_batch(make_world):
    w = make_world(wview())
    w.add("v", "data/a.txt", b"a")
    await w.start()
    top = await w.path("v")
    await w.fs.rename(top.ino, "a.txt", top.ino, "b.txt")
    assert batch_objects(w) == {} and w.store.manifests == []


async def test_a_mount_killed_before_the_manifest_finishes_the_batch_at_its_next_start(make_world):
    w = make_world(wview())
    for k in ["data/tmp/a", "data/tmp/b"]:
        w.add("v", k, k.encode())
    await w.start()
    top = await w.path("v")
    await w.write("v/tmp/c", b"dirty")

    async def refused(*args, **kw):
        raise StoreError(errno.EIO, "PUT: connection reset")
    w.store.put_small = refused  # the manifest never gets out (as if the mount died here)
    with pytest.raises(FsError):
        await w.fs.rename(top.ino, "tmp", top.ino, "s1")
    objects = batch_objects(w)
    assert sorted(objects) == ["data/s1/a", "data/s1/b", "data/s1/c"]
    assert len(w.cache.publishes.read()) == 1
    del w.store.put_small
    w2 = await w.restart().start()
    assert await w2.fs.publisher.finish_all() == []
    (manifest,) = w2.store.manifests
    assert_manifest_names(w2, manifest, objects)
    assert w2.cache.publishes.read() == []


async def test_a_batch_recorded_before_its_moves_is_moved_and_published_at_the_next_start(make_world):
    w = make_world(wview())
    for k in ["data/tmp/a", "data/tmp/b"]:
        w.add("v", k, k.encode())
    await w.start()
    # the mount died right after recording the batch: nothing was copied yet
    await w.fs.publisher.begin("b", "v", "data/", [("data/tmp/a", "data/s1/a"),
                                                   ("data/tmp/b", "data/s1/b")])
    w2 = await w.restart().start()
    assert await w2.fs.publisher.finish_all() == []
    objects = batch_objects(w2)
    assert sorted(k for _, k in w2.store.objects) == ["data/s1/a", "data/s1/b"]
    (manifest,) = w2.store.manifests
    assert_manifest_names(w2, manifest, objects)


async def test_a_dead_mounts_publish_record_is_taken_over_by_a_mount_of_its_views_file(tmp_path):
    import json
    import os

    from delvefs.client.mount.cache import journal
    views = tmp_path / "views.yaml"
    views.write_text("v: {bucket: b}\n")
    dead = tmp_path / "mounts" / "dead"
    os.close(journal.claim(dead, str(views)))  # its mount is gone: the lock is free
    journal.PublishJournal(dead / journal.PUBLISH).write(
        {"batch": batch_format.new_batch(0), "bucket": "b", "manifest": "m", "moves": []})
    here = tmp_path / "mounts" / "here"
    fd = journal.claim(here, str(views))
    try:
        assert journal.adopt_orphans(here, tmp_path / "mounts", str(views)) == [str(dead)]
    finally:
        os.close(fd)
    (record,) = journal.PublishJournal(here / journal.PUBLISH).read()
    assert record["bucket"] == "b" and not list((dead / journal.PUBLISH).iterdir())
    assert json.loads((here / journal.OWNER).read_text())["views"] == str(views.resolve())
