"""Reloading the views of a mount (``delvefs reload``, SIGHUP) in the core, against the fake
handler and the fake S3: ``FileSystem.reload``."""
from __future__ import annotations

import pytest

from delvefs.client.mount.fs.inodes import ROOT_INODE
from delvefs.client.handler.api import HandlerUnavailable

from .conftest import view
from .fakes import FakeHandler

pytestmark = pytest.mark.trio


class UnregisteringHandler(FakeHandler):
    def __init__(self):
        super().__init__()
        self.unregistered: list[str] = []

    async def unregister(self, view_id):
        self.unregistered.append(view_id)


async def test_reload_adds_drops_and_relists_changed_views(make_world, tmp_path):
    from .conftest import World
    a, b = view("a", object="data/*"), view("b", object="other/*", writable=True)
    w = World(tmp_path, [a, b], handler=UnregisteringHandler())
    w.add("a", "data/x", b"x")
    w.add("b", "other/y", b"y")
    await w.start()
    assert await w.names() == ["a", "b"] and await w.names("a") == ["x"]
    y = await w.path("b/y")
    fh, _ = await w.fs.open(y.ino, 0)                      # open in a view about to be dropped
    old_a = await w.path("a")
    lists = w.handler.calls["list"]

    a2 = view("a", object="data/sub/*")                     # same name, other rules
    c = view("c", object="more/*")
    w.views.update(a=a2, c=c)
    w.handler.put("a", "data/sub/z", 1)
    w.handler.put("c", "more/m", 1)
    summary = await w.fs.reload([a2, c], {"b": ["proof"]})
    assert summary == {"added": ["c"], "removed": ["b"], "changed": ["a"], "views": ["a", "c"]}
    assert await w.names() == ["a", "c"]
    assert await w.names("a") == ["z"] and await w.names("c") == ["m"]
    assert w.handler.calls["list"] == lists + 2             # the changed view is listed anew
    assert (await w.path("a")).ino != old_a.ino and old_a.gone
    assert await w.path("b") is None
    # the kernel forgets the names that changed
    assert {(ROOT_INODE, n) for n in ("a", "b", "c")} <= set(w.notifier.entries)
    # registered as a whole, with the new proofs; the dropped registration forgotten
    assert w.fs.listings.registration[1] == {"b": ["proof"]}
    assert w.handler.unregistered == ["id-b"]
    # the open file of the dropped view still reads
    assert await w.fs.read(fh, 0, 10) == b"y"
    await w.fs.release(fh)
    # nothing changed: nothing asked
    registrations = w.handler.calls["register"]
    assert (await w.fs.reload([a2, c], {}))["added"] == []
    assert w.handler.calls["register"] == registrations


async def test_dirty_files_of_a_dropped_view_are_still_uploaded(make_world):
    keep = view("keep")
    gone = view("gone", object="out/*", writable=True, properties={"stage": ["raw"]})
    w = await make_world(keep, gone).start()
    fh, _ = await w.open_write("gone/f.txt")
    await w.fs.write(fh, 0, b"data")
    await w.fs.reload([keep], {})
    assert await w.names() == ["keep"]
    await w.fs.write(fh, 4, b"+more")                      # keeps working until closed
    await w.close(fh)
    o = w.obj("gone", "out/f.txt")
    assert o["data"] == b"data+more" and o["tags"] == {"stage": "raw"}


async def test_a_dirty_file_of_a_changed_view_shows_in_its_new_directory(make_world):
    v1 = view("v", writable=True, ttl=2.0)
    w = await make_world(v1).start()
    fh, _ = await w.open_write("v/f.txt")
    await w.fs.write(fh, 0, b"data")
    await w.fs.reload([view("v", writable=True, ttl=5.0)], {})
    assert await w.names("v") == ["f.txt"]
    await w.close(fh)
    assert w.obj("v", "data/f.txt")["data"] == b"data"
    assert await w.read("v/f.txt") == b"data"


async def test_a_refused_registration_changes_nothing(make_world):
    a = view("a")
    w = await make_world(a).start()
    w.handler.fail = True
    with pytest.raises(HandlerUnavailable):
        await w.fs.reload([view("b", object="b/*")], {})
    assert await w.names() == ["a"] and [vs.name for vs in w.fs.views] == ["a"]
    w.handler.fail = False
    await w.fs.reload([a, view("b", object="b/*")], {})
    assert await w.names() == ["a", "b"]


async def test_writes_match_against_the_new_views(make_world):
    """The matcher is compiled anew: a name only the new rules accept is uploaded."""
    w = await make_world(view("v", object="data/*.txt", writable=True)).start()
    await w.write("v/a.csv", b"scratch")                   # cannot match: a scratch file
    assert w.obj("v", "data/a.csv") is None
    await w.fs.reload([view("v", object="data/*", writable=True)], {})
    await w.write("v/b.csv", b"b")
    assert w.obj("v", "data/b.csv")["data"] == b"b"
    assert "b.csv" in await w.names("v")
