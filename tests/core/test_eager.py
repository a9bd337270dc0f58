"""Conditional uploads and conflict copies, journal replay that never clobbers, eager mode
(background uploads, batched deletes, sync, upload states) — the core against the fakes."""
from __future__ import annotations

import errno
import json
import os

import pytest
import trio
import trio.testing

from delvefs.client.mount.cache import datacache
from delvefs.client.mount.cache import journal
from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs.deletes import DeleteQueue
from delvefs.client.mount.settings import MountSettings

from .conftest import view
from .fakes import held

pytestmark = pytest.mark.trio

W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def wview(name="v", **kw):
    kw.setdefault("writable", True)
    return view(name, **kw)


def conflict_names(names: list[str], name: str) -> list[str]:
    return [n for n in names if n.startswith(name + ".conflict-")]


# ------------------------------------------------------------ conditional uploads

async def test_close_after_another_writer_changed_the_object_keeps_a_conflict_copy(make_world):
    w = make_world(wview())
    w.add("v", "data/f", b"base")
    await w.start()
    fh, _ = await w.open_write("v/f", os.O_RDWR)
    await w.fs.write(fh, 0, b"mine")
    w.store.put("b", "data/f", b"theirs")          # another writer, while it is open
    with pytest.raises(FsError) as e:
        await w.close(fh)
    assert e.value.errno == errno.EIO
    assert w.obj("v", "data/f")["data"] == b"theirs"            # never overwritten
    names = await w.names("v")
    [copy] = conflict_names(names, "f")
    assert await w.read(f"v/{copy}") == b"mine"                 # never dropped
    assert await w.read("v/f") == b"theirs"                     # the key shows S3's version
    assert ("b", f"data/{copy}") not in w.store.objects         # the copy is not uploaded
    [report] = w.fs.upload_report()
    assert report["state"] == "conflict" and report["path"] == f"v/{copy}"
    assert (await w.fs.getxattr((await w.path(f"v/{copy}")).ino,
                                "user.delvefs.upload")).startswith(b"conflict: ")
    assert w.fs.conflict_copies() and w.fs.scratch_files() == []
    # renamed to a name of its own, the copy is an ordinary file again: uploaded
    top = await w.path("v")
    await w.fs.rename(top.ino, copy, top.ino, "f.mine")
    assert w.obj("v", "data/f.mine")["data"] == b"mine"
    assert w.fs.upload_report() == []


async def test_a_new_file_does_not_overwrite_an_object_created_meanwhile(make_world):
    w = await make_world(wview()).start()
    fh, _ = await w.open_write("v/new")
    await w.fs.write(fh, 0, b"mine")
    w.store.put("b", "data/new", b"theirs")         # If-None-Match: * fails
    with pytest.raises(FsError):
        await w.close(fh)
    assert w.obj("v", "data/new")["data"] == b"theirs"
    assert conflict_names(await w.names("v"), "new")


async def test_consecutive_closes_of_one_file_are_each_based_on_the_last_upload(make_world):
    w = make_world(wview())
    w.add("v", "data/f", b"one")
    await w.start()
    await w.write("v/f", b"two")
    await w.write("v/f", b"three", os.O_WRONLY)      # based on "two", not the listing's "one"
    fh, _ = await w.open_write("v/f", os.O_RDWR)
    await w.fs.write(fh, 0, b"4")
    await w.fs.fsync(fh)
    await w.fs.write(fh, 1, b"4")                    # written again after the fsync's upload
    await w.close(fh)
    assert w.obj("v", "data/f")["data"] == b"44ree"
    assert w.store.conflicts == 0


# ------------------------------------------------------------ journal replay

async def test_replay_after_a_crash_never_clobbers_a_newer_object(make_world):
    w = make_world(wview())
    w.add("v", "data/kept", b"base")
    w.add("v", "data/gone", b"base")
    await w.start()
    w.store.fail_writes = errno.EIO
    for name in ("kept", "gone", "fine"):
        with pytest.raises(FsError):
            await w.write(f"v/{name}", f"pre-crash {name}".encode())
    w.store.fail_writes = None
    w.store.put("b", "data/kept", b"newer")          # meanwhile, by someone else
    w.remove("v", "data/gone")                       # deleted on purpose
    w2 = w.restart()                                 # SIGKILL, then a new mount
    await w2.start()
    w2.fs.recover()
    async with trio.open_nursery() as nursery:
        await nursery.start(w2.fs.run_uploads)
        while queued(w2):
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert w2.obj("v", "data/kept")["data"] == b"newer"
    assert w2.obj("v", "data/gone") is None          # not brought back
    assert w2.obj("v", "data/fine")["data"] == b"pre-crash fine"
    names = await w2.names("v")
    for name in ("kept", "gone"):
        [copy] = conflict_names(names, name)
        assert await w2.read(f"v/{copy}") == f"pre-crash {name}".encode()
    # the conflict copies stay in the journal, also for the mount after
    w3 = w2.restart()
    await w3.start()
    w3.fs.recover()
    assert len(conflict_names(await w3.names("v"), "kept")) == 1
    assert sorted(r["state"] for r in w3.fs.upload_report()) == ["conflict", "conflict"]


@pytest.mark.parametrize("existing, outside, uploaded", [
    (False, None, True), (False, b"theirs", False), (True, b"theirs", True), (True, None, False)])
async def test_an_old_journal_record_without_a_base_is_replayed_after_a_head(
        make_world, existing, outside, uploaded):
    w = make_world(wview())
    await w.start()
    if outside is not None:
        w.store.put("b", "data/f", outside)
    w.store.fail_writes = errno.EIO
    with pytest.raises(FsError):
        await w.write("v/f", b"old record")
    w.store.fail_writes = None
    [record] = list(w.cache.journal.dir.iterdir())
    r = json.loads(record.read_text())
    del r["base"]                                    # as an older version wrote it
    r["existing"] = existing
    record.write_text(json.dumps(r))
    w2 = w.restart()
    await w2.start()
    w2.fs.recover()
    [entry] = w2.fs.written.entries()
    try:
        await w2.fs.uploads.upload(entry)
    except FsError:
        pass
    data = (w2.obj("v", "data/f") or {}).get("data")
    assert (data == b"old record") is uploaded
    if not uploaded:
        assert data == outside
        assert conflict_names(await w2.names("v"), "f")


