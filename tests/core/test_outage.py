"""Handler outages against the core: a listed view is served its last listing (stale) and
catches up when the handler answers again; a view never listed fails; a handler that lost
its state gets the views registered again; a first listing waits for the bucket's scan.
Virtual time (MockClock, autojump): waits are measured, never slept."""
from __future__ import annotations

import errno
import logging

import pytest
import trio

from delvefs.client.mount.errors import FsError

from .conftest import view

pytestmark = pytest.mark.trio

TTL = 2.0


@pytest.fixture
def clock(mock_clock):
    mock_clock.autojump_threshold = 0
    return mock_clock


@pytest.fixture
def views_log(caplog):
    caplog.set_level(logging.INFO, "delvefs.client.mount.fs.listings")

    def lines(text: str) -> list[str]:
        return [r.message for r in caplog.records if text in r.message]
    return lines


async def listed_world(make_world, *keys, **kw):
    w = make_world(view("v", ttl=TTL), **kw)
    for key in keys:
        w.add("v", f"data/{key}", key.encode())
    await w.start()
    assert sorted(await w.names("v")) == sorted(keys)
    return w


async def stale_xattr(w) -> str:
    top = await w.path("v")
    return (await w.fs.getxattr(top.ino, "user.delvefs.stale")).decode()


class InFlight:
    """Counts the handler requests under way at once (the most seen: ``peak``)."""

    def __init__(self, handler):
        self.now = self.peak = 0
        for name in ("list_page", "changes"):
            setattr(handler, name, self._counted(getattr(handler, name)))

    def _counted(self, fn):
        async def counted(*args, **kw):
            self.now += 1
            self.peak = max(self.peak, self.now)
            try:
                return await fn(*args, **kw)
            finally:
                self.now -= 1
        return counted


async def timed(coro):
    start = trio.current_time()
    result = await coro
    return trio.current_time() - start, result


async def test_an_unreachable_handler_serves_the_last_listing_then_catches_up_by_delta(
        make_world, clock, views_log):
    w = await listed_world(make_world, "a")
    top = await w.path("v")
    assert await w.fs.listxattr(top.ino) == ["user.delvefs.view", "user.delvefs.stale"]
    assert await stale_xattr(w) == "0"
    w.handler.fail = True
    w.add("v", "data/b", b"b")       # written through S3 during the outage
    clock.jump(TTL + 0.5)
    elapsed, names = await timed(w.names("v"))
    assert names == ["a"] and elapsed == 0   # a refused connection: no wait at all
    assert await w.read("v/a") == b"a"       # cached or S3-reachable data reads
    state = await stale_xattr(w)
    assert state.startswith("1 since ") and "fake handler down" in state
    calls = dict(w.handler.calls)
    for _ in range(5):               # within the backoff: no request, no wait
        assert await w.names("v") == ["a"]
    assert w.handler.calls == calls
    assert len(views_log("is stale")) == 1
    w.handler.fail = False
    clock.jump(10)                   # past the backoff: the next operation refreshes
    assert await w.names("v") == ["a", "b"]
    assert w.handler.calls["list"] == calls["list"]  # a delta, not a new listing
    assert await stale_xattr(w) == "0"
    assert len(views_log("is stale")) == 1 and len(views_log("is fresh again")) == 1


async def test_a_hanging_handler_delays_one_operation_by_stale_after_then_none(
        make_world, clock, views_log):
    w = await listed_world(make_world, "a")
    inflight = InFlight(w.handler)
    w.handler.hang = True
    w.add("v", "data/b", b"b")
    clock.jump(TTL + 0.5)
    elapsed, names = await timed(w.names("v"))
    assert names == ["a"] and elapsed == pytest.approx(w.settings.stale_after)
    assert "a refresh has taken more than 2 s" in await stale_xattr(w)
    waits = []
    for _ in range(40):              # a minute of operations while the handler hangs
        elapsed, names = await timed(w.names("v"))
        waits.append(elapsed)
        assert names == ["a"]
        await trio.sleep(1.5)
    assert max(waits) <= w.settings.stale_after
    assert sum(1 for t in waits if t > 0) <= 3  # one wait per retry, retries backed off
    assert inflight.peak == 1        # never more than one request under way
    assert len(views_log("is stale")) == 1
    w.handler.hang = False           # the request under way (or the next retry) is answered
    await trio.sleep(11)             # (virtual time) past the longest backoff
    assert await w.names("v") == ["a", "b"]
    assert await stale_xattr(w) == "0"
    assert len(views_log("is fresh again")) == 1


