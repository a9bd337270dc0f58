"""The file system core against a fake handler and a fake S3: no kernel."""
from __future__ import annotations

import errno
import os
import logging

import pytest
import trio

from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs.inodes import ROOT_INODE, flat_key, flat_name

from .conftest import view

pytestmark = pytest.mark.trio


async def test_root_has_one_directory_per_view(make_world):
    w = await make_world(view("a"), view("b", bucket="other")).start()
    assert await w.names() == ["a", "b"]
    node = await w.path("a")
    mode, nlink, size, mtime_ns, timeout = w.fs.stat(node)
    assert mode & 0o170000 == 0o040000 and nlink == 2


async def test_tree_layout_virtual_directories(make_world):
    w = make_world(view("v", object="data/*"))
    for key in ["data/x.txt", "data/sub/y.txt", "data/sub/deeper/z.txt", "other/q.txt",
                "data/bad//empty-segment", "data/./dot", "data/" + "n" * 256]:
        w.add("v", key, b"1")
    await w.start()
    assert sorted(await w.names("v")) == ["sub", "x.txt"]
    assert sorted(await w.names("v/sub")) == ["deeper", "y.txt"]
    assert await w.names("v/sub/deeper") == ["z.txt"]
    f = await w.path("v/sub/deeper/z.txt")
    assert f.key == "data/sub/deeper/z.txt" and f.size == 1


async def test_flat_layout_names_are_reversible_and_collision_free(make_world):
    w = make_world(view("f", object="data/*", layout="flat"))
    keys = ["data/a/b", "data/a%2Fb", "data/plain", "data/%", "data/.."]
    for key in keys:
        w.add("f", key, key.encode())
    await w.start()
    names = await w.names("f")
    assert len(set(names)) == len(keys)
    assert all("/" not in n and n not in (".", "..") for n in names)
    for key in keys:
        name = flat_name(key[len("data/"):])
        assert flat_key(name) == key[len("data/"):]
        assert await w.read(f"f/{name}") == key.encode()


async def test_lookup_counts_and_forget(make_world):
    w = make_world()
    w.add("v", "data/a", b"x")
    await w.start()
    top = await w.path("v")
    a1 = await w.fs.lookup(top.ino, "a")
    a2 = await w.fs.lookup(top.ino, "a")
    assert a1 is a2 and a1.nlookup == 2 and w.fs.table.get(a1.ino) is a1
    w.fs.forget([(a1.ino, 1)])
    assert a1.nlookup == 1 and w.fs.table.get(a1.ino) is a1
    w.fs.forget([(a1.ino, 1)])
    assert a1.nlookup == 0 and w.fs.table.get(a1.ino) is None  # only kernel-known inodes
    again = await w.fs.lookup(top.ino, "a")
    assert again is a1 and again.ino == a1.ino  # still in the tree: same inode number
    w.fs.forget([(ROOT_INODE, 5)])
    assert w.fs.table.get(ROOT_INODE) is not None


async def test_readdirplus_counts_only_accepted_entries(make_world):
    w = make_world()
    for i in range(5):
        w.add("v", f"data/f{i}", b"")
    await w.start()
    top = await w.path("v")
    fh = await w.fs.opendir(top.ino)
    got = []
    await w.fs.readdir(fh, 0, lambda name, node, off: len(got) < 2 and (got.append((name, off)) or True))
    assert got == [("f0", 1), ("f1", 2)]
    counts = {n.name: n.nlookup for n in top.children.values()}
    assert counts == {"f0": 1, "f1": 1, "f2": 0, "f3": 0, "f4": 0}


