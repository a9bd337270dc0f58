"""``layout: {by: [...]}`` in the core: one directory level per property, against the fake
handler and the fake S3.

The handler's listings and ``put`` changes of a view registered with ``layout_by`` carry
``"properties": {name: value}`` (docs/API.md): its tag of each of the view's property names,
else its user metadata (names lowercase; a name it lacks left out); a retag that changes
one of them is a ``put`` change. The mount places objects by them and reads nothing from S3
to do so. The fake handler reads them from the fake S3 when it answers.
"""
from __future__ import annotations

import errno
import os

import pytest

from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs.inodes import dir_value, relative_path, value_dir
from rulesets.model import View, default_root

pytestmark = pytest.mark.trio


def by_view(name="s", by=("sample", "lane"), object="runs/*", writable=True, **kw) -> View:
    return View(name=name, bucket="b", object=object, layout="flat", layout_by=tuple(by),
                root=default_root(object), writable=writable, **kw)


@pytest.fixture
def make_world(make_world):
    """Worlds whose fake handler lists property values from the fake S3."""
    def make(*views, **kw):
        w = make_world(*views, **kw)
        w.handler.store = w.store
        return w
    return make


def retag(w, view: str, key: str, tags: dict) -> None:
    """Another client retags ``key``; the handler logs it as a put change of the view."""
    o = w.obj(view, key)
    o["tags"] = dict(tags)
    w.handler.put(view, key, len(o["data"]), o["etag"], o["mtime"])


async def errno_of(coro) -> int:
    with pytest.raises(FsError) as e:
        await coro
    return e.value.errno


async def tree(w, path: str) -> list[str]:
    """Every file below ``path``, as relative paths (sorted)."""
    out = []
    for name in await w.names(path):
        node = await w.path(f"{path}/{name}")
        if node.is_dir:
            out += [f"{name}/{p}" for p in await tree(w, f"{path}/{name}")]
        else:
            out.append(name)
    return sorted(out)


async def test_value_directory_names_are_reversible():
    for value in ["S1", "a/b", "%", "", ".", "..", "_unset", "%2F", "x" * 300, "é" * 200, "%" * 130]:
        name = value_dir(value)
        assert name not in ("", ".", "..", "_unset") and "/" not in name
        assert len(name.encode()) <= 255
        assert dir_value(name, {name: value}) == value
    assert value_dir(None) == "_unset" and dir_value("_unset") is None
    assert [value_dir(v) for v in ["a/b", "", ".", "_unset"]] == ["a%2Fb", "%", "%2E", "%5Funset"]
    for not_written_so in ["%41", "%2e", "a%2Eb", "x%~0123456789abcdef"]:
        with pytest.raises(ValueError):
            dir_value(not_written_so)


async def test_objects_are_placed_by_the_values_the_handler_lists(make_world):
    w = make_world(by_view())
    w.add("s", "runs/a.fq", b"a", tags={"sample": "S1", "lane": "2"})
    w.add("s", "runs/sub/b.fq", b"b", tags={"Sample": "S1"}, metadata={"lane": "3"})
    w.add("s", "runs/c.fq", b"c", tags={"lane": "1"})                 # no sample
    w.add("s", "runs/d.fq", b"d", tags={"sample": "x/y", "lane": ".."})
    w.add("s", "runs/e.fq", b"e", tags={"sample": "%" * 130, "lane": "1"})   # a cut name
    await w.start()
    long = value_dir("%" * 130)
    assert await tree(w, "s") == sorted(["S1/2/a.fq", "S1/3/sub%2Fb.fq", "_unset/1/c.fq",
                                         "x%2Fy/%2E%2E/d.fq", f"{long}/1/e.fq"])
    assert w.store.calls["tags"] == 0 and w.store.calls["head"] == 0   # nothing read from S3
    await w.write(f"s/{long}/1/new.fq", b"n")              # its value is known to the mount
    assert w.obj("s", "runs/new.fq")["tags"] == {"sample": "%" * 130, "lane": "1"}
    assert await w.read("s/S1/3/sub%2Fb.fq") == b"b"
    vs = w.fs.catalog.by_name["s"]
    assert relative_path(vs, "runs/sub/b.fq") == "S1/3/sub%2Fb.fq"


