"""The kernel's writeback cache (eager mounts): the kernel keeps the size and mtime of an
inode it holds, so a file whose object another writer changed gets a new inode."""
from __future__ import annotations

import errno
import os

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from delvefs.client.mount.errors import FsError

from .conftest import view
from .fakes import held

pytestmark = pytest.mark.trio


async def test_a_file_changed_by_others_gets_a_new_inode_under_the_writeback_cache(
        make_world, mock_clock):
    w = make_world(view("v", writable=True), writeback_cache=True)
    w.add("v", "data/a", b"old")
    await w.start()
    a = await w.path("v/a")                       # the kernel holds it
    fh, _ = await w.fs.open(a.ino, 0)
    assert await w.fs.read(fh, 0, 100) == b"old"
    top = await w.path("v")
    w.add("v", "data/a", b"new content")          # another writer; the handler reports it
    mock_clock.jump(3)
    b = await w.path("v/a")
    assert b.ino != a.ino and b.size == len(b"new content")
    assert a.gone and w.fs.table.get(a.ino) is a  # the kernel may still ask about it
    assert (top.ino, "a") in w.notifier.entries   # its dentry goes: the next lookup is b
    assert await w.fs.read(fh, 0, 100) == b"old"  # an open descriptor keeps its version
    await w.fs.release(fh)
    assert await w.read("v/a") == b"new content"
    w.add("v", "data/never-looked-up", b"1")
    mock_clock.jump(3)
    n = await w.path("v/never-looked-up")
    w.fs.forget([(n.ino, n.nlookup)])             # the kernel does not hold it: kept as is
    w.add("v", "data/never-looked-up", b"22")
    mock_clock.jump(3)
    assert (await w.path("v/never-looked-up")).ino == n.ino and n.size == 2


async def test_a_file_written_through_a_handle_keeps_its_inode(make_world, mock_clock):
    w = make_world(view("v", writable=True), writeback_cache=True)
    w.add("v", "data/a", b"base")
    await w.start()
    fh, a = await w.open_write("v/a", 2)           # O_RDWR: its writes must land in its file
    await w.fs.write(fh, 0, b"mine")
    await w.fs.fsync(fh)                           # uploaded; the handle stays open
    w.add("v", "data/a", b"someone else's")        # past the overlay's bound
    mock_clock.jump(w.settings.overlay_bound + 3)
    assert (await w.path("v/a")) is a and not a.gone
    await w.fs.write(fh, 4, b"!")
    with pytest.raises(FsError) as e:
        await w.close(fh)                          # based on its own upload: a conflict copy
    assert e.value.errno == errno.EIO
    assert w.obj("v", "data/a")["data"] == b"someone else's"


async def test_the_change_of_an_earlier_upload_of_the_same_content_retires_nothing(
        make_world, mock_clock):
    """Uploads x, yy, x: the changes of the first two (reported one by one, or only the
    newest of them) never show yy; the third one's retires the overlay."""
    for reported in ([0, 1], [1]):
        w = make_world(view("v", writable=True))
        await w.start()
        etags = []
        for data in (b"x", b"yy", b"x"):
            await w.write("v/f", data)
            etags.append(w.obj("v", "data/f")["etag"])
        for i in reported:
            w.handler.put("v", "data/f", len((b"x", b"yy")[i]), etags[i])
            mock_clock.jump(3)
            assert (await w.path("v/f")).size == 1
        assert "data/f" in w.fs.views[0].overlay
        w.handler.put("v", "data/f", 1, etags[2])
        mock_clock.jump(3)
        assert (await w.path("v/f")).size == 1
        assert "data/f" not in w.fs.views[0].overlay
        w.fs.close()


async def test_an_open_that_finds_s3_ahead_leaves_a_new_inode_for_the_next_one(
        make_world, mock_clock):
    w = make_world(view("v", writable=True), writeback_cache=True)
    w.add("v", "data/a", b"v1")
    await w.start()
    assert await w.read("v/a") == b"v1"
    a = await w.path("v/a")
    w.store.put("b", "data/a", b"version 2")       # the handler has not told the mount yet
    mock_clock.jump(2.5)
    w.fs.views[0].listing.fresh_at = mock_clock.current_time()  # the listing "fresh" and old
    with pytest.raises(FsError) as e:              # the HEAD after ttl notices it; the kernel
        await w.fs.open(a.ino, 0)                   # holds the old size: another inode, and
    assert e.value.errno == errno.ESTALE             # the kernel looks the name up again
    b = await w.path("v/a")
    assert b.ino != a.ino and b.size == len(b"version 2") and a.gone
    assert (a.parent.ino, "a") in w.notifier.entries
    fh, _ = await w.fs.open(b.ino, 0)
    assert await w.fs.read(fh, 0, 100) == b"version 2"
    await w.fs.release(fh)