async def test_a_failed_journal_write_is_tried_again(make_world):
    w = await make_world(wview()).start()
    fh, _ = await w.open_write("v/f")
    entry = w.cache.get("b", "data/f")
    real = w.cache.journal.write
    w.cache.journal.write = lambda *a, **kw: (_ for _ in ()).throw(
        datacache.StoreError(errno.ENOSPC, "journal: disk full"))
    with pytest.raises(FsError) as e:
        await w.fs.write(fh, 0, b"x")
    assert e.value.errno == errno.ENOSPC and not entry.journaled
    w.cache.journal.write = real
    await w.fs.write(fh, 0, b"x")                    # journaled now, before the byte
    assert entry.journaled and len(os.listdir(w.cache.journal)) == 1
    with pytest.raises(FsError) as e:                # the failed write's error, at close
        await w.close(fh)
    assert e.value.errno == errno.ENOSPC


async def test_journals_of_earlier_mounts_elsewhere_are_taken_over_once(tmp_path):
    views = tmp_path / "views.yaml"
    views.write_text("v: {bucket: b, object: 'data/*'}\n")
    root = tmp_path / "mounts"
    old, new, busy = root / "old", root / "new", root / "busy"
    for d in (old, busy):
        os.close(journal.claim(d, str(views)))
        (d / "journal").mkdir()
        (d / "data").mkdir()
        (d / "data" / "w-1").write_bytes(b"dirty")
        (d / "journal" / "w-1.json").write_text(json.dumps(
            {"file": "w-1", "bucket": "b", "key": "data/f", "view": "v", "base": ""}))
    held = journal.claim(busy, str(views))        # a live mount holds this one
    try:
        fd = journal.claim(new, str(views))
        with pytest.raises(BlockingIOError):        # one mount per cache dir
            journal.claim(new, str(views))
        assert journal.adopt_orphans(new, root, str(views)) == [str(old)]
        assert (new / "data" / "w-1").read_bytes() == b"dirty"
        assert os.listdir(old / "journal") == [] and os.listdir(busy / "journal") == ["w-1.json"]
        other = tmp_path / "other.yaml"
        other.write_text("x: {bucket: b, object: 'x/*'}\n")
        assert journal.adopt_orphans(root / "third", root, str(other)) == []
        cache = datacache.DataCache(new)
        assert [r["key"] for r in cache.recovered] == ["data/f"]
        os.close(fd)
    finally:
        os.close(held)


# ------------------------------------------------------------ eager mode

async def eager_world(make_world, *views, **settings):
    return await make_world(*(views or (wview(),)), eager=True, **settings).start()


def queued(w) -> bool:
    """Some closed file is still to be uploaded (in its write-back delay, or queued)."""
    return bool(w.fs.written._pending or w.fs.written._waiting)


async def settle(w):
    """Until every queued upload and delete is done (or failed once), and the journal
    records of the uploaded files are gone. (The files closed last wait out the write-back
    delay first: ``write_back``, 2 s by default.)"""
    while queued(w) and not w.fs.written._failures or w.fs.deletes and not any(
            d["error"] for d in w.fs.deletes.queued.values()) or w.cache.journal.removals_pending():
        await trio.sleep(0.005)


async def test_eager_close_returns_before_the_upload_readers_here_see_it_at_once(make_world):
    w = await eager_world(make_world)
    async with trio.open_nursery() as nursery:
        gate = trio.Event()
        real = w.store.upload

        async def held_upload(*a, **kw):
            await gate.wait()
            return await real(*a, **kw)
        w.store.upload = held_upload
        await nursery.start(w.fs.run_uploads)
        await w.write("v/f", b"eager")               # returns: journaled, not uploaded
        assert w.obj("v", "data/f") is None
        assert await w.read("v/f") == b"eager" and await w.names("v") == ["f"]
        assert len(os.listdir(w.cache.journal)) == 1
        f = await w.path("v/f")
        with trio.fail_after(5):                     # once the mount is idle
            while not w.fs.written._uploading:
                await trio.sleep(0.005)
        assert await w.fs.getxattr(f.ino, "user.delvefs.upload") == b"uploading"
        assert [r["state"] for r in w.fs.upload_report()] == ["uploading"]
        gate.set()
        await settle(w)
        assert w.obj("v", "data/f")["data"] == b"eager"
        with pytest.raises(FsError) as e:
            await w.fs.getxattr(f.ino, "user.delvefs.upload")
        assert e.value.errno == errno.ENODATA
        assert os.listdir(w.cache.journal) == [] and w.fs.upload_report() == []
        nursery.cancel_scope.cancel()


class HeldUploads:
    """Wraps the fake store's upload: each one waits at ``gate``; ``running`` counts those
    under way, ``most`` the most at once."""

    def __init__(self, w):
        self.running = self.most = 0
        self.gate = trio.Event()
        self._real = w.store.upload
        w.store.upload = self._held

    async def _held(self, *a, **kw):
        self.running += 1
        self.most = max(self.most, self.running)
        await self.gate.wait()
        self.running -= 1
        return await self._real(*a, **kw)


async def test_eager_uploads_run_many_at_a_time(make_world):
    w = await eager_world(make_world, upload_concurrency=4)
    uploads = HeldUploads(w)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        for i in range(12):
            await w.write(f"v/f{i}", b"x%d" % i)
        with trio.fail_after(5):
            while uploads.running < 4:
                await trio.sleep(0.001)
        await trio.sleep(0.01)
        assert uploads.running == 4                # no more than the bound
        uploads.gate.set()
        await settle(w)
        nursery.cancel_scope.cancel()
    assert uploads.most == 4 and w.store.wcalls["upload"] == 12