async def test_a_retag_by_another_client_moves_the_file_at_the_next_refresh(make_world, mock_clock):
    w = make_world(by_view())
    w.add("s", "runs/a.fq", b"a", tags={"sample": "S1", "lane": "2"})
    await w.start()
    assert await tree(w, "s") == ["S1/2/a.fq"]
    a = await w.path("s/S1/2/a.fq")
    retag(w, "s", "runs/a.fq", {"sample": "S2", "lane": "2"})
    mock_clock.jump(1)                                  # within the view's ttl: as it was
    assert await tree(w, "s") == ["S1/2/a.fq"]
    mock_clock.jump(2)                                  # after it: the change moved it
    assert await tree(w, "s") == ["S2/2/a.fq"]
    assert (await w.path("s/S2/2/a.fq")).ino == a.ino   # the same file
    assert (w.fs.table.root.children["s"].ino, "S1") in w.notifier.entries
    assert w.store.calls["tags"] == 0 and w.store.calls["head"] == 0
    # the tag removed: to _unset
    retag(w, "s", "runs/a.fq", {"lane": "2"})
    mock_clock.jump(3)
    assert await tree(w, "s") == ["_unset/2/a.fq"]
    # deleted: gone, and its empty directories with it
    w.remove("s", "runs/a.fq")
    mock_clock.jump(3)
    assert await w.names("s") == []


async def test_create_in_a_property_directory_tags_the_object(make_world):
    w = await make_world(by_view(), by_view("one", by=("sample",), object="one/*")).start()
    top = await w.path("s")
    s1 = await w.fs.mkdir(top.ino, "S1")                    # a property directory, here only
    await w.fs.mkdir(s1.ino, "2")
    assert await w.names("s") == ["S1"] and await w.names("s/S1") == ["2"]
    await w.write("s/S1/2/new.fq", b"new")
    o = w.obj("s", "runs/new.fq")
    assert o["data"] == b"new" and o["tags"] == {"sample": "S1", "lane": "2"}
    assert await tree(w, "s") == ["S1/2/new.fq"]
    # _unset: the file gets no such tag
    await w.fs.mkdir(top.ino, "_unset")
    await w.fs.mkdir((await w.path("s/_unset")).ino, "%")
    await w.write("s/_unset/%/e.fq", b"e")
    assert w.obj("s", "runs/e.fq")["tags"] == {"lane": ""}
    # files live at the last level only; names must be written as value_dir writes them
    assert await errno_of(w.fs.create(top.ino, "f.fq", os.O_WRONLY | os.O_CREAT)) == errno.EPERM
    assert await errno_of(w.fs.create(s1.ino, "f.fq", os.O_WRONLY | os.O_CREAT)) == errno.EPERM
    assert await errno_of(w.fs.mkdir(top.ino, "a%41")) == errno.EINVAL
    assert await errno_of(w.fs.mkdir((await w.path("s/S1/2")).ino, "deeper")) == errno.EPERM
    # a name is one object: the same name in another directory exists already
    assert await errno_of(w.fs.create((await w.path("s/_unset/%")).ino, "new.fq",
                                      os.O_WRONLY | os.O_CREAT)) == errno.EEXIST
    # an empty property directory goes with rmdir, deleting nothing in S3
    await w.fs.mkdir(top.ino, "S9")
    await w.fs.rmdir(top.ino, "S9")
    assert w.store.wcalls["delete"] == 0 and "S9" not in await w.names("s")
    one = await w.path("one")
    await w.fs.mkdir(one.ino, "x")
    await w.write("one/x/f", b"f")
    assert w.obj("one", "one/f")["tags"] == {"sample": "x"}


async def test_rename_between_property_directories_retags(make_world):
    w = make_world(by_view())
    w.add("s", "runs/a.fq", b"a", tags={"sample": "S1", "lane": "2", "keep": "k"})
    await w.start()
    a = await w.path("s/S1/2/a.fq")
    top = await w.path("s")
    s2 = await w.fs.mkdir(top.ino, "S2")
    lane = await w.fs.mkdir(s2.ino, "2")
    await w.fs.rename((await w.path("s/S1/2")).ino, "a.fq", lane.ino, "a.fq")
    assert w.obj("s", "runs/a.fq")["tags"] == {"sample": "S2", "lane": "2", "keep": "k"}
    assert w.store.wcalls["copy"] == 0 and w.store.wcalls["put_tags"] == 1
    assert await tree(w, "s") == ["S2/2/a.fq"]
    assert (await w.path("s/S2/2/a.fq")).ino == a.ino
    # to _unset: the tag goes
    uns = await w.fs.mkdir(s2.ino, "_unset")
    await w.fs.rename(lane.ino, "a.fq", uns.ino, "a.fq")
    assert w.obj("s", "runs/a.fq")["tags"] == {"sample": "S2", "keep": "k"}
    assert await tree(w, "s") == ["S2/_unset/a.fq"]
    # with a new name too: copy + delete, then the tags of its new directory
    await w.fs.rename(uns.ino, "a.fq", (await w.path("s/S2/2")).ino, "b.fq")
    assert w.obj("s", "runs/a.fq") is None
    assert w.obj("s", "runs/b.fq")["tags"] == {"sample": "S2", "lane": "2", "keep": "k"}
    assert await tree(w, "s") == ["S2/2/b.fq"]
    assert (await w.path("s/S2/2/b.fq")).ino == a.ino      # one file all along
    assert w.store.wcalls["copy"] == 1
    # a property directory does not move as a whole: mv moves its files one by one
    assert await errno_of(w.fs.rename(top.ino, "S2", top.ino, "S3")) == errno.EXDEV


