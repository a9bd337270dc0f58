"""fsync(2) in an eager mount, the mount option ``fsync``: ``upload`` (the default) waits
for the file's upload; ``journal`` returns once the file's bytes and its journal record are
durable on the local disk (fsync'd with their directories) and leaves the upload to the
background — the core against the fakes, with os.fsync/os.fdatasync recorded."""
from __future__ import annotations

import errno
import json
import os

import pytest
import trio
import trio.testing

from delvefs.client.mount.errors import FsError

from .conftest import view
from .fakes import held

pytestmark = pytest.mark.trio

W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def wview(name="v", **kw):
    kw.setdefault("writable", True)
    return view(name, **kw)


async def journal_world(make_world, *views, **settings):
    settings.setdefault("fsync", "journal")
    return await make_world(*(views or (wview(),)), eager=True, write_back=0, **settings).start()


@pytest.fixture
def synced(monkeypatch):
    """Every fsync and fdatasync of the process from now on: [(call, path)]."""
    calls: list[tuple[str, str]] = []

    def recording(name, real):
        def call(fd):
            calls.append((name, os.readlink(f"/proc/self/fd/{fd}")))
            return real(fd)
        return call
    monkeypatch.setattr(os, "fsync", recording("fsync", os.fsync))
    monkeypatch.setattr(os, "fdatasync", recording("fdatasync", os.fdatasync))
    return calls


def records(w) -> list[dict]:
    d = w.cache.journal.dir
    return [json.loads((d / n).read_text()) for n in sorted(os.listdir(d)) if n.endswith(".json")]


def real(path) -> str:
    return os.path.realpath(path)


async def until(condition, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


async def test_fsync_journal_returns_without_the_upload_with_bytes_and_record_durable(
        make_world, synced):
    w = await journal_world(make_world)
    called, release = held(w.store, "upload")          # S3 never answers meanwhile
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, _ = await w.open_write("v/f")
        await w.fs.write(fh, 0, b"durable here")
        entry = w.cache.get("b", "data/f")
        with trio.fail_after(5):
            await w.fs.fsync(fh)                       # returns: nothing waits for S3
        assert w.obj("v", "data/f") is None
        [record] = records(w)
        assert (record["key"], record["base"], record["file"]) == \
            ("data/f", "", os.path.basename(entry.path))
        with open(entry.path, "rb") as f:
            assert f.read() == b"durable here"
        journal_dir, data_dir = real(w.cache.journal.dir), real(w.cache.dir)
        assert ("fdatasync", real(entry.path)) in synced            # the bytes
        assert ("fsync", real(data_dir)) in synced                  # the data file's name
        assert ("fsync", f"{journal_dir}/{record['file']}.json") in synced   # the record
        assert ("fsync", journal_dir) in synced                     # the record's name
        assert ("fsync", real(w.tmp_path / "cache")) in synced      # the cache dir's entries, once
        assert not called.is_set()
        # the upload follows the close in the background, as without fsync
        await w.close(fh)
        with trio.fail_after(10):
            await called.wait()
        release.set()
        await until(lambda: w.obj("v", "data/f") is not None)
        assert w.obj("v", "data/f")["data"] == b"durable here"
        nursery.cancel_scope.cancel()


async def test_a_file_fsynced_to_the_journal_survives_a_crash_while_s3_refuses(make_world):
    w = await journal_world(make_world)
    w.store.fail_writes = errno.EIO                    # S3 down
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"kept")
    await w.fs.fsync(fh)                               # no error: the disk has it
    assert w.obj("v", "data/f") is None and w.store.wcalls["upload"] == 0
    w2 = w.restart()                                   # the mount died; its journal stays
    await w2.start()
    w2.store.fail_writes = None
    w2.fs.recover()
    assert await w2.fs.sync_all() == []
    assert w2.obj("v", "data/f")["data"] == b"kept"


async def test_fsync_upload_is_the_default_and_waits_for_the_upload(make_world, synced):
    w = await make_world(wview(), eager=True).start()
    assert w.settings.fsync == "upload"
    called, release = held(w.store, "upload")
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"in S3 first")
    done = trio.Event()

    async def fsync():
        await w.fs.fsync(fh)
        done.set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fsync)
        with trio.fail_after(5):
            await called.wait()                        # the upload is under way ...
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()                       # ... and fsync waits for it
        release.set()
    assert w.obj("v", "data/f")["data"] == b"in S3 first"
    assert not [p for _, p in synced if p.startswith(real(w.cache.journal.dir))]
    await w.close(fh)


