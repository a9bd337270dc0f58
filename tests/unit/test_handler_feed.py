"""The change streams' feed (eventhandler/feed.py) on a real engine and LevelDB: what it
serves from memory equals the store's change log read per view; a commit wakes only the
views it touches; a stream older than the memory, or a burst larger than one read, falls
back to the store."""
from __future__ import annotations

import asyncio

import pytest

from eventhandler import feed as feed_module
from eventhandler.devtools import spec
from eventhandler.feed import ChangeFeed
from tests.unit.test_handler_engine import engine, put_event, ready, remove_event  # noqa: F401 — fixture

SEQ = 10**18


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def views(engine, n=3):
    out = engine.register([(f"v{k}", spec("b", object=f"v{k}/*")) for k in range(n)])
    return [ready(engine, o["id"]) for o in out]


def applied(changes) -> dict:
    """A client's view after applying the changes in order."""
    state = {}
    for c in changes:
        if c["op"] == "put":
            state[c["key"]] = c["object"]
        else:
            state.pop(c["key"], None)
    return state


def commit(engine, feed, *events):
    """Apply the events and tell the feed, as the Hub does after a commit."""
    for ev in events:
        engine.apply_events(ev)
    feed.committed({"b"})


def test_feed_serves_what_the_store_holds_and_wakes_only_touched_views(engine, loop):
    infos = views(engine)
    feed = ChangeFeed(engine)
    feed.open("b")
    start = engine.buckets["b"].committed
    woken = [feed.event(info) for info in infos]
    commit(engine, feed, put_event("v0/a", SEQ + 1), put_event("v0/b", SEQ + 2))
    assert [ev.is_set() for ev in woken] == [True, False, False]
    commit(engine, feed, put_event("v1/a", SEQ + 3), remove_event("v0/a", SEQ + 4), put_event("v0/b", SEQ + 5, size=9))
    for info in infos:
        for since in (start, start + 1, engine.buckets["b"].committed - 1):
            mine, stored = feed.changes(info, since, 1000), engine.changes(info, since, 1000)
            assert mine["version"] == stored["version"] and not mine["more"]
            # the store's changes, in order, plus the entries it replaced since
            assert [c for c in mine["changes"] if c in stored["changes"]] == stored["changes"]
            assert applied(mine["changes"]) == applied(stored["changes"])
    again = [feed.event(info) for info in infos]
    assert [ev.is_set() for ev in again] == [False, False, False]  # nothing new since
    (v0, v1, _v2) = infos
    ops = [(c["op"], c["key"]) for c in feed.changes(v0, start, 1000)["changes"]]
    # the feed keeps the entry the store replaced (v0/b's first put): a stream sends both, in order
    assert ops == [("put", "v0/a"), ("put", "v0/b"), ("delete", "v0/a"), ("put", "v0/b")]
    assert [c["key"] for c in feed.changes(v1, start, 1000)["changes"]] == ["v1/a"]
    # one encoding for every stream of a view at the same version
    assert feed.encoded(v0, start, 1000) is feed.encoded(v0, start, 1000)
    assert feed.encoded(v0, start, 1000)[0].count(b"\nid: ") + 1 == 4


def test_older_than_memory_and_bursts_fall_back_to_the_store(engine, loop, monkeypatch):
    (info,) = views(engine, 1)
    before = engine.buckets["b"].committed
    commit(engine, ChangeFeed(engine), put_event("v0/early", SEQ + 1))
    feed = ChangeFeed(engine)
    feed.open("b")
    assert feed.changes(info, before, 1000) is None  # older than the feed: the store answers
    ev = feed.event(info)
    monkeypatch.setattr(feed_module, "READ_MAX", 2)
    commit(engine, feed, *(put_event(f"v0/k{i}", SEQ + 10 + i) for i in range(3)))
    assert ev.is_set()  # a burst wakes every stream of the bucket ...
    top = engine.buckets["b"].committed
    assert feed.changes(info, top - 1, 1000) is None  # ... which then read the store
    assert feed.changes(info, top, 1000) == {"version": top, "changes": [], "more": False}
    feed.close("b")
    assert not feed.windows and not feed.waiting