async def test_a_change_of_the_same_size_keeps_the_inode_and_drops_its_pages(
        make_world, mock_clock):
    w = make_world(view("v", writable=True), writeback_cache=True)
    w.add("v", "data/a", b"AAAA")
    await w.start()
    assert await w.read("v/a") == b"AAAA"
    a = await w.path("v/a")
    w.add("v", "data/a", b"BBBB")                  # a copy or a rewrite: the size the kernel has
    mock_clock.jump(3)
    assert (await w.path("v/a")) is a and a.ino in w.notifier.inodes
    assert await w.read("v/a") == b"BBBB"


@pytest.mark.parametrize("writeback_cache", [False, True])
async def test_a_second_reader_of_an_inode_reads_the_version_the_first_one_reads(
        make_world, mock_clock, writeback_cache):
    # S3 changed behind the listing: a second open of the inode the first reader holds must
    # not bring the new version's bytes into that inode's pages (the kernel serves the
    # first descriptor from them too); the name shows the new version on another inode
    w = make_world(view("v", ttl=1), writeback_cache=writeback_cache)
    w.add("v", "data/a", b"old")
    await w.start()
    a = await w.path("v/a")
    first, _ = await w.fs.open(a.ino, 0)
    assert await w.fs.read(first, 0, 100) == b"old"
    w.store.put("b", "data/a", b"new content")     # the handler has not reported it yet
    mock_clock.jump(2)                             # past the ttl: the next fetch asks S3
    with pytest.raises(FsError) as e:             # S3 is asked: the name moves to a new inode
        await w.fs.open(a.ino, 0)
    assert e.value.errno == errno.ESTALE
    b = await w.path("v/a")                        # the kernel's second lookup
    assert b.ino != a.ino
    third, _ = await w.fs.open(b.ino, 0)
    assert await w.fs.read(third, 0, 100) == b"new content"
    assert await w.fs.read(first, 0, 100) == b"old"
    second, _ = await w.fs.open(a.ino, 0)         # the old inode again (a descriptor of it
    assert await w.fs.read(second, 0, 100) == b"old"  # forked, say): its version
    await w.fs.release(first)
    await w.fs.release(second)
    await w.fs.release(third)


@pytest.mark.parametrize("writeback_cache", [False, True])
async def test_a_descriptor_served_from_the_kernels_pages_never_reads_a_newer_version(
        make_world, mock_clock, writeback_cache):
    # the kernel served a descriptor the old version's pages (kept at open) without asking
    # the mount; the object changes and the name moves to a new inode; when the kernel
    # later asks for bytes of that descriptor, they are the old version's (held since the
    # open) — or EIO, never the new one's
    w = make_world(view("v", writable=True), writeback_cache=writeback_cache)
    w.add("v", "data/a", b"old version")
    await w.start()
    assert await w.read("v/a") == b"old version"
    a = await w.path("v/a")
    fh, keep = await w.fs.open(a.ino, 0)
    assert keep                                    # its pages are the kernel's to serve
    w.add("v", "data/a", b"new!")                  # another writer; the handler reports it
    mock_clock.jump(3)
    b = await w.path("v/a")
    assert b.ino != a.ino and a.gone
    assert await w.read("v/a") == b"new!"
    assert await w.fs.read(fh, 0, 100) == b"old version"
    await w.fs.release(fh)


