"""Eager mode's write-back delay (``write_back``, ``-o write_back=SECONDS``): a closed file
is uploaded once it was left unchanged that long, so a file removed before costs no
request; sync, fsync, unmount and the backlog bounds upload sooner. Against the fakes, on
trio's MockClock: time moves only when a test moves it (or, with autojump, when every task
waits), so every wait here is a condition, never a sleep of real time."""
from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from delvefs.cli import build_parser
from delvefs.client.mount.options import OptionError
from delvefs.client.mount.settings import MountSettings
from delvefs.client.commands.status import format_mount
from delvefs.client.mount.report import upload_counts

from .conftest import view

pytestmark = pytest.mark.trio

W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
DELAY = MountSettings.defaults().write_back  # the default this file tests


def wview(name="v", **kw):
    kw.setdefault("writable", True)
    return view(name, **kw)


async def eager_world(make_world, *views, **settings):
    return await make_world(*(views or (wview(),)), eager=True, **settings).start()


def queued(w) -> bool:
    return bool(w.fs.written._pending or w.fs.written._waiting or w.fs.written._uploading)


async def until(condition, bound: float = 600):
    """Until ``condition()`` holds, at most ``bound`` seconds of the (mock) clock."""
    with trio.fail_after(bound):
        while not condition():
            await trio.sleep(0.01)


async def jump(mock_clock, seconds: float) -> None:
    """Move the (manual) clock on and let every task run until it waits again (the fake
    store answers without threads: an upload started is done then)."""
    mock_clock.jump(seconds)
    await trio.testing.wait_all_tasks_blocked()


async def settled(w) -> None:
    """Until nothing is queued, uploading or left to delete, and the journal's removals ran."""
    await until(lambda: not queued(w) and not w.fs.deletes
                and not w.cache.journal.removals_pending())


def uploaded_keys(w) -> list[str]:
    return sorted(u["key"] for u in w.store.uploaded)


async def state(w, path: str) -> bytes:
    return await w.fs.getxattr((await w.path(path)).ino, "user.delvefs.upload")


# ------------------------------------------------------------ what waits costs nothing

@pytest.mark.parametrize("marker", [b"", b"running"])
async def test_files_closed_and_unlinked_within_the_delay_cost_no_upload_and_no_delete(
        make_world, mock_clock, marker):
    """A workflow engine's job: a marker created, the job runs (no request comes: the
    mount is idle), the job writes its metadata and removes the marker."""
    mock_clock.autojump_threshold = 0
    w = await eager_world(make_world)
    assert w.fs.written.write_back == DELAY > 0
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        top = await w.path("v")
        started = trio.current_time()
        for job in range(50):
            await w.write(f"v/incomplete-{job}", marker)
        await trio.sleep(DELAY / 2)                      # the jobs run: the mount is idle
        for job in range(50):
            await w.write(f"v/meta-{job}", b'{"job": %d}' % job)
            await w.fs.unlink(top.ino, f"incomplete-{job}")
        assert trio.current_time() - started < DELAY      # (all of it within the delay)
        assert w.store.uploaded == []                     # nothing went while it waited
        await settled(w)                                  # the metadata's delay passes
        nursery.cancel_scope.cancel()
    assert uploaded_keys(w) == sorted(f"data/meta-{job}" for job in range(50))
    assert w.store.wcalls["delete"] == 0 and w.store.delete_batches == 0   # S3 never had them
    assert w.fs.upload_report() == [] and os.listdir(w.cache.journal) == []
    assert sorted(await w.names("v")) == sorted(f"meta-{job}" for job in range(50))