async def test_eager_failures_are_retried_reported_and_synced(make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = await eager_world(make_world)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        w.store.fail_writes = errno.EIO
        await w.write("v/f", b"kept")                # close succeeds: it is journaled
        f = await w.path("v/f")
        with trio.fail_after(60):                    # its write-back delay, then a try
            while not w.fs.written._failures:
                await trio.sleep(0.01)
        state = await w.fs.getxattr(f.ino, "user.delvefs.upload")
        assert state.startswith(b"failed: ") and b"fake S3 refuses" in state
        [r] = w.fs.upload_report()
        assert r["state"] == "failed" and r["path"] == "v/f" and r["size"] == 4
        failed = await w.fs.sync_all()
        assert len(failed) == 1 and failed[0].startswith("v/f: ")
        w.store.fail_writes = None
        assert await w.fs.sync_all() == []
        assert w.obj("v", "data/f")["data"] == b"kept"
        nursery.cancel_scope.cancel()


async def test_eager_fsync_waits_for_the_upload(make_world):
    w = await eager_world(make_world)
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"synced")
    await w.fs.fsync(fh)
    assert w.obj("v", "data/f")["data"] == b"synced"
    await w.close(fh)


@pytest.mark.parametrize("big, closed_before", [(True, False), (True, True), (False, False)])
async def test_a_background_upload_gives_way_to_a_writer_that_opens_the_file_again(
        make_world, big, closed_before):
    # fio lays its file out (create, size, close), then opens it again to write it: a
    # multipart upload begun at the first close is given up before its next part once the
    # file is open for writing again, or was written and closed again meanwhile (no
    # failure, no retry delay), and the last close uploads what was written; a one-PUT
    # upload is not (it is sent whole, or not at all)
    w = await eager_world(make_world, write_back=0)
    w.store.part_size = 1024 if big else 1 << 20
    first, second = b"a" * 4096, b"b" * 4096
    called, release = held(w.store, "upload")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/f", first)
        with trio.fail_after(10):
            await called.wait()                       # the upload of the first close runs
        entry = w.cache.get("b", "data/f")
        fh, _ = await w.open_write("v/f", os.O_RDWR)  # opened again, before a part went
        if closed_before:
            await w.fs.write(fh, 0, second)
            await w.close(fh)                          # ... written and closed, too
        release.set()
        with trio.fail_after(10):
            while w.fs.written.upload_state(entry)[0] == "uploading":
                await trio.sleep(0.005)
        if not closed_before:
            await w.fs.write(fh, 0, second)
        if big and not closed_before:
            assert w.obj("v", "data/f") is None        # given up: nothing in S3
            assert w.fs.written.upload_state(entry)[0] != "failed"
        elif not big:
            assert w.obj("v", "data/f")["data"] == first
        if not closed_before:
            await w.close(fh)
        with trio.fail_after(10):
            while entry.dirty or queued(w):            # every upload there is to be is done
                await trio.sleep(0.005)
        assert w.obj("v", "data/f")["data"] == second
        assert [u["data"] for u in w.store.uploaded] == ([] if big else [first]) + [second]
        nursery.cancel_scope.cancel()


async def test_eager_unlinks_are_one_delete_objects_batch(make_world):
    w = make_world(wview(), eager=True)
    for i in range(50):
        w.add("v", f"data/d/f{i}", b"x")
    await w.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        d = await w.path("v/d")
        for i in range(50):
            await w.fs.unlink(d.ino, f"f{i}")      # each returns at once
        top = await w.path("v")
        await w.fs.rmdir(top.ino, "d")
        assert await w.names("v") == []
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.store.delete_batches == 1 and len(w.store.deleted[0]) == 50
    assert w.store.wcalls["delete"] == 0
    assert not any(k.startswith("data/d/") for _, k in w.store.objects)


async def test_a_delete_queued_again_while_its_batch_is_under_way_is_still_owed():
    # the key is unlinked, its batch sent; meanwhile it is uploaded and unlinked again: the
    # answer to the first batch must not drop the second DELETE
    gate, sending, sent = trio.Event(), trio.Event(), []

    class Store:
        async def delete_many(self, bucket, keys):
            sent.append(list(keys))
            sending.set()
            await gate.wait()
            return {}
    q = DeleteQueue(Store(), MountSettings.defaults())
    q.queue("b", "data/f")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(q.send)
        await sending.wait()
        q.queue("b", "data/f")                     # again, while the first is under way
        gate.set()
    assert q.queued and list(q.queued) == [("b", "data/f")]
    await q.send()
    assert not q.queued and sent == [["data/f"], ["data/f"]]


async def test_eager_coalesces_renames_and_deletes_of_files_not_uploaded_yet(make_world):
    w = await eager_world(make_world)
    top = await w.path("v")
    await w.write("v/tmp1", b"final")              # queued, not uploaded (no uploader yet)
    await w.fs.rename(top.ino, "tmp1", top.ino, "final")
    await w.write("v/doomed", b"never")
    await w.fs.unlink(top.ino, "doomed")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await settle(w)
        nursery.cancel_scope.cancel()
    assert [u["key"] for u in w.store.uploaded] == ["data/final"]   # once, under its final name
    assert w.store.wcalls["delete"] == 0 and w.store.delete_batches == 0


async def test_an_upload_after_an_eager_unlink_of_its_key_sends_the_delete_first(make_world):
    w = make_world(wview(), eager=True, delete_gather=60.0)  # the batch would wait long
    w.add("v", "data/f", b"old")
    await w.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        top = await w.path("v")
        await w.fs.unlink(top.ino, "f")
        await w.write("v/f", b"new")               # a new file: If-None-Match once deleted
        with trio.fail_after(5):
            await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/f")["data"] == b"new" and w.store.conflicts == 0