async def test_deleted_file_lives_until_forget(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/a", b"abc")
    await w.start()
    a = await w.path("v/a")
    w.remove("v", "data/a")
    mock_clock.jump(3)
    top = await w.path("v")
    assert await w.fs.lookup(top.ino, "a") is None
    assert a.gone and w.fs.table.get(a.ino) is a
    assert (await w.fs.getattr(a.ino)).size == 3
    assert (top.ino, "a") in w.notifier.entries
    w.fs.forget([(a.ino, a.nlookup)])
    assert w.fs.table.get(a.ino) is None
    with pytest.raises(FsError) as e:
        await w.fs.getattr(a.ino)
    assert e.value.errno == errno.ENOENT


async def test_an_open_of_an_inode_removed_since_its_lookup_is_looked_up_again(make_world):
    # another process unlinks the file between this open's lookup and its OPEN: ESTALE,
    # so the kernel looks the name up again (ENOENT: a race lost, never an EIO at read)
    w = make_world(view("v", writable=True))
    w.add("v", "data/a", b"abc")
    await w.start()
    a = await w.path("v/a")
    top = await w.path("v")
    await w.fs.unlink(top.ino, "a")
    with pytest.raises(FsError) as e:
        await w.fs.open(a.ino, os.O_RDONLY)
    assert e.value.errno == errno.ESTALE and await w.fs.lookup(top.ino, "a") is None


async def test_readdir_offsets_stable_while_entries_change(make_world, mock_clock):
    w = make_world()
    for i in range(10):
        w.add("v", f"data/f{i:02d}", b"")
    await w.start()
    top = await w.path("v")
    fh = await w.fs.opendir(top.ino)
    seen, last = [], 0

    def take(limit):
        def reply(name, node, off):
            nonlocal last
            if len(batch) >= limit:
                return False
            batch.append(name)
            last = off
            return True
        return reply

    batch = []
    await w.fs.readdir(fh, 0, take(4))
    seen += batch
    # the directory changes between two readdir calls of one listing
    w.remove("v", "data/f05")
    w.remove("v", "data/f01")
    w.add("v", "data/f99", b"")
    w.add("v", "data/a00", b"")
    mock_clock.jump(3)
    await w.fs.lookup(top.ino, "f00")  # any operation refreshes the view
    batch = []
    await w.fs.readdir(fh, last, take(100))
    seen += batch
    assert seen == ["f00", "f01", "f02", "f03", "f04", "f06", "f07", "f08", "f09"]
    assert len(seen) == len(set(seen))
    # a rewind shows the new state
    batch = []
    await w.fs.readdir(fh, 0, take(100))
    assert sorted(batch) == ["a00", "f00", "f02", "f03", "f04", "f06", "f07", "f08", "f09", "f99"]
    w.fs.releasedir(fh)


async def test_listing_trusted_for_ttl_then_refreshed_by_delta(make_world, mock_clock):
    w = make_world(view("v", ttl=5))
    w.add("v", "data/old", b"")
    await w.start()
    top = await w.path("v")
    assert w.handler.calls["list"] == 0  # the root knows its views without asking
    await w.path("v/old")
    assert w.handler.calls["list"] == 1
    calls = dict(w.handler.calls)
    w.add("v", "data/new", b"n")
    mock_clock.jump(4)
    assert await w.fs.lookup(top.ino, "new") is None  # still trusted
    assert w.handler.calls == calls
    mock_clock.jump(1.5)
    node = await w.fs.lookup(top.ino, "new")
    assert node is not None and node.size == 1
    assert w.handler.calls["list"] == 1 and w.handler.calls["changes"] == calls["changes"] + 1
    assert (top.ino, "new") in w.notifier.entries  # drops the kernel's negative entry


async def test_large_listing_is_paged(make_world):
    w = make_world(page_size=10)
    for i in range(25):
        w.add("v", f"data/{i:03d}", b"")
    await w.start()
    assert len(await w.names("v")) == 25
    assert w.handler.calls["list"] == 3


async def test_410_relists_and_sweeps(make_world, mock_clock):
    w = make_world()
    for name in ["a", "b", "sub/c"]:
        w.add("v", f"data/{name}", b"")
    await w.start()
    b = await w.path("v/b")
    await w.path("v/sub/c")
    top = await w.path("v")
    w.remove("v", "data/b")
    w.remove("v", "data/sub/c")
    w.add("v", "data/d", b"dd")
    w.handler.truncate_log("v")
    mock_clock.jump(3)
    assert sorted(await w.names("v")) == ["a", "d"]
    assert w.handler.calls["list"] == 2
    assert b.gone
    assert (top.ino, "b") in w.notifier.entries and (top.ino, "sub") in w.notifier.entries
    assert (top.ino, "d") in w.notifier.entries


async def test_negative_lookups_answered_from_listing(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/present", b"")
    await w.start()
    top = await w.path("v/present")
    top = await w.path("v")
    calls = dict(w.handler.calls)
    for i in range(1000):
        assert await w.fs.lookup(top.ino, f"missing-{i}") is None
    assert w.handler.calls == calls
    assert w.store.calls == {"head": 0, "tags": 0, "download": 0, "revalidate": 0}


async def test_changed_object_updates_attributes_and_kernel_caches(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/a", b"old")
    await w.start()
    a = await w.path("v/a")
    assert await w.read("v/a") == b"old"
    w.add("v", "data/a", b"new content")
    mock_clock.jump(3)
    assert (await w.fs.getattr(a.ino)).size == len(b"new content")
    assert a.ino in w.notifier.inodes
    assert await w.read("v/a") == b"new content"


async def test_reads_are_local_after_first_download(make_world):
    w = make_world()
    w.add("v", "data/a", b"x" * 1000)
    await w.start()
    a = await w.path("v/a")
    fh, keep = await w.fs.open(a.ino, 0)
    assert not keep
    assert await w.fs.read(fh, 10, 5) == b"xxxxx"
    assert await w.fs.read(fh, 995, 100) == b"xxxxx"
    assert await w.fs.read(fh, 2000, 10) == b""
    await w.fs.release(fh)
    assert await w.read("v/a") == b"x" * 1000
    assert w.store.calls["download"] == 1 and w.store.calls["head"] == 0
    fh, keep = await w.fs.open(a.ino, 0)
    assert keep  # same ETag as the pages the kernel may hold
    await w.fs.release(fh)


async def test_etag_revalidation_after_ttl(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/a", b"v1")
    await w.start()
    assert await w.read("v/a") == b"v1"
    mock_clock.jump(1)
    assert await w.read("v/a") == b"v1"
    assert w.store.calls == {"head": 0, "tags": 0, "download": 1, "revalidate": 0}  # within ttl
    mock_clock.jump(2)
    assert await w.read("v/a") == b"v1"
    # one conditional GET (If-None-Match), same ETag: 304, no bytes, no HEAD
    assert w.store.calls == {"head": 0, "tags": 0, "download": 1, "revalidate": 1}
    # changed in S3 while the handler has not told us yet: the conditional GET notices it and
    # brings the new version's bytes along
    w.store.put("b", "data/a", b"version 2")
    mock_clock.jump(2.5)
    w.fs.views[0].listing.fresh_at = mock_clock.current_time()  # keep the listing "fresh" and old
    node = await w.path("v/a")
    assert node.etag != w.store.objects[("b", "data/a")]["etag"]
    assert await w.read("v/a") == b"version 2"
    assert w.store.calls["download"] == 1 and w.store.calls["revalidate"] == 2
    assert w.store.calls["head"] == 0
    assert node.size == len(b"version 2") and node.ino in w.notifier.inodes


async def test_object_changed_between_listing_and_download(make_world):
    w = make_world()
    w.add("v", "data/a", b"listed")
    await w.start()
    await w.path("v/a")
    w.store.put("b", "data/a", b"overwritten since")  # 412 on the pinned GET
    assert await w.read("v/a") == b"overwritten since"


async def test_deleted_object_reads_enoent(make_world):
    w = make_world()
    w.add("v", "data/a", b"listed")
    await w.start()
    a = await w.path("v/a")
    del w.store.objects[("b", "data/a")]
    fh, _ = await w.fs.open(a.ino, 0)
    with pytest.raises(FsError) as e:
        await w.fs.read(fh, 0, 10)
    assert e.value.errno == errno.ENOENT
    await w.fs.release(fh)


async def test_open_handle_keeps_its_version(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/a", b"AAAA")
    await w.start()
    a = await w.path("v/a")
    fh, _ = await w.fs.open(a.ino, 0)
    assert await w.fs.read(fh, 0, 2) == b"AA"
    w.add("v", "data/a", b"BBBB")
    mock_clock.jump(3)
    assert await w.read("v/a") == b"BBBB"  # a new open sees the new version
    assert await w.fs.read(fh, 2, 2) == b"AA"  # the old handle never mixes versions
    await w.fs.release(fh)


async def test_cache_eviction_lru_never_open(make_world):
    w = make_world(cache_limit=250)
    for name in "abcd":
        w.add("v", f"data/{name}", name.encode() * 100)
    await w.start()
    a = await w.path("v/a")
    fh, _ = await w.fs.open(a.ino, 0)
    assert await w.fs.read(fh, 0, 1) == b"a"      # a: open throughout
    assert await w.read("v/b") == b"b" * 100
    assert await w.read("v/c") == b"c" * 100      # 300 > 250: b (LRU, closed) goes
    assert w.cache.get("b", "data/b") is None and w.cache.get("b", "data/a") is not None
    assert await w.read("v/d") == b"d" * 100      # c goes, a stays (open)
    assert w.cache.get("b", "data/c") is None and w.cache.get("b", "data/a") is not None
    assert w.cache.bytes <= 250
    assert await w.fs.read(fh, 99, 10) == b"a"
    await w.fs.release(fh)
    assert w.cache.bytes <= 250
    assert await w.read("v/b") == b"b" * 100      # evicted files read correctly again
    assert w.cache.evictions >= 3


async def test_xattrs(make_world):
    w = make_world()
    obj = w.add("v", "data/a", b"x", tags={"stage": "raw"}, metadata={"Sample": "S1"})
    await w.start()
    a = await w.path("v/a")
    assert await w.fs.getxattr(a.ino, "user.stage") == b"raw"
    assert await w.fs.getxattr(a.ino, "user.meta.sample") == b"S1"
    assert await w.fs.getxattr(a.ino, "user.delvefs.etag") == obj["etag"].encode()
    assert await w.fs.getxattr(a.ino, "user.delvefs.bucket") == b"b"
    assert await w.fs.getxattr(a.ino, "user.delvefs.key") == b"data/a"
    for missing in ["user.nope", "user.meta.nope"]:
        with pytest.raises(FsError) as e:
            await w.fs.getxattr(a.ino, missing)
        assert e.value.errno == errno.ENODATA
    for unsupported in ["security.selinux", "system.posix_acl_access", "trusted.x"]:
        with pytest.raises(FsError) as e:
            await w.fs.getxattr(a.ino, unsupported)
        assert e.value.errno == errno.EOPNOTSUPP
    assert await w.fs.listxattr(a.ino) == ["user.delvefs.etag", "user.delvefs.bucket",
                                           "user.delvefs.key", "user.stage", "user.meta.sample"]
    heads = w.store.calls["head"]
    await w.fs.getxattr(a.ino, "user.stage")
    assert w.store.calls["head"] == heads  # cached for ttl
    with pytest.raises(FsError) as e:
        await w.fs.getxattr(ROOT_INODE, "user.stage")
    assert e.value.errno == errno.ENODATA


async def test_directory_shadows_file_of_same_name(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/a", b"file")
    w.add("v", "data/a/b", b"inner")
    await w.start()
    a = await w.path("v/a")
    assert a.is_dir and await w.names("v/a") == ["b"]
    w.remove("v", "data/a/b")
    mock_clock.jump(3)
    a = await w.path("v/a")
    assert not a.is_dir and await w.read("v/a") == b"file"


async def test_handler_down_is_eio_for_a_view_never_listed_only(make_world, mock_clock):
    w = make_world()
    w.add("v", "data/a", b"x")
    await w.start()
    top = await w.path("v")
    w.handler.fail = True
    with pytest.raises(FsError) as e:
        await w.fs.lookup(top.ino, "x")
    assert e.value.errno == errno.EIO
    w.handler.fail = False
    assert await w.names("v") == ["a"]
    w.handler.fail = True
    mock_clock.jump(3)  # the ttl is over: a listed view is served its last listing
    assert await w.names("v") == ["a"]
    assert await w.fs.lookup(top.ino, "x") is None


async def test_a_first_listing_waits_for_the_bucket_scan_its_waiters_share(make_world, mock_clock,
                                                                            caplog):
    mock_clock.autojump_threshold = 0
    caplog.set_level(logging.INFO, "delvefs.client.mount.fs.listings")
    w = make_world()
    w.add("v", "data/a", b"x")
    w.handler.scanning = True
    await w.start()
    top = await w.path("v")
    found = []

    async def look():
        found.append(await w.fs.lookup(top.ino, "a"))
    attempts = []
    list_page = w.handler.list_page

    async def counted(*args, **kw):
        attempts.append(trio.current_time())
        return await list_page(*args, **kw)
    w.handler.list_page = counted

    async def scan_done_after(seconds):
        await trio.sleep(seconds)
        w.handler.scan_listed = 1
        w.handler.scanning = False
    start = trio.current_time()
    async with trio.open_nursery() as nursery:  # waiters share one listing and its answer
        for _ in range(3):
            nursery.start_soon(look)
        nursery.start_soon(scan_done_after, 25)
    assert [n.size for n in found] == [1, 1, 1]
    assert trio.current_time() - start == pytest.approx(25, abs=0.1)
    assert len(attempts) == 3  # one listing, asking again each time the handler held it 10 s
    assert w.fs.views[0].listing.lists == 1
    waits = [r for r in caplog.records if "waiting for the event handler's first scan" in r.message]
    assert len(waits) == 2 and "bucket b" in waits[0].message
    assert (await w.path("v/a")).size == 1


async def test_write_open_refused_and_statfs(make_world):
    w = make_world()
    w.add("v", "data/a", b"")
    await w.start()
    a = await w.path("v/a")
    import os
    with pytest.raises(FsError) as e:
        await w.fs.open(a.ino, os.O_WRONLY)
    assert e.value.errno == errno.EROFS
    st = w.fs.statfs()
    assert st["f_namemax"] == 255 and st["f_bavail"] > 0


async def test_concurrent_first_reads_download_once(make_world):
    import trio
    w = make_world()
    w.add("v", "data/a", b"z" * 10)
    await w.start()
    await w.path("v/a")
    results = []

    async def reader():
        results.append(await w.read("v/a"))
    async with trio.open_nursery() as n:
        for _ in range(5):
            n.start_soon(reader)
    assert results == [b"z" * 10] * 5 and w.store.calls["download"] == 1