@pytest.mark.parametrize("during", ["open", "first read"])
@pytest.mark.parametrize("writeback_cache", [False, True])
async def test_a_change_reported_while_an_open_asks_s3_leaves_the_old_inode_its_version(
        make_world, mock_clock, writeback_cache, during):
    # a descriptor reads the old version (from the kernel's pages, or not yet); another open
    # of the same inode asks S3 (its HEAD, or its first read's GET) and, while it waits, the
    # handler's change moves the name to a new inode: the old inode keeps its version (no
    # page drop, no new size) and the waiting descriptor never reads the new version through it
    w = make_world(view("v", ttl=1), writeback_cache=writeback_cache)
    w.add("v", "data/a", b"old version")
    await w.start()
    if during == "open":
        assert await w.read("v/a") == b"old version"
    a = await w.path("v/a")
    first, keep = await w.fs.open(a.ino, 0)
    assert keep == (during == "open")               # the kernel serves it the old pages
    if during == "open":                            # the open's revalidation waits
        w.add("v", "data/a", b"new, longer version")
        asked, answer = held(w.store, "get_if_changed")
    else:                                           # the first read's GET waits
        asked, answer = trio.Event(), trio.Event()
        w.store.gate = answer
    mock_clock.jump(2)                              # past the ttl: the next open asks S3
    outcome = {}

    async def second_open():
        try:
            fh, _ = await w.fs.open(a.ino, 0)
            try:
                outcome["read"] = await w.fs.read(fh, 0, 100)
            finally:
                await w.fs.release(fh)
        except FsError as exc:
            outcome["errno"] = exc.errno

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second_open)
        if during == "open":
            await asked.wait()
        else:
            await wait_all_tasks_blocked()
            w.add("v", "data/a", b"new, longer version")
            mock_clock.jump(2)
        b = await w.path("v/a")                     # the handler's change applied meanwhile
        assert b.ino != a.ino and a.gone
        answer.set()
    assert a.size == len(b"old version") and a.ino not in w.notifier.inodes
    # its own version, or an error (ESTALE: the kernel looks again; EIO: that version is
    # neither here nor in S3 any more), never the new one
    assert outcome in ({"errno": errno.ESTALE}, {"errno": errno.EIO}, {"read": b"old version"})
    if during == "open":
        assert await w.fs.read(first, 0, 100) == b"old version"
    await w.fs.release(first)
    assert await w.read("v/a") == b"new, longer version"


async def test_an_open_for_writing_of_an_inode_the_name_has_left_is_estale(make_world, mock_clock):
    # the kernel's name still points at the old inode (its invalidation is asynchronous)
    # when an open(O_RDWR|O_CREAT) comes: ESTALE makes the kernel look again and open the
    # file the name has now (ENOENT would fail an O_CREAT open of an existing name)
    w = make_world(view("v", writable=True), writeback_cache=True)
    w.add("v", "data/a", b"old")
    await w.start()
    a = await w.path("v/a")
    reader, _ = await w.fs.open(a.ino, 0)
    w.add("v", "data/a", b"another writer's")      # the handler reports it: a new inode
    mock_clock.jump(3)
    b = await w.path("v/a")
    assert b.ino != a.ino and a.gone
    with pytest.raises(FsError) as e:
        await w.fs.open(a.ino, os.O_RDWR)
    assert e.value.errno == errno.ESTALE
    fh, _ = await w.fs.open(b.ino, os.O_RDWR)      # the kernel's second try
    await w.fs.write(fh, 0, b"A")
    await w.close(fh)
    assert w.obj("v", "data/a")["data"] == b"Another writer's"   # (its first byte written)
    await w.fs.release(reader)


async def test_a_truncate_of_an_inode_the_name_has_left_is_estale(make_world, mock_clock):
    # truncate(2) by path: the kernel's name still points at the replaced inode; ESTALE
    # makes it look again (ENOENT would fail a truncate of an existing name)
    w = make_world(view("v", writable=True), writeback_cache=True)
    w.add("v", "data/a", b"old")
    await w.start()
    a = await w.path("v/a")
    w.add("v", "data/a", b"another writer's")      # the handler reports it: a new inode
    mock_clock.jump(3)
    b = await w.path("v/a")
    assert b.ino != a.ino and a.gone
    with pytest.raises(FsError) as e:
        await w.fs.setattr(a.ino, size=1)
    assert e.value.errno == errno.ESTALE
    await w.fs.setattr(b.ino, size=1)              # the kernel's second try
    assert w.obj("v", "data/a")["data"] == b"a"     # the new version, cut