async def test_a_killed_eager_mount_loses_nothing_close_returned_for(make_world):
    w = await eager_world(make_world)
    await w.write("v/a", b"alpha")                 # closed; the uploader never ran
    fh, _ = await w.open_write("v/b")
    await w.fs.write(fh, 0, b"beta")
    w2 = w.restart()
    await w2.start()
    w2.fs.recover()
    assert await w2.fs.sync_all() == []
    assert w2.obj("v", "data/a")["data"] == b"alpha" and w2.obj("v", "data/b")["data"] == b"beta"


# ------------------------------------------------------------ parts sent while written (strict)

async def test_a_large_new_file_sends_its_parts_while_it_is_written(make_world):
    w = await make_world(wview(), upload_while_writing=True).start()  # DELVEFS_UPLOAD_WHILE_WRITING=1
    w.store.part_size = 1000
    data = bytes(range(256)) * 20 + b"end"          # 5 full parts and 123 bytes
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, _ = await w.open_write("v/big.bin")
        for off in range(0, len(data), 700):
            await w.fs.write(fh, off, data[off:off + 700])
        [mp] = w.store.multiparts
        with trio.fail_after(5):
            while sorted(mp.sent) != [1, 2, 3, 4, 5]:  # before the close
                await trio.sleep(0.001)
        await w.fs.write(fh, 1500, b"X" * 10)         # into part 2, sent already
        await w.close(fh)
        expected = data[:1500] + b"X" * 10 + data[1510:]
        assert w.obj("v", "data/big.bin")["data"] == expected
        assert mp.sent.count(2) == 2 and mp.sent.count(6) == 1   # part 2 again, the last once
        assert w.store.wcalls["upload"] == 0 and not mp.aborted
        # renamed while written: the parts do not fit its new key; the whole file is uploaded
        fh, _ = await w.open_write("v/other.bin")
        await w.fs.write(fh, 0, data)
        top = await w.path("v")
        await w.fs.rename(top.ino, "other.bin", top.ino, "moved.bin")
        await w.close(fh)
        assert w.obj("v", "data/moved.bin")["data"] == data
        with trio.fail_after(5):                      # aborted in the background
            while not w.store.multiparts[1].aborted:
                await trio.sleep(0.001)
        assert w.store.wcalls["upload"] == 1
        nursery.cancel_scope.cancel()


async def test_parts_sent_while_written_complete_conditionally(make_world):
    w = await make_world(wview(), upload_while_writing=True).start()
    w.store.part_size = 1000
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, _ = await w.open_write("v/big.bin")
        await w.fs.write(fh, 0, b"m" * 3000)
        w.store.put("b", "data/big.bin", b"theirs")   # created meanwhile by someone else
        with pytest.raises(FsError):
            await w.close(fh)
        assert w.obj("v", "data/big.bin")["data"] == b"theirs"
        [copy] = conflict_names(await w.names("v"), "big.bin")
        assert await w.read(f"v/{copy}") == b"m" * 3000
        nursery.cancel_scope.cancel()


async def test_a_rename_onto_a_name_whose_delete_is_queued_sends_the_delete_first(make_world):
    w = make_world(wview(), eager=True, delete_gather=60.0)
    w.add("v", "data/a", b"moved")
    w.add("v", "data/b", b"removed")
    await w.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        top = await w.path("v")
        await w.fs.unlink(top.ino, "b")            # queued
        with trio.fail_after(5):
            await w.fs.rename(top.ino, "a", top.ino, "b")
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/b")["data"] == b"moved" and w.obj("v", "data/a") is None


@pytest.mark.parametrize("eager", [False, True])
async def test_a_file_renamed_while_written_keeps_its_writes_when_the_copy_gets_another_etag(
        make_world, eager):
    # uploaded by an fsync, still open for writing, renamed (a server-side copy whose ETag
    # is another than its source's, as a multipart copy's is): the handle writes on, under
    # the new name, and nothing it writes is lost
    w = make_world(wview(), eager=eager)
    w.store.multipart_copy_size = 4
    await w.start()
    fh, _ = await w.open_write("v/a", os.O_RDWR | os.O_CREAT)
    await w.fs.write(fh, 0, b"0123456789")
    await w.fs.fsync(fh)
    top = await w.path("v")
    await w.fs.rename(top.ino, "a", top.ino, "b")
    assert w.store.wcalls["copy"] == 1
    await w.fs.write(fh, 2, b"XY")
    await w.close(fh)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/b")["data"] == b"01XY456789" and w.obj("v", "data/a") is None
    assert await w.names("v") == ["b"] and await w.read("v/b") == b"01XY456789"


async def test_a_dirty_file_renamed_onto_one_uploaded_while_open_is_based_on_that_upload(make_world):
    # f is uploaded by an fsync while still open and written after it (still dirty, its
    # node not yet showing the upload); g, never uploaded, then replaces it: g's upload is
    # based on the version f's fsync left in S3, not on "nothing there"
    w = await eager_world(make_world)
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"one")
    await w.fs.fsync(fh)
    await w.fs.write(fh, 3, b"two")
    await w.close(fh)
    await w.write("v/g", b"gee")
    top = await w.path("v")
    await w.fs.rename(top.ino, "g", top.ino, "f")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/f")["data"] == b"gee" and w.obj("v", "data/g") is None
    assert await w.names("v") == ["f"] and w.fs.upload_report() == []


