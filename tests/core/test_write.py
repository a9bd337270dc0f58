"""The write path of the core against the fake handler and the fake S3."""
from __future__ import annotations

import errno
import json
import os
import time

import pytest
import trio

from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs.inodes import relative_path

from .conftest import view

pytestmark = pytest.mark.trio

W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def wview(name="v", **kw):
    kw.setdefault("writable", True)
    return view(name, **kw)


async def errno_of(coro) -> int:
    with pytest.raises(FsError) as e:
        await coro
    return e.value.errno


async def test_create_write_close_uploads_with_set_tags_and_content_type(make_world):
    w = await make_world(wview("v", object="data/*", properties={"stage": ["raw"]})).start()
    fh, node = await w.open_write("v/new.txt")
    await w.fs.write(fh, 0, b"hello ")
    await w.fs.write(fh, 6, b"world")
    assert w.obj("v", "data/new.txt") is None          # nothing uploaded before close
    assert node.size == 11
    await w.close(fh)
    o = w.obj("v", "data/new.txt")
    assert o["data"] == b"hello world" and o["tags"] == {"stage": "raw"}
    assert o["content_type"] == "text/plain"
    assert w.store.wcalls["upload"] == 1
    # read your writes: there at once, with the uploaded ETag, readable locally
    assert await w.names("v") == ["new.txt"]
    assert (await w.path("v/new.txt")).etag == o["etag"]
    assert await w.read("v/new.txt") == b"hello world"
    assert w.store.calls["download"] == 0
    # an empty file is an (empty) object too
    await w.write("v/empty.bin", b"")
    assert w.obj("v", "data/empty.bin")["data"] == b""
    assert w.store.uploaded[-1]["content_type"] == "application/octet-stream"


async def test_open_without_trunc_keeps_content_and_with_trunc_empties(make_world):
    w = make_world(wview())
    w.add("v", "data/a", b"0123456789")
    w.add("v", "data/b", b"0123456789")
    await w.start()
    await w.write("v/a", b"AB", flags=os.O_WRONLY, offset=2)     # downloaded first
    assert w.obj("v", "data/a")["data"] == b"01AB456789"
    await w.write("v/b", b"AB", flags=os.O_WRONLY | os.O_TRUNC)
    assert w.obj("v", "data/b")["data"] == b"AB"
    assert await w.read("v/a") == b"01AB456789"


async def test_ftruncate_and_truncate(make_world):
    w = make_world(wview())
    w.add("v", "data/a", b"0123456789")
    await w.start()
    a = await w.path("v/a")
    fh, _ = await w.fs.open(a.ino, os.O_RDWR)
    await w.fs.setattr(a.ino, size=4, fh=fh)              # ftruncate: uploaded at close
    assert w.obj("v", "data/a")["data"] == b"0123456789"
    await w.close(fh)
    assert w.obj("v", "data/a")["data"] == b"0123"
    await w.fs.setattr(a.ino, size=6)                     # truncate(2): uploaded at once
    assert w.obj("v", "data/a")["data"] == b"0123\0\0" and a.size == 6
    # chmod / chown / utimens: accepted, not stored
    assert await w.fs.setattr(a.ino) is a


async def test_fsync_uploads(make_world):
    w = await make_world(wview()).start()
    fh, node = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"first")
    await w.fs.fsync(fh)
    assert w.obj("v", "data/f")["data"] == b"first"
    await w.fs.write(fh, 5, b" second")
    assert w.cache.get("b", "data/f").dirty
    await w.close(fh)
    assert w.obj("v", "data/f")["data"] == b"first second"
    assert not w.cache.get("b", "data/f").dirty and not os.listdir(w.cache.journal)