async def test_a_view_never_listed_is_eio_after_the_timeout_its_waiters_share(make_world, clock):
    w = make_world()
    w.add("v", "data/a", b"a")
    await w.start()
    top = await w.path("v")
    inflight = InFlight(w.handler)
    w.handler.hang = True
    errors = []

    async def look():
        try:
            await w.fs.lookup(top.ino, "a")
        except FsError as exc:
            errors.append((exc.errno, trio.current_time()))
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(look)
    assert [e for e, _ in errors] == [errno.EIO] * 3
    assert all(t - start == pytest.approx(w.handler.timeout) for _, t in errors)
    assert inflight.peak == 1
    assert (await stale_xattr(w)).startswith("1 since ")
    w.handler.hang = False
    assert (await w.path("v/a")).size == 1
    assert await stale_xattr(w) == "0"


async def test_a_handler_that_lost_its_state_gets_the_views_again_and_a_relisting(
        make_world, clock, views_log):
    registered = []

    async def reregister():             # the mount's hook (new proofs)
        registered.append(trio.current_time())
        await w.fs.register("test", {"b": ["new proof"]})
    w = await listed_world(make_world, "a", "b", reregister=reregister)
    b = await w.path("v/b")
    w.handler.lose_state()
    w.remove("v", "data/b")             # changed in S3 meanwhile
    w.add("v", "data/c", b"c")
    clock.jump(TTL + 0.5)
    assert sorted(await w.names("v")) == ["a", "c"]
    assert len(registered) == 1 and w.handler.calls["register"] == 2
    assert w.fs.views[0].listing.lists == 2 and b.gone
    assert await stale_xattr(w) == "0"
    assert len(views_log("does not know it")) == 1
    clock.jump(TTL + 0.5)               # then deltas again
    w.add("v", "data/d", b"d")
    assert sorted(await w.names("v")) == ["a", "c", "d"] and w.fs.views[0].listing.lists == 2


async def test_a_lost_state_rescanning_keeps_the_last_listing_until_the_scan_is_done(
        make_world, clock, views_log):
    w = await listed_world(make_world, "a", "b")
    w.handler.lose_state()
    w.handler.scanning = True
    w.handler.scan_listed = 12345
    w.remove("v", "data/b")
    clock.jump(TTL + 0.5)
    elapsed, names = await timed(w.names("v"))
    assert sorted(names) == ["a", "b"] and elapsed <= w.settings.stale_after
    assert w.handler.calls["register"] == 2  # registered again with the last proofs
    await trio.sleep(w.settings.stale_after)
    assert "scanning bucket b (12345 objects listed so far)" in await stale_xattr(w)
    w.handler.scanning = False
    await trio.sleep(11)                # past the backoff
    assert await w.names("v") == ["a"]
    assert await stale_xattr(w) == "0"
    assert len(views_log("is stale")) == 1


async def test_sync_now_refreshes_within_the_ttl_and_registers_a_view_the_handler_does_not_know(
        make_world, clock):
    """``user.delvefs.sync`` ``now``, as ``delvefs watch`` asks it when the handler does not
    know the view (its bucket moved to another shard, which knows no view of it yet)."""
    w = await listed_world(make_world, "a")
    top = await w.path("v")
    w.handler.lose_state()
    w.handler.scanning = True           # the new owner's first scan of the bucket
    w.add("v", "data/b", b"b")
    with pytest.raises(FsError) as e:   # registered there; no listing until the scan is done
        await w.fs.setxattr(top.ino, "user.delvefs.sync", b"now")
    assert e.value.errno == errno.EAGAIN and w.handler.calls["register"] == 2
    w.handler.scanning = False
    await w.fs.setxattr(top.ino, "user.delvefs.sync", b"now")  # within the ttl, and the backoff
    assert sorted(await w.names("v")) == ["a", "b"] and w.handler.calls["register"] == 2


async def test_a_first_listing_is_eagain_when_the_scan_outlasts_the_scan_wait(
        make_world, clock, views_log):
    w = make_world(scan_wait=60.0)
    w.add("v", "data/a", b"a")
    w.handler.scanning = True
    w.handler.scan_listed = 42
    await w.start()
    top = await w.path("v")
    start = trio.current_time()
    with pytest.raises(FsError) as e:
        await w.fs.lookup(top.ino, "a")
    assert e.value.errno == errno.EAGAIN
    assert 60 <= trio.current_time() - start <= 60 + w.handler.scan_hold
    progress = views_log("waiting for the event handler's first scan")
    assert len(progress) == 5 and "42 objects listed so far" in progress[0]  # every 10 s


async def test_sync_waits_for_the_handler_and_fails_when_it_does_not_answer(make_world, clock):
    w = await listed_world(make_world, "a")
    top = await w.path("v")
    w.add("v", "data/b", b"b")
    version = w.handler.views["id-v"]["version"]
    w.handler.fail = True
    with pytest.raises(FsError) as e:
        await w.fs.setxattr(top.ino, "user.delvefs.sync", str(version).encode())
    assert e.value.errno == errno.EIO
    w.handler.fail = False           # sync ignores the backoff of a stale view
    await w.fs.setxattr(top.ino, "user.delvefs.sync", str(version).encode())
    assert await w.names("v") == ["a", "b"]