async def test_a_dirty_file_renamed_gets_the_tags_at_its_upload(make_world):
    w = await make_world(by_view()).start()
    top = await w.path("s")
    s1 = await w.fs.mkdir(top.ino, "S1")
    d1 = await w.fs.mkdir(s1.ino, "1")
    d2 = await w.fs.mkdir(s1.ino, "2")
    fh, _ = await w.open_write("s/S1/1/t.fq")
    await w.fs.write(fh, 0, b"t")
    await w.fs.rename(d1.ino, "t.fq", d2.ino, "t.fq")
    assert await tree(w, "s") == ["S1/2/t.fq"]
    await w.close(fh)
    assert w.obj("s", "runs/t.fq")["tags"] == {"sample": "S1", "lane": "2"}
    assert await tree(w, "s") == ["S1/2/t.fq"]


async def test_setxattr_moves_a_file_to_its_new_directory(make_world):
    w = make_world(by_view())
    w.add("s", "runs/a.fq", b"a", tags={"sample": "S1", "lane": "2"})
    await w.start()
    a = await w.path("s/S1/2/a.fq")
    await w.fs.setxattr(a.ino, "user.lane", b"7")
    assert await tree(w, "s") == ["S1/7/a.fq"]
    await w.fs.removexattr(a.ino, "user.sample")
    assert await tree(w, "s") == ["_unset/7/a.fq"]
    assert (await w.path("s/_unset/7/a.fq")).ino == a.ino


async def test_the_view_attribute_names_the_layout_properties(make_world):
    import json
    w = await make_world(by_view(by=("Sample", "lane"))).start()
    info = json.loads(await w.fs.getxattr((await w.path("s")).ino, "user.delvefs.view"))
    assert info["layout"] == "by" and info["layout_by"] == ["sample", "lane"]
    # the handler is told the names (a set, lowercase): its listings carry their values
    assert w.handler.layouts[info["id"]] == ("b", ("lane", "sample"))


async def test_a_value_with_a_nul_byte_leaves_its_object_unshown(make_world, mock_clock):
    w = make_world(by_view())
    w.add("s", "runs/a.fq", b"a", tags={"sample": "S\x001", "lane": "2"})
    w.add("s", "runs/b.fq", b"b", tags={"sample": "S1", "lane": "2"})
    await w.start()
    vs = w.fs.catalog.by_name["s"]
    assert await tree(w, "s") == ["S1/2/b.fq"]                  # never a directory named "S"
    assert list(vs.unshown) == ["runs/a.fq"]
    b = await w.path("s/S1/2/b.fq")
    retag(w, "s", "runs/a.fq", {"sample": "S1", "lane": "2"})  # a name now: shown, not counted
    retag(w, "s", "runs/b.fq", {"sample": "S\x002", "lane": "2"})  # none now: gone from the view
    mock_clock.jump(3)
    assert await tree(w, "s") == ["S1/2/a.fq"]
    assert list(vs.unshown) == ["runs/b.fq"] and b.gone


async def test_the_news_of_a_files_upload_does_not_undo_its_retag_here(make_world, mock_clock):
    # a file written through the mount is moved to another property directory (a retag:
    # its ETag stays) before the handler reports its upload; that report carries the tags
    # the file was uploaded with and the same ETag: it must not move the file back (the
    # report of the retag, later, confirms where it is)
    w = make_world(by_view(ttl=1))
    await w.start()
    top = await w.path("s")
    s1 = await w.fs.mkdir(top.ino, "S1")
    await w.fs.mkdir(s1.ino, "2")
    await w.write("s/S1/2/new.fq", b"new")
    up = w.obj("s", "runs/new.fq")
    s2 = await w.fs.mkdir(top.ino, "S2")
    lane = await w.fs.mkdir(s2.ino, "3")
    await w.fs.rename((await w.path("s/S1/2")).ino, "new.fq", lane.ino, "new.fq")
    assert await tree(w, "s") == ["S2/3/new.fq"]
    w.handler.put("s", "runs/new.fq", 3, up["etag"], up["mtime"],   # the upload's change
                  properties={"sample": "S1", "lane": "2"})
    mock_clock.jump(2)
    assert "S2/3/new.fq" in await tree(w, "s") and "S1/2/new.fq" not in await tree(w, "s")
    w.sync_handler("s", "runs/new.fq")                                # the retag's change
    mock_clock.jump(2)
    assert "S2/3/new.fq" in await tree(w, "s")
