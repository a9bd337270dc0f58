"""A view's write policy (``write: {eager: [globs]}`` in the views file) in a default
(close-to-open) mount: the files it names are written back eagerly — their close returns
once journaled, the upload follows in the background after the write-back delay, their
unlinks are batched — while every other file keeps close-to-open; ``delvefs sync`` waits
for both. Against the fakes, on trio's MockClock (no wait here is a sleep of real time)."""
from __future__ import annotations

import dataclasses

import pytest
import trio
import trio.testing

from .conftest import view

pytestmark = pytest.mark.trio

BOOKKEEPING = (".snakemake/*", "*.log")


def workflow_view(**kw):
    """View ``v`` of data/*, writable, whose workflow bookkeeping is written eagerly."""
    return dataclasses.replace(view("v", writable=True, **kw), eager_writes=BOOKKEEPING)


def uploaded_keys(w) -> list[str]:
    return sorted(u["key"] for u in w.store.uploaded)


async def state(w, path: str) -> bytes:
    return await w.fs.getxattr((await w.path(path)).ino, "user.delvefs.upload")


async def test_a_named_files_close_does_not_upload_another_ones_does_and_sync_waits_for_both(
        make_world):
    w = await make_world(workflow_view()).start()
    assert not w.fs.settings.eager                       # a default mount
    await w.fs.mkdir((await w.path("v")).ino, ".snakemake")
    await w.write("v/.snakemake/metadata-1", b'{"job": 1}')
    await w.write("v/run.log", b"job 1 done\n")
    assert w.store.uploaded == []                         # closed, journaled, not uploaded
    assert await state(w, "v/.snakemake/metadata-1") == b"waiting"
    assert await w.read("v/.snakemake/metadata-1") == b'{"job": 1}'   # here at once
    await w.write("v/out.txt", b"the job's output")
    assert uploaded_keys(w) == ["data/out.txt"]           # its close uploaded it
    assert await w.fs.sync_all() == []                    # the rest now, waited for
    assert uploaded_keys(w) == ["data/.snakemake/metadata-1", "data/out.txt", "data/run.log"]
    assert w.obj("v", "data/.snakemake/metadata-1")["data"] == b'{"job": 1}'
    assert w.fs.upload_report() == []


async def test_a_named_file_is_uploaded_in_the_background_after_its_write_back_delay(
        make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = await make_world(workflow_view()).start()
    delay = w.fs.written.write_back
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/step.log", b"started\n")
        closed = trio.current_time()
        with trio.fail_after(10 * delay):
            while not w.store.uploaded:
                await trio.sleep(0.01)
        assert trio.current_time() - closed >= delay      # it waited out the delay first
        nursery.cancel_scope.cancel()
    assert uploaded_keys(w) == ["data/step.log"]


async def test_a_named_marker_created_and_removed_within_the_delay_costs_no_request(
        make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = make_world(workflow_view())
    w.add("v", "data/.snakemake/incomplete/old", b"")      # a marker S3 has (an earlier run)
    await w.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/.snakemake/incomplete/job-1", b"")
        markers = await w.path("v/.snakemake/incomplete")
        await w.fs.unlink(markers.ino, "job-1")           # within the delay: never uploaded
        await w.fs.unlink(markers.ino, "old")             # S3 had it: its DELETE is queued
        assert w.store.wcalls["delete"] == 0 and w.store.delete_batches == 0
        assert await w.fs.sync_all() == []
        nursery.cancel_scope.cancel()
    assert w.store.uploaded == [] and w.store.wcalls["delete"] == 0
    assert w.store.delete_batches == 1 and w.obj("v", "data/.snakemake/incomplete/old") is None


async def test_the_other_files_keep_close_to_open_for_closes_unlinks_and_truncates(make_world):
    w = make_world(workflow_view())
    w.add("v", "data/old.txt", b"in S3")
    w.add("v", "data/cut.txt", b"0123456789")
    await w.start()
    await w.fs.unlink((await w.path("v")).ino, "old.txt")
    assert w.store.wcalls["delete"] == 1                  # sent before unlink returned
    await w.fs.setattr((await w.path("v/cut.txt")).ino, size=4)
    assert w.obj("v", "data/cut.txt")["data"] == b"0123"  # truncate(2) uploaded at once


async def test_fsync_of_a_named_file_uploads_it(make_world):
    w = await make_world(workflow_view()).start()
    fh, _ = await w.open_write("v/run.log")
    await w.fs.write(fh, 0, b"line\n")
    await w.fs.fsync(fh)
    assert uploaded_keys(w) == ["data/run.log"]
    await w.close(fh)


async def test_an_eager_mount_writes_every_file_eagerly_whatever_its_view_names(make_world):
    w = await make_world(workflow_view(), eager=True).start()
    await w.write("v/out.txt", b"output")
    assert w.store.uploaded == []
    assert await w.fs.sync_all() == [] and uploaded_keys(w) == ["data/out.txt"]