async def test_scratch_file_never_uploaded_then_renamed_uploads(make_world, mock_clock):
    w = await make_world(wview("v", object="data/*.txt")).start()
    # sort -o / rsync / editors: write a temporary name, then rename it into place
    await w.write("v/.out.txt.tmp42", b"sorted\n")
    assert w.store.wcalls["upload"] == 0 and w.obj("v", "data/.out.txt.tmp42") is None
    assert await w.names("v") == [".out.txt.tmp42"]          # visible here
    assert await w.read("v/.out.txt.tmp42") == b"sorted\n"
    assert w.fs.scratch_files() == ["v/.out.txt.tmp42"]
    top = await w.path("v")
    await w.fs.rename(top.ino, ".out.txt.tmp42", top.ino, "out.txt")
    assert w.obj("v", "data/out.txt")["data"] == b"sorted\n"
    assert [k for _, k in w.store.objects] == ["data/out.txt"]   # no junk objects
    assert await w.names("v") == ["out.txt"] and w.fs.scratch_files() == []
    # a scratch file removed is gone without a request
    await w.write("v/junk.tmp", b"x")
    await w.fs.unlink(top.ino, "junk.tmp")
    assert w.store.wcalls["delete"] == 0 and await w.names("v") == ["out.txt"]
    # renaming an object to a name its view cannot show: EXDEV (mv then copies + unlinks)
    assert await errno_of(w.fs.rename(top.ino, "out.txt", top.ino, "out.bak")) == errno.EXDEV


async def test_read_your_writes_overlay_not_undone_by_stale_delta(make_world, mock_clock):
    w = make_world(wview())
    w.add("v", "data/old", b"old")
    await w.start()
    top = await w.path("v")
    await w.write("v/new", b"new")
    await w.fs.unlink(top.ino, "old")
    assert sorted(await w.names("v")) == ["new"]
    # the handler has not seen either change yet: deltas say nothing / old state
    w.handler.put("v", "data/old", 3, w.handler.views["id-v"]["objects"]["data/old"]["etag"])
    mock_clock.jump(3)
    assert sorted(await w.names("v")) == ["new"]
    # a relist (410) that still lacks "new" and has "old" does not undo them either
    w.handler.put("v", "data/old", 3, w.handler.views["id-v"]["objects"]["data/old"]["etag"])
    w.handler.truncate_log("v")
    mock_clock.jump(3)
    assert sorted(await w.names("v")) == ["new"]
    assert w.handler.calls["list"] == 2
    # the handler catches up: the overlay is retired, the listing rules again
    w.sync_handler("v", "data/new")
    w.sync_handler("v", "data/old")
    mock_clock.jump(3)
    assert sorted(await w.names("v")) == ["new"]
    assert w.fs.views[0].overlay == {}
    # a later change by someone else shows normally
    w.remove("v", "data/new")
    mock_clock.jump(3)
    assert await w.names("v") == []


async def test_overlay_bound(make_world, mock_clock):
    w = await make_world(wview()).start()
    await w.write("v/new", b"new")
    mock_clock.jump(w.settings.overlay_bound + 1)   # the handler never reported it: trusted again
    assert await w.names("v") == ["new"]       # no change from the handler: still shown
    w.remove("v", "data/new")
    mock_clock.jump(3)
    assert await w.names("v") == []


async def test_unlink_deletes_object(make_world):
    w = make_world(wview(), wview("w2"))
    w.add("v", "data/a", b"a")
    w.add("w2", "data/a", b"a")
    await w.start()
    assert await w.names("w2") == ["a"]
    top = await w.path("v")
    await w.fs.unlink(top.ino, "a")
    assert w.obj("v", "data/a") is None and w.store.wcalls["delete"] == 1
    assert await w.names("v") == [] and await w.names("w2") == []   # every view at once
    assert await errno_of(w.fs.unlink(top.ino, "a")) == errno.ENOENT


async def test_rename_file_server_side_copy(make_world):
    w = make_world(wview())
    w.add("v", "data/a.txt", b"payload", tags={"k": "1"})
    await w.start()
    top = await w.path("v")
    a = await w.path("v/a.txt")
    await w.fs.mkdir(top.ino, "sub")
    sub = await w.path("v/sub")
    await w.fs.rename(top.ino, "a.txt", sub.ino, "b.txt")
    assert w.obj("v", "data/a.txt") is None
    assert w.obj("v", "data/sub/b.txt")["data"] == b"payload"
    assert w.obj("v", "data/sub/b.txt")["tags"] == {"k": "1"}
    assert w.store.wcalls == {"upload": 0, "copy": 1, "delete": 1, "put_tags": 0}
    assert w.store.calls["download"] == 0                     # no data through the client
    assert await w.names("v") == ["sub"] and await w.names("v/sub") == ["b.txt"]
    assert (await w.path("v/sub/b.txt")) is a                   # same inode
    assert await w.read("v/sub/b.txt") == b"payload"
    # replacing an existing file
    w.add("v", "data/c.txt", b"c")
    await w.fs.rename(sub.ino, "b.txt", top.ino, "c.txt")
    assert w.obj("v", "data/c.txt")["data"] == b"payload"
    await w.fs.mkdir(top.ino, "dir")
    assert await errno_of(w.fs.rename(top.ino, "c.txt", top.ino, "dir", 0)) == errno.EISDIR