async def test_a_file_s3_had_and_unlinked_within_the_delay_is_deleted_never_uploaded(
        make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = make_world(wview(), eager=True)
    w.add("v", "data/old", b"in S3")
    await w.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/old", b"rewritten")              # waits out its delay ...
        top = await w.path("v")
        await w.fs.unlink(top.ino, "old")                 # ... and is removed first
        await settled(w)
        nursery.cancel_scope.cancel()
    assert w.store.uploaded == [] and w.obj("v", "data/old") is None
    assert w.store.delete_batches == 1                    # the object S3 had: one DELETE


async def test_a_file_left_alone_waits_then_is_uploaded_once_its_delay_is_over(
        make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = await eager_world(make_world)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        closed = trio.current_time()
        await w.write("v/f", b"left alone")
        assert await state(w, "v/f") == b"waiting"
        [r] = w.fs.upload_report()
        assert r["state"] == "waiting" and r["path"] == "v/f"
        counts = upload_counts(w.fs.upload_report())
        assert counts["waiting"] == 1 and counts["pending"] == counts["failed"] == 0
        await until(lambda: w.obj("v", "data/f") is not None)
        assert trio.current_time() - closed >= DELAY       # not before its delay (mock clock)
        await settled(w)
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/f")["data"] == b"left alone" and w.store.wcalls["upload"] == 1
    assert w.fs.upload_report() == []


async def test_delvefs_status_counts_waiting_files_apart():
    status = {"mountpoint": "/m", "pid": 1, "handler": "h", "views": [], "files": [
        {"path": "v/a", "state": "waiting", "size": 1, "error": None},
        {"path": "v/b", "state": "failed", "size": 1, "error": "down"}],
        "counts": upload_counts([{"state": "waiting"}, {"state": "failed"}]),
        "cache": {"bytes": 0, "limit": None, "entries": 0, "dirty_bytes": 2}, "cache_dir": "/c"}
    text = format_mount(status)
    assert "files not in S3 yet: 1 waiting, 0 pending, 0 uploading, 1 failed, 0 conflict" in text


async def test_a_file_changed_again_starts_its_wait_again(make_world, mock_clock):
    w = await eager_world(make_world)                      # the clock moves by jumps only
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/f", b"one")
        await jump(mock_clock, DELAY * 0.75)
        await w.write("v/f", b"two", os.O_WRONLY | os.O_TRUNC)   # written and closed again
        await jump(mock_clock, DELAY * 0.75)              # the first close's delay is over
        assert w.store.uploaded == [] and await state(w, "v/f") == b"waiting"
        f = await w.path("v/f")
        await w.fs.setattr(f.ino, size=2)                 # truncate(2): a change too
        await jump(mock_clock, DELAY * 0.75)              # the second close's delay is over
        assert w.store.uploaded == []
        await jump(mock_clock, DELAY * 0.5)               # the truncate's is over
        assert w.obj("v", "data/f") is not None
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/f")["data"] == b"tw" and w.store.wcalls["upload"] == 1


# ------------------------------------------------------------ what does not wait

async def test_sync_fsync_and_unmount_upload_at_once(make_world, mock_clock):
    w = await eager_world(make_world)                      # the clock does not move here
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        start = trio.current_time()
        await w.write("v/by-sync", b"s")
        assert await w.fs.sync_all() == []                # delvefs sync
        assert w.obj("v", "data/by-sync")["data"] == b"s"
        await w.write("v/by-fsync", b"f")
        fh, _ = await w.open_write("v/by-fsync", os.O_WRONLY)
        await w.fs.fsync(fh)                              # fsync(2) of the closed file
        assert w.obj("v", "data/by-fsync")["data"] == b"f"
        await w.close(fh)
        await w.write("v/by-unmount", b"u")
        assert await w.fs.shutdown() == ([], [])          # unmount
        assert w.obj("v", "data/by-unmount")["data"] == b"u"
        assert trio.current_time() == start
        nursery.cancel_scope.cancel()


async def test_hurry_ends_the_wait_of_a_closed_file(make_world, mock_clock):
    w = await eager_world(make_world)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/f", b"soon")
        await jump(mock_clock, w.fs.written.upload_idle)  # the mount is idle; f waits
        assert w.obj("v", "data/f") is None
        w.fs.written.hurry(w.cache.get("b", "data/f"))
        await trio.testing.wait_all_tasks_blocked()
        assert w.obj("v", "data/f")["data"] == b"soon"
        nursery.cancel_scope.cancel()


async def test_an_fsync_that_keeps_the_file_local_ends_its_wait_also_at_the_close(
        make_world, mock_clock):
    w = await eager_world(make_world, fsync="journal")     # fsync: durable on the local disk
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, _ = await w.open_write("v/f")
        await w.fs.write(fh, 0, b"fsynced")
        await w.fs.fsync(fh)
        await w.close(fh)                                 # not written since: no wait
        assert await state(w, "v/f") == b"pending"
        await jump(mock_clock, w.fs.written.upload_idle)
        assert w.obj("v", "data/f")["data"] == b"fsynced"
        fh, _ = await w.open_write("v/g")
        await w.fs.write(fh, 0, b"fsynced")
        await w.fs.fsync(fh)
        await w.fs.write(fh, 7, b", then written")        # written after it: waits again
        await w.close(fh)
        assert await state(w, "v/g") == b"waiting"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("bound", ["files", "bytes"])
async def test_past_a_backlog_bound_waiting_files_go_without_their_delay(make_world, mock_clock,
                                                                        bound):
    w = await eager_world(make_world)                      # the clock moves by jumps only
    if bound == "files":
        w.fs.written.backlog_files = 5
    else:
        w.fs.written.backlog_bytes = 5000
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        for i in range(4):
            await w.write(f"v/f{i}", b"x" * 1000)
        await jump(mock_clock, w.fs.written.upload_idle)  # the mount is idle: under the
        assert w.store.uploaded == []                     # bound, they wait
        await w.write("v/f4", b"x" * 1000)                # the bound passed: all go now
        await trio.testing.wait_all_tasks_blocked()
        assert len(w.store.uploaded) == 5
        nursery.cancel_scope.cancel()
    assert uploaded_keys(w) == [f"data/f{i}" for i in range(5)]


async def test_the_byte_bound_counts_what_a_big_file_holds_not_its_holes(make_world, mock_clock):
    # fio lays a file out (its size set, nothing written) and closes it before it writes it
    # through a second open: closed with a size far past the bound, it holds no block yet
    from delvefs.client.mount.fs.written import SPARSE_FROM
    w = await eager_world(make_world)                      # the clock moves by jumps only
    w.fs.written.backlog_bytes = SPARSE_FROM
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, node = await w.open_write("v/laid-out")
        await w.fs.setattr(node.ino, size=4 * SPARSE_FROM, fh=fh)   # ftruncate: a hole
        await w.close(fh)
        await jump(mock_clock, w.fs.written.upload_idle)
        assert await state(w, "v/laid-out") == b"waiting"  # under the bound: it waits
        await w.write("v/written", b"x" * SPARSE_FROM)     # bytes past the bound: all go
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(u["key"] for u in w.store.uploaded) == ["data/laid-out", "data/written"]
        nursery.cancel_scope.cancel()


async def test_write_back_0_uploads_once_the_mount_is_idle(make_world, mock_clock):
    w = await eager_world(make_world, write_back=0)        # the clock moves by jumps only
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        await w.write("v/f", b"at once")
        assert await state(w, "v/f") == b"pending"
        await jump(mock_clock, w.fs.written.upload_idle)  # once the mount is idle
        assert w.obj("v", "data/f")["data"] == b"at once"
        nursery.cancel_scope.cancel()


async def test_recovered_files_and_retries_do_not_wait(make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = await eager_world(make_world)
    await w.write("v/f", b"from the last mount")          # closed; that mount was killed
    w2 = w.restart()
    await w2.start()
    w2.fs.recover()
    assert await state(w2, "v/f") == b"pending"
    async with trio.open_nursery() as nursery:
        await nursery.start(w2.fs.run_uploads)
        start = trio.current_time()
        await until(lambda: w2.obj("v", "data/f") is not None)
        assert trio.current_time() - start < DELAY
        nursery.cancel_scope.cancel()


async def test_the_option_and_its_flag():
    def parse(*argv):
        return MountSettings.from_args(build_parser().parse_args(["mount", "v.yaml", "/mnt", *argv]), {})
    assert parse().write_back == DELAY
    assert parse("-o", "eager,write_back=0.5").write_back == 0.5
    assert parse("--write-back", "0").write_back == 0.0
    assert parse(*parse("-o", "write_back=0").daemon_flags()).write_back == 0.0  # the daemon's
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(OptionError, match="write_back"):
            parse("-o", f"write_back={bad}")
    assert MountSettings.defaults(eager=False).write_back == DELAY   # (strict mode ignores it)


async def test_a_file_that_keeps_changing_is_not_held_past_the_backlog_age(make_world, mock_clock):
    w = await eager_world(make_world)
    await w.write("v/progress", b"1")
    assert await state(w, "v/progress") == b"waiting"
    entry = w.cache.get("b", "data/progress")
    entry.meta["since"] -= w.fs.written.backlog_age   # dirty that long, closed every second
    await w.write("v/progress", b"2", os.O_WRONLY | os.O_TRUNC)
    assert await state(w, "v/progress") == b"pending"  # goes as soon as the mount is idle