async def test_fsync_journal_writes_a_record_that_is_not_current(make_world, synced):
    w = await journal_world(make_world)
    w.add("v", "data/f", b"base")
    fh, _ = await w.open_write("v/f", os.O_RDWR | os.O_TRUNC)
    await w.fs.write(fh, 0, b"new")
    entry = w.cache.get("b", "data/f")
    [record] = records(w)
    assert record["base"] == w.obj("v", "data/f")["etag"]
    path = w.cache.journal.dir / f"{record['file']}.json"
    # unchanged: fsync'd, not written again
    ino = os.stat(path).st_ino
    await w.fs.fsync(fh)
    assert os.stat(path).st_ino == ino
    # the entry's record changed in memory only (as an old record completed by ``take``)
    entry.meta["base"] = "0123"
    await w.fs.fsync(fh)
    [record] = records(w)
    assert record["base"] == "0123"
    assert ("fsync", real(path)) in synced
    await w.fs.release(fh)


async def test_fsync_journal_of_a_partly_cached_big_object_syncs_its_ranges_log(make_world, synced):
    w = await journal_world(make_world)
    w.add("v", "data/big", bytes(100_000))
    fh, _ = await w.open_write("v/big", os.O_RDWR)    # sparse: nothing downloaded
    await w.fs.write(fh, 50_000, b"changed")
    entry = w.cache.get("b", "data/big")
    assert entry.source is not None and os.path.exists(entry.path + ".ranges")
    await w.fs.fsync(fh)
    assert ("fsync", real(entry.path + ".ranges")) in synced
    assert ("fdatasync", real(entry.path)) in synced
    assert w.store.calls["download"] == 0
    await w.fs.release(fh)


async def test_fsync_journal_of_a_scratch_file_is_durable_and_not_uploaded(make_world, synced):
    w = await journal_world(make_world, wview(object="data/*.txt"))
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, _ = await w.open_write("v/draft.tmp")     # cannot match the view: scratch
        await w.fs.write(fh, 0, b"draft")
        await w.fs.fsync(fh)
        [record] = records(w)
        entry = w.cache.get("b", "data/draft.tmp")
        assert ("fdatasync", real(entry.path)) in synced
        assert ("fsync", real(w.cache.journal.dir / f"{record['file']}.json")) in synced
        await w.close(fh)
        await until(lambda: not (w.fs.written._pending or w.fs.written._waiting))
        nursery.cancel_scope.cancel()
    assert w.store.wcalls["upload"] == 0 and w.fs.scratch_files() == ["v/draft.tmp"]


async def test_fsync_journal_fails_when_the_cache_disk_does(make_world, monkeypatch):
    w = await journal_world(make_world)
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"x")

    def broken(fd):
        raise OSError(errno.EIO, "disk error")
    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(FsError) as e:
        await w.fs.fsync(fh)
    assert e.value.errno == errno.EIO
    assert w.cache.get("b", "data/f").dirty            # kept, to be uploaded
    monkeypatch.undo()
    await w.close(fh)


async def test_fsync_journal_is_for_eager_mounts_only(make_world):
    # refused by the options (tests/unit/test_options.py); a core told so anyway uploads
    w = await make_world(wview(), fsync="journal").start()
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"strict")
    await w.fs.fsync(fh)
    assert w.obj("v", "data/f")["data"] == b"strict"
    await w.close(fh)


async def test_a_record_removed_meanwhile_needs_nothing_and_the_cache_dir_is_synced_once(
        make_world, synced):
    w = await journal_world(make_world)
    j = w.cache.journal
    j.make_durable({"file": "w-uploaded-meanwhile"})   # its file was uploaded: no record
    j.make_durable({"file": "w-uploaded-meanwhile"})
    cache_dir = real(w.tmp_path / "cache")
    assert synced.count(("fsync", real(j.dir))) == 2
    assert synced.count(("fsync", cache_dir)) == 1
