"""A write into a file that the cache disk refused (ENOSPC, EFBIG, ...): the file is partial
from then on, so it is never uploaded as if whole — every close and fsync of it answers the
write's errno, its last close drops its local changes (the name shows what S3 has), and
neither the uploader nor the journal of a killed mount brings it back. Both modes."""
from __future__ import annotations

import errno
import json
import os

import pytest

from delvefs.client.mount.errors import FsError, StoreError

from .conftest import view

pytestmark = pytest.mark.trio

W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
MODES = pytest.mark.parametrize("eager", [False, True], ids=["strict", "eager"])


def wview():
    return view("v", writable=True)


async def errno_of(coro) -> int:
    with pytest.raises(FsError) as e:
        await coro
    return e.value.errno


def disk_full_for(monkeypatch, w, fh, err=errno.ENOSPC) -> None:
    """From now on the cache disk refuses every byte written through handle ``fh``."""
    fd, real = w.fs.handles.files[fh].fd, os.pwrite

    def pwrite(to, data, offset):
        if to == fd:
            raise OSError(err, os.strerror(err))
        return real(to, data, offset)
    monkeypatch.setattr(os, "pwrite", pwrite)


async def half_written(w, monkeypatch, path="v/f", flags=W):
    """``path`` opened, its first half written, the second refused (ENOSPC): the handle."""
    fh, _ = await w.open_write(path, flags)
    await w.fs.write(fh, 0, b"first half")
    disk_full_for(monkeypatch, w, fh)
    assert await errno_of(w.fs.write(fh, 10, b" second half")) == errno.ENOSPC
    return fh


@MODES
async def test_a_new_file_whose_write_failed_fails_every_close_and_is_never_uploaded(
        make_world, monkeypatch, eager):
    w = await make_world(wview(), eager=eager).start()
    fh = await half_written(w, monkeypatch)
    assert await errno_of(w.fs.fsync(fh)) == errno.ENOSPC
    other, _ = await w.open_write("v/f", os.O_WRONLY)  # not the last writer: fails too
    assert await errno_of(w.fs.flush(other)) == errno.ENOSPC
    await w.fs.release(other)
    assert await w.names("v") == ["f"]                  # still written through fh
    assert await errno_of(w.fs.flush(fh)) == errno.ENOSPC
    assert await errno_of(w.fs.flush(fh)) == errno.ENOSPC  # (a dup'ed descriptor's close)
    await w.fs.release(fh)
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f") is None and w.store.wcalls["upload"] == 0
    assert await w.names("v") == [] and w.cache.get("b", "data/f") is None
    assert os.listdir(w.cache.journal) == []
    assert (w.fs.written.failed_writes, w.fs.written.dropped_files) == (1, 1)
    monkeypatch.undo()
    await w.write("v/f", b"whole")                      # a new file of that name: uploaded
    if eager:
        assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f")["data"] == b"whole"


@MODES
async def test_an_overwrite_whose_write_failed_leaves_the_old_object_shown(
        make_world, monkeypatch, eager):
    w = make_world(wview(), eager=eager)
    old = w.add("v", "data/f", b"the old content")
    await w.start()
    fh = await half_written(w, monkeypatch)
    assert (await w.path("v/f")).size == 10             # the local copy, while written
    assert await errno_of(w.close(fh)) == errno.ENOSPC
    monkeypatch.undo()
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f")["etag"] == old["etag"] and w.store.wcalls["upload"] == 0
    node = await w.path("v/f")
    assert (node.size, node.etag) == (len(b"the old content"), old["etag"])
    assert await w.read("v/f") == b"the old content"
    assert os.listdir(w.cache.journal) == []


@MODES
async def test_a_write_in_place_that_failed_leaves_the_old_object_shown(
        make_world, monkeypatch, eager):
    w = make_world(wview(), eager=eager)
    old = w.add("v", "data/f", b"0123456789abcdef")
    await w.start()
    fh = await half_written(w, monkeypatch, flags=os.O_WRONLY)   # no O_TRUNC: a sparse copy
    assert await errno_of(w.close(fh)) == errno.ENOSPC
    monkeypatch.undo()
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f")["etag"] == old["etag"] and w.store.wcalls["upload"] == 0
    assert await w.read("v/f") == b"0123456789abcdef"


@MODES
async def test_a_killed_mount_does_not_upload_a_file_whose_write_failed(
        make_world, monkeypatch, eager):
    w = await make_world(wview(), eager=eager).start()
    await half_written(w, monkeypatch)                  # no close: the mount is killed
    [record] = [json.loads((w.cache.journal.dir / n).read_text()) for n in os.listdir(w.cache.journal)]
    assert record["key"] == "data/f" and record["write_error"] == "ENOSPC"
    monkeypatch.undo()
    w2 = w.restart()
    await w2.start()
    w2.fs.recover()
    assert await w2.fs.sync_all() == []
    assert w2.obj("v", "data/f") is None and w2.store.wcalls["upload"] == 0
    assert await w2.names("v") == [] and os.listdir(w2.cache.journal) == []
    assert not [n for n in os.listdir(w2.cache.dir) if n.startswith("w-")]
    assert w2.fs.written.dropped_files == 1


async def test_a_record_the_full_disk_cannot_rewrite_is_removed(make_world, monkeypatch):
    w = await make_world(wview()).start()
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"first half")
    disk_full_for(monkeypatch, w, fh)

    def refused(*a, **kw):
        raise StoreError(errno.ENOSPC, "journal: no room")
    monkeypatch.setattr(w.cache.journal, "write", refused)
    assert await errno_of(w.fs.write(fh, 10, b" second half")) == errno.ENOSPC
    assert os.listdir(w.cache.journal) == []            # no record: nothing to replay
    monkeypatch.undo()
    w2 = w.restart()
    await w2.start()
    w2.fs.recover()
    assert await w2.fs.sync_all() == [] and w2.obj("v", "data/f") is None


@MODES
async def test_an_o_trunc_open_of_a_file_whose_write_failed_starts_a_new_file(
        make_world, monkeypatch, eager):
    w = await make_world(wview(), eager=eager).start()
    fh = await half_written(w, monkeypatch)
    monkeypatch.undo()
    await w.write("v/f", b"fresh")                      # O_TRUNC while fh still writes
    await w.close(fh)                                   # its failure went with the old content
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f")["data"] == b"fresh"


@MODES
async def test_a_failed_truncate_fails_the_close_and_nothing_is_uploaded(
        make_world, monkeypatch, eager):
    w = await make_world(wview(), eager=eager).start()
    fh, node = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"header")

    def too_big(path, size):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    monkeypatch.setattr(os, "truncate", too_big)
    assert await errno_of(w.fs.setattr(node.ino, size=1 << 40, fh=fh)) == errno.EFBIG
    monkeypatch.undo()
    assert await errno_of(w.close(fh)) == errno.EFBIG
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f") is None and await w.names("v") == []


async def test_an_eager_file_waiting_for_its_upload_is_not_uploaded_once_a_write_failed(
        make_world, monkeypatch):
    w = await make_world(wview(), eager=True, write_back=60.0).start()
    await w.write("v/f", b"closed once")                # waits out its write-back delay
    assert w.fs.written.queued()
    fh = await half_written(w, monkeypatch, flags=os.O_WRONLY)
    assert not w.fs.written.queued()
    assert await errno_of(w.close(fh)) == errno.ENOSPC
    monkeypatch.undo()
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/f") is None and w.store.wcalls["upload"] == 0
    assert await w.names("v") == []