async def test_rename_directory_moves_every_object(make_world):
    w = make_world(wview())
    for k in ["data/d/x", "data/d/e/y", "data/d/e/f/z", "data/other"]:
        w.add("v", k, k.encode())
    await w.start()
    top = await w.path("v")
    d = await w.path("v/d")
    await w.write("v/d/e/local", b"dirty")  # a written file moves too
    await w.fs.rename(top.ino, "d", top.ino, "n")
    keys = sorted(k for _, k in w.store.objects)
    assert keys == ["data/n/e/f/z", "data/n/e/local", "data/n/e/y", "data/n/x", "data/other"]
    assert w.obj("v", "data/n/e/y")["data"] == b"data/d/e/y"
    assert sorted(await w.names("v")) == ["n", "other"]
    assert (await w.path("v/n")) is d
    assert await w.read("v/n/e/f/z") == b"data/d/e/f/z"
    assert (await w.path("v/n/e/f/z")).key == "data/n/e/f/z"


async def test_mkdir_rmdir(make_world, mock_clock):
    w = await make_world(wview(), wview("flat", layout="flat")).start()
    top = await w.path("v")
    d = await w.fs.mkdir(top.ino, "new")
    assert await w.names("v") == ["new"]
    mock_clock.jump(3)
    assert await w.names("v") == ["new"]                  # survives refreshes
    assert await errno_of(w.fs.mkdir(top.ino, "new")) == errno.EEXIST
    await w.write("v/new/f", b"f")                        # a file lands: an ordinary directory
    assert w.obj("v", "data/new/f") is not None
    assert await errno_of(w.fs.rmdir(top.ino, "new")) == errno.ENOTEMPTY
    await w.fs.unlink(d.ino, "f")
    assert await w.names("v") == ["new"]                  # emptied here: stays until rmdir (rm -r)
    await w.fs.rmdir(top.ino, "new")
    assert await w.names("v") == []
    await w.fs.mkdir(top.ino, "e")
    await w.fs.rmdir(top.ino, "e")
    assert await w.names("v") == [] and w.store.wcalls["delete"] == 1
    flat = await w.path("flat")
    assert await errno_of(w.fs.mkdir(flat.ino, "x")) == errno.EPERM


async def test_setxattr_tags_move_between_views(make_world):
    w = make_world(wview("raw", properties={"stage": ["raw"]}),
                   wview("cooked", properties={"stage": ["cooked"]}))
    w.add("raw", "data/x", b"x", tags={"stage": "raw", "other": "1"})
    await w.start()
    assert await w.names("raw") == ["x"] and await w.names("cooked") == []
    x = await w.path("raw/x")
    await w.fs.setxattr(x.ino, "user.stage", b"cooked")
    assert w.obj("raw", "data/x")["tags"] == {"stage": "cooked", "other": "1"}   # merged
    assert await w.names("raw") == [] and await w.names("cooked") == ["x"]       # at once
    y = await w.path("cooked/x")
    assert await w.fs.getxattr(y.ino, "user.stage") == b"cooked"
    await w.fs.removexattr(y.ino, "user.other")
    assert w.obj("raw", "data/x")["tags"] == {"stage": "cooked"}
    assert await errno_of(w.fs.removexattr(y.ino, "user.absent")) == errno.ENODATA
    for name in ("user.meta.sample", "user.delvefs.etag"):
        assert await errno_of(w.fs.setxattr(y.ino, name, b"v")) == errno.EPERM
    assert await errno_of(w.fs.setxattr(y.ino, "trusted.x", b"v")) == errno.EOPNOTSUPP
    # a file not uploaded yet: tags go with its upload
    fh, n = await w.open_write("cooked/new")
    await w.fs.setxattr(n.ino, "user.extra", b"e")
    assert await w.fs.getxattr(n.ino, "user.extra") == b"e"
    await w.close(fh)
    assert w.obj("raw", "data/new")["tags"] == {"stage": "cooked", "extra": "e"}