@pytest.mark.parametrize("eager", [False, True])
async def test_a_file_replaced_while_its_fsynced_descriptors_write_is_theirs_alone(make_world, eager):
    # two descriptors of f, one fsync'd (uploaded: clean, still written through them); a
    # rename of an object this mount never cached replaces f: the descriptors write and
    # read their own file, and the new f is written on the object the rename put there
    w = make_world(wview(), eager=eager)
    await w.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        w.add("v", "data/g", b"gee")
        first, node = await w.open_write("v/f", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        second, _ = await w.fs.open(node.ino, os.O_RDWR)
        await w.fs.setattr(node.ino, size=70000, fh=second)
        await w.fs.fsync(second)
        top = await w.path("v")
        await w.fs.rename(top.ino, "g", top.ino, "f")
        await w.fs.write(first, 28100, b"w" * 1299)
        fh, _ = await w.fs.open((await w.path("v/f")).ino, os.O_WRONLY | os.O_APPEND)
        await w.fs.write(fh, 3, b"APP")
        await w.close(fh)
        await w.close(second)
        await w.fs.fsync(first)
        assert await w.fs.read(first, 0, 100000) == bytes(28100) + b"w" * 1299 + bytes(70000 - 29399)
        await w.close(first)
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/f")["data"] == b"geeAPP" and w.obj("v", "data/g") is None
    assert await w.names("v") == ["f"] and w.fs.upload_report() == []


@pytest.mark.parametrize("eager", [False, True])
async def test_a_file_unlinked_while_its_fsynced_descriptor_reads_keeps_every_byte(
        make_world, eager):
    # a big object written in one place and fsync'd is rebuilt by S3 from its old version
    # (nothing else fetched): still open, it is unlinked — the bytes the descriptor never
    # read are fetched before the DELETE, and it reads all of them afterwards
    w = make_world(wview(), eager=eager)
    await w.start()
    data = bytearray(os.urandom(9 << 20))
    w.add("v", "data/f", bytes(data))
    fh, node = await w.open_write("v/f", os.O_RDWR)
    await w.fs.write(fh, 5, b"new")
    data[5:8] = b"new"
    await w.fs.fsync(fh)
    assert w.store.copied_bytes and w.obj("v", "data/f")["data"] == data
    top = await w.path("v")
    await w.fs.unlink(top.ino, "f")
    if eager:
        assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f") is None
    assert await w.fs.read(fh, 0, len(data)) == data
    await w.close(fh)


@pytest.mark.parametrize("eager", [False, True])
async def test_descriptors_reading_a_file_removed_or_replaced_here_read_it_on(make_world, eager):
    # opened for reading, nothing read yet (or one block of a bigger file): another process
    # unlinks one file and renames a third onto the other through this mount; the
    # descriptors read every byte of what they opened
    w = make_world(wview(), eager=eager)
    await w.start()
    small, big = os.urandom(5000), os.urandom(3 << 20)
    w.add("v", "data/a", small)
    w.add("v", "data/b", big)
    w.add("v", "data/c", b"sea")
    ha, _ = await w.fs.open((await w.path("v/a")).ino, os.O_RDONLY)
    hb, _ = await w.fs.open((await w.path("v/b")).ino, os.O_RDONLY)
    assert await w.fs.read(hb, 0, 10) == big[:10]          # a block of it cached
    top = await w.path("v")
    await w.fs.unlink(top.ino, "a")
    await w.fs.rename(top.ino, "c", top.ino, "b")
    if eager:
        assert await w.fs.sync_all() == []
    assert w.obj("v", "data/a") is None and w.obj("v", "data/b")["data"] == b"sea"
    assert await w.fs.read(ha, 0, 10000) == small
    assert await w.fs.read(hb, 0, len(big)) == big
    for fh in (ha, hb):
        await w.fs.release(fh)
    assert await w.read("v/b") == b"sea"


@pytest.mark.parametrize("eager", [False, True])
async def test_a_file_opened_for_writing_while_its_rename_copies_it_keeps_its_writes(
        make_world, eager):
    # another process opens the file (looked up before the rename) while the rename's
    # server-side copy runs: the open waits for the rename, its writes land at the new name
    w = make_world(wview(), eager=eager)
    await w.start()
    w.add("v", "data/a", b"0123456789")
    top, node = await w.path("v"), await w.path("v/a")
    gate, real = trio.Event(), w.store.copy

    async def slow_copy(*args, **kw):
        await gate.wait()
        return await real(*args, **kw)
    w.store.copy = slow_copy
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        nursery.start_soon(w.fs.rename, top.ino, "a", top.ino, "b")
        await trio.testing.wait_all_tasks_blocked()
        written = trio.Event()

        async def open_and_write():
            fh, _ = await w.fs.open(node.ino, os.O_RDWR)
            await w.fs.write(fh, 0, b"AB")
            await w.close(fh)
            written.set()
        nursery.start_soon(open_and_write)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await written.wait()
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/b")["data"] == b"AB23456789" and w.obj("v", "data/a") is None
    assert await w.names("v") == ["b"] and w.fs.upload_report() == []


@pytest.mark.parametrize("op", ["rename", "unlink"])
async def test_the_confirmation_of_its_own_delete_mid_operation_takes_nothing_from_the_tree(
        make_world, op):
    # the handler reports the DELETE of the source key (a refresh applies it) while the
    # rename or unlink that sent it still runs: the file moves, its emptied directory stays
    w = make_world(wview(ttl=0.0))
    w.add("v", "data/d/f", b"x")
    await w.start()
    d, top = await w.path("v/d"), await w.path("v")
    gate, real = trio.Event(), w.store.delete

    async def delete_then_confirmed(bucket, key):
        await real(bucket, key)
        w.handler.delete("v", key)
        await gate.wait()
    w.store.delete = delete_then_confirmed
    async with trio.open_nursery() as nursery:
        if op == "rename":
            nursery.start_soon(w.fs.rename, d.ino, "f", top.ino, "g")
        else:
            nursery.start_soon(w.fs.unlink, d.ino, "f")
        await trio.testing.wait_all_tasks_blocked()
        await w.names("v")                        # a refresh applies the handler's delete
        gate.set()
    assert await w.names("v") == (["d", "g"] if op == "rename" else ["d"])
    assert await w.names("v/d") == []
    if op == "rename":
        assert await w.read("v/g") == b"x"


@pytest.mark.parametrize("eager", [False, True])
async def test_a_file_created_and_unlinked_where_this_mount_deleted_one_stays_gone(
        make_world, eager):
    # the first file's upload is confirmed late (its event comes after both unlinks): the
    # second file, never uploaded, takes nothing of the first one's delete with it
    w = make_world(wview(ttl=0.0), eager=eager)
    await w.start()
    await w.write("v/f", b"old")
    assert await w.fs.sync_all() == []
    old = dict(w.obj("v", "data/f"))
    top = await w.path("v")
    await w.fs.unlink(top.ino, "f")
    fh, _ = await w.open_write("v/f", os.O_RDWR | os.O_CREAT | os.O_EXCL)
    await w.fs.write(fh, 0, b"new")
    await w.fs.unlink(top.ino, "f")
    w.handler.put("v", "data/f", 3, old["etag"], old["mtime"])
    assert await w.path("v/f") is None and await w.names("v") == []
    await w.close(fh)
    assert await w.fs.sync_all() == []
    assert await w.names("v") == [] and w.obj("v", "data/f") is None


@pytest.mark.parametrize("op", ["unlink", "rename away"])
@pytest.mark.parametrize("second", [b"two", b"one"], ids=["other bytes", "the same bytes"])
async def test_a_name_removed_twice_here_stays_gone_whatever_the_handlers_news_says_meanwhile(
        make_world, op, second):
    # f is written, removed, written again (the same bytes: the same ETag) and removed again
    # by this mount (an eager unlink's DELETE still queued; a rename's DELETE landed). The
    # handler, behind, then reports each state of the key in turn: the first removal, the
    # second upload, and only then the second removal. Neither the news of the older removal
    # nor that of the upload before the last removal may show the name again
    w = make_world(wview(ttl=0.0), eager=True, delete_gather=60.0)
    await w.start()
    top = await w.path("v")

    async def remove(n: int) -> None:
        if op == "unlink":
            await w.fs.unlink(top.ino, "f")
        else:
            await w.fs.rename(top.ino, "f", top.ino, f"g{n}")
    await w.write("v/f", b"one")
    assert await w.fs.sync_all() == []
    await remove(1)
    await w.write("v/f", second)
    assert await w.fs.sync_all() == []                    # (sends the first DELETE first)
    uploaded = dict(w.obj("v", "data/f"))
    await remove(2)
    gone = ["g1", "g2"] if op == "rename away" else []
    w.handler.delete("v", "data/f")                       # the first removal
    assert await w.path("v/f") is None and await w.names("v") == gone
    w.handler.put("v", "data/f", len(second), uploaded["etag"], uploaded["mtime"])  # the upload
    assert await w.path("v/f") is None and await w.names("v") == gone
    assert await w.fs.sync_all() == [] and w.obj("v", "data/f") is None
    w.handler.delete("v", "data/f")                       # the last removal
    assert await w.path("v/f") is None and await w.names("v") == gone
    await w.write("v/f", b"three")                        # written again: shown again
    assert await w.read("v/f") == b"three"


async def test_a_file_renamed_onto_a_changed_one_stays_whatever_the_handlers_news_says_meanwhile(
        make_world):
    # f is uploaded empty, unlinked, uploaded empty again and truncated (dirty, not uploaded
    # yet); then an empty file is renamed onto it. The handler, behind, then reports the first
    # upload (the same ETag as the file now there) and the unlink after it: neither may take
    # the file away
    w = make_world(wview(ttl=0.0), eager=True, delete_gather=60.0)
    await w.start()
    top = await w.path("v")
    await w.write("v/f", b"")
    assert await w.fs.sync_all() == []
    first = dict(w.obj("v", "data/f"))
    await w.fs.unlink(top.ino, "f")
    await w.write("v/f", b"")
    assert await w.fs.sync_all() == []
    await w.fs.setattr((await w.path("v/f")).ino, size=5)   # truncate(2): queued
    fh, _ = await w.open_write("v/src")
    await w.fs.fsync(fh)                                       # uploaded (empty) now
    await w.close(fh)
    await w.fs.rename(top.ino, "src", top.ino, "f")
    w.handler.put("v", "data/f", 0, first["etag"], first["mtime"])   # the first upload
    assert await w.names("v") == ["f"]
    w.handler.delete("v", "data/f")                                  # the unlink
    assert await w.names("v") == ["f"] and await w.read("v/f") == b""
    assert await w.fs.sync_all() == [] and w.obj("v", "data/f")["data"] == b""


async def test_a_read_of_a_version_shorter_than_its_listed_size_shows_its_size(make_world):
    # the listing names the version S3 has with another size than it has (a size this
    # mount took from a local file): the read's ranged GET fails; the mount asks S3 and
    # reads the version as it is
    w = make_world(view("v"))
    await w.start()
    obj = w.store.put("b", "data/f", b"x" * 100)
    w.handler.put("v", "data/f", 150, obj["etag"], obj["mtime"])
    assert await w.read("v/f") == b"x" * 100
    assert (await w.path("v/f")).size == 100


# ------------------------------------------------------------ eager: reopening right after a close

async def test_eager_reopen_after_the_upload_keeps_the_inode_and_closes_cleanly(make_world):
    """truncate(2), an open for appending and its close right after an eager close, whose
    upload finishes meanwhile (the kernel sends the first handle's release late)."""
    w = await eager_world(make_world)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        top = await w.path("v")
        fh, node = await w.fs.create(top.ino, "f", W)
        await w.fs.write(fh, 0, b"x" * 100)
        await w.fs.flush(fh)                          # close(2) returns; release comes later
        fh2, _ = await w.fs.open(node.ino, os.O_WRONLY | os.O_APPEND)
        await w.fs.release(fh)
        await settle(w)                               # its upload finished meanwhile
        await w.fs.flush(fh2)                         # an append of nothing: no error
        await w.fs.release(fh2)
        await settle(w)
        assert w.obj("v", "data/f")["data"] == b"x" * 100
        await w.fs.setattr(node.ino, size=150)        # truncate(2) of the same inode
        fh3, _ = await w.fs.open(node.ino, os.O_WRONLY | os.O_APPEND)
        await w.fs.write(fh3, 150, b"a")
        await w.fs.flush(fh3)
        await w.fs.release(fh3)
        assert await w.fs.sync_all() == []
        assert w.obj("v", "data/f")["data"] == b"x" * 100 + b"\0" * 50 + b"a"
        assert os.listdir(w.cache.journal) == []
        nursery.cancel_scope.cancel()


async def test_eager_uploads_give_way_while_requests_come_and_run_all_once_idle(make_world):
    w = await eager_world(make_world, upload_concurrency=8)
    w.fs.written.upload_idle = 60.0                     # "busy" for the whole test
    uploads = HeldUploads(w)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        for i in range(6):
            await w.write(f"v/f{i}", b"x")
        await trio.sleep(0.01)
        assert uploads.running == w.fs.written.upload_busy == 0   # the writer goes first
        w.fs.written.backlog_files = 6                     # past the backlog bound: all of them
        w.fs.written.kick()
        with trio.fail_after(5):
            while uploads.running < 6:
                await trio.sleep(0.001)
        uploads.gate.set()
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.store.wcalls["upload"] == 6 and os.listdir(w.cache.journal) == []


async def test_held_back_uploads_start_once_the_backlog_passes_its_bytes_while_requests_go_on(make_world):
    w = await eager_world(make_world, upload_concurrency=8)
    w.fs.written.upload_idle = 60.0                     # "busy" for the whole test
    w.fs.written.backlog_bytes = 1000
    uploads = HeldUploads(w)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/f0", b"x" * 600)
        await trio.sleep(0.15)                              # the uploader looked again since
        assert uploads.running == 0                        # under the bound: the writer goes first
        await w.write("v/f1", b"x" * 600)                  # past it: no close wakes the uploader,
        with trio.fail_after(5):                           # it looks again by itself
            while uploads.running < 2:
                await trio.sleep(0.01)
        uploads.gate.set()
        await settle(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/f1")["data"] == b"x" * 600


async def test_a_record_written_again_before_its_background_removal_stays(make_world):
    w = await eager_world(make_world)
    await w.write("v/f", b"x")
    entry = w.cache.get("b", "data/f")
    record = dict(entry.meta)
    w.cache.journal._doomed_kick = trio.Event()          # as while run_removals runs
    w.cache.journal.remove(record)                        # uploaded: its record is doomed ...
    w.cache.journal.write(record)                         # ... dirty again before it went
    w.cache.journal.remove_doomed()
    assert os.listdir(w.cache.journal) == [record["file"] + ".json"]


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("what", ["file", "directory"])
async def test_a_file_opened_for_writing_while_its_rename_deletes_the_old_key_keeps_its_bytes(
        make_world, eager, what):
    # the copy is made, the old key's DELETE is under way, and another process opens the
    # file (O_RDWR: nothing fetched, its missing bytes come from the key it opened): the
    # open waits for the rename, so its copy is based on the new key, never on the deleted one
    w = make_world(wview(), eager=eager)
    w.add("v", "data/d/a", b"0123456789" * 1000)
    await w.start()
    top, a = await w.path("v"), await w.path("v/d/a")
    deleting, go = held(w.store, "delete")
    async with trio.open_nursery() as uploads:
        await uploads.start(w.fs.run_uploads)
        async with trio.open_nursery() as nursery:
            if what == "file":
                d = await w.path("v/d")
                nursery.start_soon(w.fs.rename, d.ino, "a", d.ino, "b")
            else:
                nursery.start_soon(w.fs.rename, top.ino, "d", top.ino, "e")
            await deleting.wait()

            async def open_and_write():
                fh, _ = await w.fs.open(a.ino, os.O_RDWR)
                await w.fs.write(fh, 0, b"X")
                await w.close(fh)
            nursery.start_soon(open_and_write)
            await trio.testing.wait_all_tasks_blocked()
            go.set()
        await settle(w)
        uploads.cancel_scope.cancel()
    new = "data/d/b" if what == "file" else "data/e/a"
    assert a.key == new
    assert w.obj("v", new)["data"] == b"X" + (b"0123456789" * 1000)[1:]
    assert w.obj("v", "data/d/a") is None


@pytest.mark.parametrize("op", ["rename", "unlink", "rename onto"])
async def test_a_file_opened_while_this_mount_moves_replaces_or_removes_it_is_read_whole_or_looked_up_again(
        make_world, op):
    # the operation fetched the bytes of the readers it found, then deletes (or copies over)
    # the key; a reader that opens meanwhile waits for it: a renamed file is read at its
    # new key, a removed or replaced one is looked up again (ESTALE: the kernel opens what
    # the name holds then) — never EIO for bytes deleted under it
    w = make_world(wview())
    w.add("v", "data/a", b"0123456789" * 1000)
    if op == "rename onto":
        w.add("v", "data/b", b"b" * 7000)
    await w.start()
    top, a = await w.path("v"), await w.path("v/a")
    opened = await w.path("v/b") if op == "rename onto" else a
    started, go = held(w.store, "copy" if op == "rename onto" else "delete")
    done, outcome = trio.Event(), {}

    async def operation():
        if op == "unlink":
            await w.fs.unlink(top.ino, "a")
        else:
            await w.fs.rename(top.ino, "a", top.ino, "b")
        done.set()

    async def open_then_read():
        try:
            fh, _ = await w.fs.open(opened.ino, os.O_RDONLY)
        except FsError as exc:
            outcome["open"] = exc.errno
            return
        await done.wait()                           # its first read after the operation
        try:
            outcome["read"] = await w.fs.read(fh, 0, 1 << 20)
        except FsError as exc:
            outcome["read"] = exc.errno
        finally:
            await w.fs.release(fh)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(operation)
        await started.wait()
        nursery.start_soon(open_then_read)
        await trio.testing.wait_all_tasks_blocked()
        go.set()
    if op == "rename":
        assert outcome == {"read": b"0123456789" * 1000} and a.key == "data/b"
    else:
        assert outcome == {"open": errno.ESTALE}
        assert await w.path("v/a") is None
    if op == "rename onto":
        assert await w.read("v/b") == b"0123456789" * 1000


@pytest.mark.parametrize("eager", [False, True])
async def test_a_file_removed_while_its_open_asks_s3_is_read_whole_or_looked_up_again(
        make_world, mock_clock, eager):
    # the open asks S3 whether the cached version is current (past the ttl); the unlink
    # runs meanwhile and finds no handle to fetch bytes for: that open must not get a
    # handle of a file whose object is deleted (EIO at its first read)
    w = make_world(wview(ttl=1), eager=eager)
    w.add("v", "data/a", b"0123456789" * 1000)
    await w.start()
    top = await w.path("v")
    assert await w.read("v/a") == b"0123456789" * 1000
    a = await w.path("v/a")
    mock_clock.jump(2)
    outcome = {}

    async def open_then_read():
        try:
            fh, _ = await w.fs.open(a.ino, os.O_RDONLY)
        except FsError as exc:
            outcome["open"] = exc.errno
            return
        try:
            outcome["read"] = await w.fs.read(fh, 0, 1 << 20)
        except FsError as exc:
            outcome["read"] = exc.errno
        finally:
            await w.fs.release(fh)

    asked, answer = held(w.store, "get_if_changed")  # the open's revalidation
    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_then_read)
        await asked.wait()
        await w.fs.unlink(top.ino, "a")
        await w.fs.deletes.send_all()
        assert w.obj("v", "data/a") is None
        answer.set()
    assert outcome in ({"open": errno.ESTALE}, {"read": b"0123456789" * 1000})


async def _new_file_read_then_removed(w):
    """A file S3 never had (still written) opened for reading, then unlinked before that
    descriptor's first read: (writing fh, node, reading fh)."""
    await w.start()
    top = await w.path("v")
    fh, node = await w.fs.create(top.ino, "a", os.O_WRONLY | os.O_CREAT)
    await w.fs.write(fh, 0, b"only here " * 100)
    reader, _ = await w.fs.open(node.ino, os.O_RDONLY)
    await w.fs.unlink(top.ino, "a")
    return fh, node, reader


@pytest.mark.parametrize("eager", [False, True])
async def test_a_descriptor_opened_before_a_new_file_is_removed_reads_it_after(make_world, eager):
    # a file S3 never had (still written, or closed and not uploaded yet in eager mode) is
    # opened for reading and removed before that descriptor's first read: its bytes are
    # then only in the local copy, which the descriptor must take at the removal
    w = make_world(wview(), eager=eager)
    fh, node, reader = await _new_file_read_then_removed(w)
    assert node.gone and w.obj("v", "data/a") is None
    assert await w.fs.read(reader, 0, 1 << 20) == b"only here " * 100
    await w.fs.release(reader)
    await w.close(fh)
    assert w.obj("v", "data/a") is None and await w.path("v/a") is None


@pytest.mark.parametrize("eager", [False, True])
async def test_a_removed_file_opened_beside_a_descriptor_that_closes_before_its_first_read(
        make_world, eager):
    # after the removal the file lives only in what a descriptor holds; a second open of the
    # inode (its lookup came before the removal) shares that; the first one closes before
    # the second one's first read: the second must still read the file
    w = make_world(wview(), eager=eager)
    fh, node, first = await _new_file_read_then_removed(w)
    second, _ = await w.fs.open(node.ino, os.O_RDONLY)
    await w.fs.release(first)
    assert await w.fs.read(second, 0, 1 << 20) == b"only here " * 100
    await w.fs.release(second)
    await w.close(fh)


async def test_a_new_file_renamed_away_keeps_the_unlink_of_the_name_before_it(make_world, mock_clock):
    # eager: f is unlinked (its DELETE queued, the object still in S3 and listed), a new f
    # is created and renamed away before its upload: the name must stay empty, also after
    # the next refresh lists the old object (the rename must not drop the unlink's mark)
    w = make_world(wview(ttl=1), eager=True)
    w.add("v", "data/f", b"old")
    await w.start()
    top = await w.path("v")
    fh, _ = await w.open_write("v/f", os.O_RDWR)    # written and fsync'd while open
    await w.fs.write(fh, 0, b"O")
    await w.fs.fsync(fh)
    w.sync_handler("v", "data/f")
    await w.fs.unlink(top.ino, "f")
    await w.write("v/f", b"new file")
    await w.fs.rename(top.ino, "f", top.ino, "g")
    assert await w.names("v") == ["g"]
    mock_clock.jump(2)                             # a refresh: the handler still lists data/f
    assert await w.names("v") == ["g"]
    await w.close(fh)


@pytest.mark.parametrize("op", ["rename onto", "unlink"])
async def test_a_create_while_the_names_file_is_replaced_or_removed_opens_what_the_name_holds_then(
        make_world, op):
    # open(O_CREAT|O_TRUNC) of a name whose file another process is replacing or removing:
    # the create waits for that operation and opens (or creates) the name's file after it,
    # never ESTALE (the kernel retries that once; a busy name could return it to the caller)
    w = make_world(wview())
    w.add("v", "data/a", b"a" * 5000)
    w.add("v", "data/b", b"b" * 7000)
    await w.start()
    top = await w.path("v")
    await w.path("v/b")
    started, go = held(w.store, "copy" if op == "rename onto" else "delete")
    async with trio.open_nursery() as nursery:
        if op == "rename onto":
            nursery.start_soon(w.fs.rename, top.ino, "a", top.ino, "b")
        else:
            nursery.start_soon(w.fs.unlink, top.ino, "b")
        await started.wait()
        created = {}

        async def create():
            created["fh"], created["node"] = await w.fs.create(top.ino, "b", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        nursery.start_soon(create)
        await trio.testing.wait_all_tasks_blocked()
        go.set()
    await w.fs.write(created["fh"], 0, b"created")
    await w.close(created["fh"])
    assert w.obj("v", "data/b")["data"] == b"created" and not created["node"].gone