@pytest.mark.parametrize("removal", ["unlink", "rename onto"])
async def test_a_truncate_or_trunc_open_of_a_file_removed_here_since_its_lookup_comes_first(
        make_world, removal):
    # another process's unlink (or rename onto the name) ran between this process's lookup
    # and its truncate(2) / open(O_TRUNC): they take effect on the removed file, before the
    # removal (as when they win the race on a local disk) — never ESTALE, which the kernel
    # passes on when the name changes again during its one retry; the name's file now is
    # untouched. An open without O_TRUNC needs the removed file's bytes: ESTALE as before.
    w = make_world(view("v", writable=True))
    w.add("v", "data/a", b"old a")
    w.add("v", "data/b", b"the b file")
    await w.start()
    top, a = await w.path("v"), await w.path("v/a")
    if removal == "unlink":
        await w.fs.unlink(top.ino, "a")
    else:
        await w.fs.rename(top.ino, "b", top.ino, "a")
    assert a.gone
    await w.fs.setattr(a.ino, size=2)                   # truncate(2): done, nothing to keep
    fh, _ = await w.fs.open(a.ino, os.O_RDWR | os.O_TRUNC)
    assert (await w.fs.getattr(a.ino)).size == 0
    await w.fs.write(fh, 0, b"written after")
    assert await w.fs.read(fh, 0, 100) == b"written after"
    assert (await w.fs.getattr(a.ino)).size == len(b"written after")
    await w.close(fh)
    with pytest.raises(FsError) as e:
        await w.fs.open(a.ino, os.O_RDWR)
    assert e.value.errno == errno.ESTALE
    if removal == "unlink":
        assert w.obj("v", "data/a") is None and await w.path("v/a") is None
    else:
        assert w.obj("v", "data/a")["data"] == b"the b file"
        assert await w.read("v/a") == b"the b file"


async def test_the_handlers_news_of_a_renames_own_copy_leaves_the_replaced_file_alone(
        make_world, mock_clock):
    # a file fsync'd while open for writing (clean, still written through its descriptor)
    # is replaced by a rename; the handler reports the rename's copy of the new file at the
    # name while the rename still runs: that news must not become the replaced file's size
    # (its descriptor then read EOF inside its own bytes)
    w = make_world(view("v", writable=True, ttl=1))
    w.add("v", "data/f", b"o" * 200_000)
    w.add("v", "data/g", b"g" * 3_000)
    await w.start()
    top = await w.path("v")
    fh, f = await w.open_write("v/f", os.O_RDWR)
    await w.fs.write(fh, 150_000, b"w" * 4_000)
    await w.fs.fsync(fh)
    w.sync_handler("v", "data/f")
    await w.path("v/g")
    deleting, go = held(w.store, "delete")             # the copy is made; the source waits
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.fs.rename, top.ino, "g", top.ino, "f")
        await deleting.wait()
        w.sync_handler("v", "data/f")                  # the copy's event: 3,000 bytes at f
        mock_clock.jump(2)
        await w.fs.getattr(top.ino)                    # a refresh while the rename runs
        await w.fs.lookup(top.ino, "f")
        go.set()
    assert f.gone and f.size == 200_000
    assert await w.fs.read(fh, 120_000, 10) == b"o" * 10
    assert await w.fs.read(fh, 150_000, 10) == b"w" * 10
    await w.close(fh)
    assert await w.read("v/f") == b"g" * 3_000


@pytest.mark.parametrize("eager", [False, True])
async def test_a_descriptor_whose_first_read_races_a_rewrite_here_reads_the_file_as_it_is(
        make_world, eager):
    # a descriptor opened where the kernel holds the old version's pages; its first read's
    # GET (pinned to that version) is under way when another process of this mount opens
    # the same file with O_TRUNC, writes and closes it: the same inode, whose pages the
    # kernel dropped — the read gets the file as it is now, never EIO for the old version
    w = make_world(view("v", writable=True), eager=eager)
    w.add("v", "data/a", b"old " * 1000)
    await w.start()
    assert await w.read("v/a") == b"old " * 1000     # the kernel may keep its pages
    a = await w.path("v/a")
    w.cache.forget("b", "data/a")                     # evicted: the next read asks S3
    fh, keep = await w.fs.open(a.ino, os.O_RDONLY)
    assert keep
    w.store.gate = trio.Event()
    outcome = {}

    async def first_read():
        try:
            outcome["read"] = await w.fs.read(fh, 0, 1 << 20)
        except FsError as exc:
            outcome["read"] = exc.errno
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_read)
        await wait_all_tasks_blocked()
        wfh, _ = await w.open_write("v/a", os.O_WRONLY | os.O_TRUNC)
        await w.fs.write(wfh, 0, b"new")
        await w.close(wfh)
        w.store.gate.set()
    assert outcome["read"] in (b"new",), outcome
    await w.fs.release(fh)