async def test_erofs_on_read_only_views(make_world):
    w = make_world(view("ro"))
    w.add("ro", "data/a", b"a")
    await w.start()
    top = await w.path("ro")
    a = await w.path("ro/a")
    assert await errno_of(w.fs.create(top.ino, "n", W)) == errno.EROFS
    assert await errno_of(w.fs.open(a.ino, os.O_RDWR)) == errno.EROFS
    assert await errno_of(w.fs.unlink(top.ino, "a")) == errno.EROFS
    assert await errno_of(w.fs.rename(top.ino, "a", top.ino, "b")) == errno.EROFS
    assert await errno_of(w.fs.mkdir(top.ino, "d")) == errno.EROFS
    assert await errno_of(w.fs.setxattr(a.ino, "user.t", b"v")) == errno.EROFS
    assert await errno_of(w.fs.setattr(a.ino, size=0)) == errno.EROFS
    assert await errno_of(w.fs.create(1, "n", W)) == errno.EACCES   # the mount's root
    # the view's directory stays u+w (user.delvefs.sync is set there): sync works
    assert w.fs.stat(top)[0] & 0o200 and not w.fs.stat(a)[0] & 0o200
    await w.fs.setxattr(top.ino, "user.delvefs.sync", b"1")
    # access(2) follows the modes shown; write access in a read-only view is EROFS
    w.fs.access(a.ino, os.R_OK)
    w.fs.access(top.ino, os.R_OK | os.W_OK | os.X_OK)
    with pytest.raises(FsError) as e:
        w.fs.access(a.ino, os.W_OK)
    assert e.value.errno == errno.EROFS
    with pytest.raises(FsError) as e:
        w.fs.access(a.ino, os.X_OK)
    assert e.value.errno == errno.EACCES


async def test_unlinked_while_open_is_not_uploaded(make_world):
    w = await make_world(wview()).start()
    top = await w.path("v")
    fh, _ = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"one")
    await w.fs.unlink(top.ino, "f")
    await w.fs.write(fh, 3, b" two")
    assert await w.fs.read(fh, 0, 100) == b"one two"
    await w.close(fh)
    assert w.store.wcalls["upload"] == 0 and w.obj("v", "data/f") is None
    assert await w.names("v") == [] and os.listdir(w.cache.journal) == []


async def test_cache_disk_full_is_enospc(make_world, monkeypatch):
    w = await make_world(wview()).start()
    fh, _ = await w.open_write("v/f")

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "pwrite", full)
    assert await errno_of(w.fs.write(fh, 0, b"x")) == errno.ENOSPC
    monkeypatch.undo()
    assert await errno_of(w.close(fh)) == errno.ENOSPC    # the failed write's (never uploaded)
    assert w.obj("v", "data/f") is None


async def test_links_and_special_files_refused(make_world):
    w = await make_world(wview()).start()
    for what in ("link", "symlink", "mknod"):
        with pytest.raises(FsError) as e:
            w.fs.refuse(what)
        assert e.value.errno == errno.EPERM


async def test_no_mode_shown_has_a_setuid_setgid_or_sticky_bit(make_world):
    # so a write, truncate or chown has nothing to clear: the mount negotiates KILLPRIV_V2,
    # which leaves that clearing to the file system
    w = await make_world(wview(), file_mode=0o777, dir_mode=0o777).start()
    node = await w.write("v/f", b"#!/bin/sh\n")
    fh, _ = await w.open_write("v/f", os.O_WRONLY)
    await w.fs.write(fh, 0, b"#")
    await w.fs.setattr(node.ino, size=1, fh=fh)
    await w.close(fh)
    for n in (node, await w.path("v"), await w.path("")):
        mode = w.fs.stat(n)[0]
        assert mode & 0o7000 == 0 and mode & 0o777 in (0o777, 0o755)


async def test_upload_failure_keeps_data_dirty_and_retries(make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = await make_world(wview(), retry_initial=1.0).start()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        w.store.fail_writes = errno.EIO
        with pytest.raises(FsError) as e:
            await w.write("v/f", b"precious")
        assert e.value.errno == errno.EIO
        entry = w.cache.get("b", "data/f")
        assert entry.dirty and len(os.listdir(w.cache.journal)) == 1
        assert await w.names("v") == ["f"] and await w.read("v/f") == b"precious"
        await trio.sleep(1.5)
        assert w.store.wcalls["upload"] >= 2                # retried with backoff
        w.store.fail_writes = None
        await trio.sleep(w.settings.retry_max + 1)
        assert w.obj("v", "data/f")["data"] == b"precious"
        while w.cache.journal.removals_pending():                  # its record goes in a worker thread
            await trio.sleep(0.01)
        assert not entry.dirty and os.listdir(w.cache.journal) == []
        # access denied and a full cache disk map to their errnos
        w.store.fail_writes = errno.EACCES
        assert await errno_of(w.write("v/g", b"g")) == errno.EACCES
        w.store.fail_writes = None
        nursery.cancel_scope.cancel()


async def test_journal_replay_after_restart(make_world):
    w = make_world(wview())
    w.add("v", "data/clean", b"c")
    await w.start()
    assert await w.read("v/clean") == b"c"
    w.store.fail_writes = errno.EIO
    with pytest.raises(FsError):
        await w.write("v/dirty", b"not lost")
    fh, _ = await w.open_write("v/open")         # killed while still open
    await w.fs.write(fh, 0, b"half")
    w.store.fail_writes = None
    # SIGKILL: no unmount, no upload; the next mount of the same cache dir uploads
    w2 = w.restart()
    assert sorted(os.listdir(w2.cache.dir)) == sorted(
        r["file"] for r in w2.cache.recovered)   # clean entries dropped
    await w2.start()
    w2.fs.recover()
    assert sorted(await w2.names("v")) == ["clean", "dirty", "open"]
    failed, scratch = await w2.fs.shutdown()
    assert failed == [] and scratch == []
    assert w2.obj("v", "data/dirty")["data"] == b"not lost"
    assert w2.obj("v", "data/open")["data"] == b"half"
    assert os.listdir(w2.cache.journal) == []


async def test_shutdown_reports_failures_and_scratch(make_world):
    w = await make_world(wview("v", object="data/*.txt")).start()
    await w.write("v/left.tmp", b"scratch")
    fh, _ = await w.open_write("v/a.txt")
    await w.fs.write(fh, 0, b"a")
    failed, scratch = await w.fs.shutdown()   # umount: open files are uploaded too
    assert failed == [] and scratch == ["v/left.tmp"]
    assert w.obj("v", "data/a.txt")["data"] == b"a"


async def test_view_and_sync_xattrs(make_world):
    w = make_world(wview("v"), wview("f", layout="flat"))
    await w.start()
    top = await w.path("v")
    assert await w.fs.listxattr(top.ino) == ["user.delvefs.view", "user.delvefs.stale"]
    info = json.loads(await w.fs.getxattr(top.ino, "user.delvefs.view"))
    assert info == {"id": "id-v", "name": "v", "handler": None, "shard": None, "handlers": None,
                    "bucket": "b", "root": "data/", "layout": "tree", "version": w.fs.views[0].listing.version}
    flat = json.loads(await w.fs.getxattr((await w.path("f")).ino, "user.delvefs.view"))
    assert flat["layout"] == "flat"
    # a change the mount has not fetched (ttl not over): sync fetches it now
    await w.names("v")
    w.add("v", "data/new", b"n")
    version = w.handler.views["id-v"]["version"]
    assert await w.names("v") == []
    await w.fs.setxattr(top.ino, "user.delvefs.sync", str(version).encode())
    assert await w.names("v") == ["new"] and w.fs.views[0].listing.version >= version
    calls = w.handler.calls["changes"]
    await w.fs.setxattr(top.ino, "user.delvefs.sync", b"1")   # older: at once
    assert w.handler.calls["changes"] == calls
    assert await errno_of(w.fs.setxattr(top.ino, "user.delvefs.sync", b"x")) == errno.EINVAL


async def test_relative_path():
    tree, flat = wview("t", object="data/*"), wview("f", object="data/*", layout="flat")
    assert relative_path(tree, "data/sub/b.txt") == "sub/b.txt"
    assert relative_path(tree, "data/sub/") == "sub/"
    assert relative_path(tree, "other/x") is None
    assert relative_path(tree, "data/a//b") is None
    assert relative_path(flat, "data/sub/b.txt") == "sub%2Fb.txt"
    assert relative_path(flat, "data/sub/") is None
    info = {"root": "data/", "layout": "flat"}          # what user.delvefs.view answers
    assert relative_path(info, "data/a/b") == "a%2Fb"


async def test_flat_view_writes(make_world):
    w = await make_world(wview("f", layout="flat")).start()
    await w.write("f/a%2Fb.txt", b"x")
    assert w.obj("f", "data/a/b.txt")["data"] == b"x"
    top = await w.path("f")
    assert await errno_of(w.fs.create(top.ino, "100%", W)) == errno.EINVAL   # not a flat name
    await w.fs.rename(top.ino, "a%2Fb.txt", top.ino, "c%2Fd.txt")
    assert sorted(k for _, k in w.store.objects) == ["data/c/d.txt"]


async def test_empty_directory_rename_and_rm_r(make_world):
    w = await make_world(wview()).start()
    top = await w.path("v")
    await w.fs.mkdir(top.ino, "e")
    await w.fs.rename(top.ino, "e", top.ino, "f")
    assert await w.names("v") == ["f"]
    # rm -r: unlink the files, then rmdir each directory bottom-up
    d = await w.fs.mkdir(top.ino, "d")
    x = await w.fs.mkdir(d.ino, "x")
    await w.write("v/d/x/y", b"y")
    await w.write("v/d/a", b"a")
    await w.fs.unlink(x.ino, "y")
    await w.fs.rmdir(d.ino, "x")
    await w.fs.unlink(d.ino, "a")
    await w.fs.rmdir(top.ino, "d")
    assert await w.names("v") == ["f"] and w.store.objects == {}


async def test_open_for_writing_with_a_tiny_cache_keeps_content(make_world):
    w = make_world(wview(), cache_limit=1)     # every clean entry is evicted at once
    w.add("v", "data/a", b"0123456789")
    await w.start()
    await w.write("v/a", b"X", flags=os.O_WRONLY)
    assert w.obj("v", "data/a")["data"] == b"X123456789"


async def test_a_new_file_renamed_away_leaves_another_views_object_of_its_name(make_world):
    # v shows every data/ key, hot only those tagged stage=hot: data/b.txt (untagged) is in v
    w = make_world(view("v", writable=True),
                   view("hot", properties={"stage": ["hot"]}, writable=True))
    w.add("v", "data/b.txt", b"theirs")
    await w.start()
    assert await w.names("v") == ["b.txt"]
    fh, _ = await w.open_write("hot/b.txt", os.O_RDWR | os.O_CREAT)  # new in hot, still open
    hot = await w.path("hot")
    await w.fs.rename(hot.ino, "b.txt", hot.ino, "c.txt")
    assert "b.txt" in await w.names("v")             # S3 still has it: v still shows it
    assert w.obj("v", "data/b.txt")["data"] == b"theirs"
    await w.fs.release(fh)


async def test_an_outside_overwrite_after_this_mounts_upload_shows_at_once(make_world):
    """The handler keeps only the newest change of a key: when another writer replaced the
    object after this mount's upload, the upload's own change never comes; the newer
    version shows, with its size, as soon as the view refreshes."""
    w = make_world(view("v", writable=True, ttl=0.0))
    await w.start()
    node = await w.write("v/f", b"old\n")                       # uploaded at close
    w.add("v", "data/f", b"new one\n", mtime=time.time() + 1)   # replaced from outside
    assert await w.fs.getattr(node.ino) is node and node.size == 8
    assert await w.read("v/f") == b"new one\n"
    await w.fs.unlink((await w.path("v")).ino, "f")              # gone through this mount
    w.add("v", "data/f", b"again", mtime=time.time() + 2)        # and created again outside
    assert await w.names("v") == ["f"] and await w.read("v/f") == b"again"


async def test_a_descriptor_open_across_another_writers_close_writes_the_same_file(make_world):
    """Every descriptor open for writing writes one file, also after an fsync uploaded it
    and another descriptor was opened, written and closed meanwhile: nothing is lost."""
    w = await make_world(wview()).start()
    fh1, node = await w.open_write("v/f", os.O_RDWR | os.O_CREAT)
    await w.fs.write(fh1, 0, b"a")
    await w.fs.fsync(fh1)                                  # uploaded: clean, still open
    await w.write("v/f", b"bb", flags=os.O_WRONLY)         # another descriptor writes, closes
    assert await w.fs.read(fh1, 0, 10) == b"bb"            # one file: fd1 sees those bytes
    await w.fs.write(fh1, 2, b"c")
    await w.fs.setattr(node.ino, size=4, fh=fh1)           # ftruncate through fd1 works too
    await w.close(fh1)
    assert w.obj("v", "data/f")["data"] == b"bbc\0"


@pytest.mark.parametrize("mode, offset, length, expected", [
    (0, 2, 8, b"abcdef\0\0\0\0"),                 # extends with zeros
    (0, 0, 3, b"abcdef"),                           # inside: nothing changes
    (0x01, 0, 100, b"abcdef"),                      # KEEP_SIZE: nothing changes
    (0x03, 1, 2, b"a\0\0def"),                      # PUNCH_HOLE | KEEP_SIZE
    (0x03, 4, 100, b"abcd\0\0"),                    # a hole past the end keeps the size
    (0x10, 4, 4, b"abcd\0\0\0\0"),                  # ZERO_RANGE extends
    (0x11, 4, 4, b"abcd\0\0"),                      # ZERO_RANGE | KEEP_SIZE does not
])
async def test_fallocate_modes_end_as_zeros_in_s3(make_world, mode, offset, length, expected):
    w = await make_world(wview()).start()
    fh, node = await w.open_write("v/f")
    await w.fs.write(fh, 0, b"abcdef")
    await w.fs.fallocate(node.ino, fh, mode, offset, length)
    assert w.fs.stat(node)[2] == len(expected)
    await w.close(fh)
    assert w.obj("v", "data/f")["data"] == expected


async def test_fallocate_modes_that_move_data_are_eopnotsupp(make_world):
    w = await make_world(wview()).start()
    fh, node = await w.open_write("v/f")
    for mode in (0x02, 0x08, 0x20, 0x40):  # a hole without KEEP_SIZE, collapse, insert, unshare
        with pytest.raises(FsError) as e:
            await w.fs.fallocate(node.ino, fh, mode, 0, 1)
        assert e.value.errno == errno.EOPNOTSUPP
    await w.close(fh)


async def test_copy_file_range_of_a_whole_object_into_a_new_file_is_a_server_side_copy(
        make_world):
    w = make_world(wview(set={"stage": "copied"}))
    w.add("v", "data/src", b"0123456789", tags={"owner": "x"})
    await w.start()
    src = await w.path("v/src")
    fh_in, _ = await w.fs.open(src.ino, os.O_RDONLY)
    fh_out, dst = await w.open_write("v/dst")
    assert await w.fs.copy_file_range(fh_in, 0, fh_out, 0, 1 << 62, 0) == 10
    assert w.store.wcalls["copy"] == 1 and w.store.uploaded == []   # no bytes moved
    assert w.obj("v", "data/dst")["tags"] == {"stage": "copied"}    # a new file's tags
    assert await w.fs.read(fh_out, 0, 100) == b"0123456789"         # read back through it
    await w.fs.write(fh_out, 10, b"!")                              # and written further
    await w.close(fh_out)
    await w.fs.release(fh_in)
    assert w.obj("v", "data/dst")["data"] == b"0123456789!"
    assert w.fs.stat(dst)[2] == 11


async def test_copy_file_range_in_the_kernels_pieces_is_one_server_side_copy(
        make_world, monkeypatch):
    # the kernel asks for at most COPY_PIECE bytes at a time (4 GiB less a page): the
    # first piece copies the whole object, the next ones find their bytes copied
    from delvefs.client.mount.fs import writes
    monkeypatch.setattr(writes, "COPY_PIECE", 4)
    w = make_world(wview())
    w.add("v", "data/src", b"0123456789")
    await w.start()
    src = await w.path("v/src")
    fh_in, _ = await w.fs.open(src.ino, os.O_RDONLY)
    fh_out, dst = await w.open_write("v/dst")
    done = 0
    while True:
        n = await w.fs.copy_file_range(fh_in, done, fh_out, done, 4, 0)
        if n == 0:
            break
        done += n
    assert done == 10 and w.store.wcalls["copy"] == 1 and w.store.uploaded == []
    await w.close(fh_out)
    await w.fs.release(fh_in)
    assert w.obj("v", "data/dst")["data"] == b"0123456789"
    with pytest.raises(FsError) as e:               # a piece that is not the first: not copied
        fh_in, _ = await w.fs.open(src.ino, os.O_RDONLY)
        fh_out, _ = await w.open_write("v/other")
        await w.fs.copy_file_range(fh_in, 4, fh_out, 4, 4, 0)
    assert e.value.errno == errno.EOPNOTSUPP


async def test_copy_file_range_of_anything_else_lets_the_kernel_copy(make_world):
    w = make_world(wview())
    w.add("v", "data/src", b"0123456789")
    await w.start()
    src = await w.path("v/src")
    fh_in, _ = await w.fs.open(src.ino, os.O_RDONLY)
    fh_out, _ = await w.open_write("v/dst")
    for args in ((2, fh_out, 0, 8), (0, fh_out, 3, 10), (0, fh_out, 0, 5)):  # part, offset
        off_in, out, off_out, length = args
        with pytest.raises(FsError) as e:
            await w.fs.copy_file_range(fh_in, off_in, out, off_out, length, 0)
        assert e.value.errno == errno.EOPNOTSUPP
    await w.fs.write(fh_out, 0, b"x")                               # not empty any more
    with pytest.raises(FsError) as e:
        await w.fs.copy_file_range(fh_in, 0, fh_out, 0, 100, 0)
    assert e.value.errno == errno.EOPNOTSUPP and w.store.wcalls["copy"] == 0
    await w.close(fh_out)
    await w.fs.release(fh_in)



async def test_rmdir_fails_while_s3_holds_a_file_below_that_a_refresh_would_show(make_world):
    w = make_world(wview(), wview("tagged", properties={"stage": ["raw"]}, object="data/*"))
    w.add("v", "data/d/a", b"a")
    await w.start()
    top = await w.path("v")
    d = await w.path("v/d")
    await w.fs.unlink(d.ino, "a")
    w.store.put("b", "data/d/late", b"late")              # another client's, not listed here
    w.store.put("b", "data/d/bad//name", b"x")            # one no view can show: does not count
    assert await errno_of(w.fs.rmdir(top.ino, "d")) == errno.ENOTEMPTY
    assert w.fs.views[0].listing.deltas >= 1                       # it asked for a refresh
    w.sync_handler("v", "data/d/late")                     # the handler learns of it
    await w.fs.listings.refresh_now(w.fs.views[0])
    assert await w.names("v/d") == ["late"]
    await w.fs.unlink(d.ino, "late")
    lists = w.store.lists
    await w.fs.rmdir(top.ino, "d")                          # only what this mount removed: empty
    assert w.store.lists > lists and await w.names("v") == []
    tagged = await w.path("tagged")
    w.store.put("b", "data/e/untagged", b"u")              # the tagged view would not show it
    await w.fs.mkdir(tagged.ino, "e")
    await w.fs.rmdir(tagged.ino, "e")


async def test_eager_rmdir_does_not_count_the_deletes_it_queued(make_world):
    w = make_world(wview(), eager=True)
    for i in range(3):
        w.add("v", f"data/d/f{i}", b"x")
        w.add("v", f"data/d/s/g{i}", b"x")
    await w.start()
    top, d, sub = await w.path("v"), await w.path("v/d"), await w.path("v/d/s")
    for i in range(3):                                      # rm -r: bottom-up
        await w.fs.unlink(sub.ino, f"g{i}")
    await w.fs.rmdir(d.ino, "s")
    for i in range(3):
        await w.fs.unlink(d.ino, f"f{i}")
    assert w.obj("v", "data/d/f0") is not None             # the DELETEs wait in their queue
    lists = w.store.lists
    await w.fs.rmdir(top.ino, "d")
    assert await w.names("v") == []
    assert w.store.lists == lists + 1                       # d/s/ was checked a moment ago


async def test_wait_for_handler_reports_what_it_has_not_seen_and_forgets_what_it_has(make_world):
    w = make_world(wview())
    w.add("v", "data/old", b"old")
    await w.start()
    await w.write("v/new", b"new")
    top = await w.path("v")
    await w.fs.unlink(top.ino, "old")
    lines = await w.fs.wait_for_handler(1.0)
    assert sorted(line.split(":")[0] for line in lines) == ["b/data/new", "b/data/old"]
    assert "has not seen" in lines[0]
    w.sync_handler("v", "data/new")
    w.sync_handler("v", "data/old")
    assert await w.fs.wait_for_handler(1.0) == []
    assert len(w.store.written) == 0                        # confirmed: forgotten
