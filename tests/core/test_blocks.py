"""The sparse, block-based read cache against the fake S3: which ranged GETs a read costs,
shared and prefetched fetches, eviction by block, and failures between and within blocks."""
from __future__ import annotations

import errno
import os

import pytest
import trio
import trio.testing

from delvefs.client.mount.errors import FsError

from .conftest import view

pytestmark = pytest.mark.trio

B = 4096  # the tests' block size


def small_blocks(w, *, window_max: int = 8 * B):
    c = w.cache
    c.block_size, c.max_get, c.whole_size = B, 4 * B, B
    w.fs.readahead.window_start, w.fs.readahead.window_max = 2 * B, window_max
    w.fs.readahead.sequential_after = 2 * B
    return w


def blob(n: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


async def world(make_world, size=64 * B, window_max=8 * B, **kw):
    w = small_blocks(make_world(**kw), window_max=window_max)
    data = blob(size)
    w.add("v", "data/big", data)
    await w.start()
    node = await w.path("v/big")
    return w, data, node


async def test_a_read_fetches_only_its_blocks_and_a_cached_block_costs_nothing(make_world):
    w, data, node = await world(make_world)
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 10 * B + 100, 50) == data[10 * B + 100:10 * B + 150]
    assert w.store.gets == [("data/big", 10 * B, 11 * B)]
    assert w.store.calls["head"] == 0                  # the listing's ETag pins the GET
    assert await w.fs.read(fh, 10 * B, B) == data[10 * B:11 * B]
    assert await w.fs.read(fh, 10 * B + 7, 9) == data[10 * B + 7:10 * B + 16]
    assert len(w.store.gets) == 1                      # cached: no request
    assert await w.fs.read(fh, 63 * B + 10, B) == data[63 * B + 10:]   # the tail only
    assert w.store.gets[1:] == [("data/big", 63 * B, 64 * B)]
    await w.fs.release(fh)
    assert w.cache.bytes == 2 * B
    assert await w.read("v/big") == data               # the rest, in GETs of max_get
    assert all(end - start <= 4 * B for _, start, end in w.store.gets)
    assert sum(end - start for _, start, end in w.store.gets) == len(data)


async def test_a_small_object_is_one_get_on_its_first_read(make_world):
    w = small_blocks(make_world())
    w.add("v", "data/s", b"x" * (B - 10))
    await w.start()
    node = await w.path("v/s")
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 100, 10) == b"x" * 10
    assert w.store.gets == [("data/s", 0, B - 10)]
    await w.fs.release(fh)


async def test_concurrent_readers_share_one_fetch(make_world):
    w, data, node = await world(make_world)
    w.store.gate = trio.Event()
    got = []

    async def reader(off, n):
        fh, _ = await w.fs.open(node.ino, 0)
        got.append(await w.fs.read(fh, off, n))
        await w.fs.release(fh)
    async with trio.open_nursery() as n:
        n.start_soon(reader, 5 * B, 100)
        n.start_soon(reader, 5 * B + 200, 3000)
        await trio.testing.wait_all_tasks_blocked()
        w.store.gate.set()
    assert sorted(got) == sorted([data[5 * B:5 * B + 100], data[5 * B + 200:5 * B + 3200]])
    assert w.store.gets == [("data/big", 5 * B, 6 * B)]


async def test_a_cancelled_read_does_not_abort_the_fetch_another_reader_waits_for(make_world):
    w, data, node = await world(make_world)
    fh1, _ = await w.fs.open(node.ino, 0)
    fh2, _ = await w.fs.open(node.ino, 0)
    await w.fs.read(fh1, 10 * B, 1)   # both handles have the entry
    await w.fs.read(fh2, 10 * B, 1)
    w.store.gate = trio.Event()
    got = []

    async def second():
        got.append(await w.fs.read(fh2, 20 * B, B))
    async with trio.open_nursery() as n:
        with trio.CancelScope() as first:
            n.start_soon(second)
            async with trio.open_nursery() as inner:
                inner.start_soon(w.fs.read, fh1, 20 * B, B)
                await trio.testing.wait_all_tasks_blocked()
                first.cancel()                      # the first reader gives up
        w.store.gate.set()
    assert got == [data[20 * B:21 * B]]
    assert [g for g in w.store.gets if g[1] == 20 * B] == [("data/big", 20 * B, 21 * B)]
    for fh in (fh1, fh2):
        await w.fs.release(fh)


async def test_sequential_reads_prefetch_a_growing_window_and_a_jump_resets_it(make_world):
    w, data, node = await world(make_world, size=256 * B, window_max=16 * B)
    fh, _ = await w.fs.open(node.ino, 0)
    parts = []
    for off in range(0, 96 * B, B):
        parts.append(await w.fs.read(fh, off, B))
        await trio.testing.wait_all_tasks_blocked()
    assert b"".join(parts) == data[:96 * B]
    lengths = [end - start for _, start, end in w.store.gets]
    assert max(lengths) == 4 * B                        # coalesced up to max_get
    assert len(w.store.gets) < 96 // 2                  # far fewer GETs than reads
    ahead = max(end for _, _, end in w.store.gets)
    assert 96 * B < ahead <= 96 * B + 16 * B            # prefetched ahead, bounded by the window
    before = len(w.store.gets)
    assert await w.fs.read(fh, 200 * B, 100) == data[200 * B:200 * B + 100]    # a jump
    await trio.testing.wait_all_tasks_blocked()
    assert w.store.gets[before:] == [("data/big", 200 * B, 201 * B)]      # no prefetch
    await w.fs.release(fh)


async def test_closing_the_handle_cancels_its_prefetch(make_world):
    w, data, node = await world(make_world, size=256 * B)
    fh, _ = await w.fs.open(node.ino, 0)
    for off in range(0, 8 * B, B):
        await w.fs.read(fh, off, B)
    await trio.testing.wait_all_tasks_blocked()
    w.store.gate = trio.Event()          # GETs from now on wait
    h = w.fs.handles.files[fh]
    for off in range(8 * B, 64 * B, B):  # cached by the read-ahead, which starts more
        assert await w.fs.read(fh, off, B) == data[off:off + B]
        pending = w.fs.readahead.pending(h.stream)
        if pending:
            break
    assert pending
    await w.fs.release(fh)
    w.store.gate.set()
    await trio.testing.wait_all_tasks_blocked()
    assert all(f.finished and f.cancelled for f in pending)
    assert w.cache.got < 256 * B and w.cache.fetching == 0


async def test_eviction_is_by_block_least_recently_used(make_world):
    w, data, node = await world(make_world, cache_limit=4 * B)
    fh, _ = await w.fs.open(node.ino, 0)
    for block in (1, 3, 5, 7):
        await w.fs.read(fh, block * B, 10)
    await w.fs.read(fh, B, 10)           # block 1 used again: 3 is the oldest now
    await w.fs.read(fh, 9 * B, 10)
    assert w.cache.bytes <= 4 * B and w.cache.evictions == 1
    n = len(w.store.gets)
    await w.fs.read(fh, B, 10)           # kept
    assert len(w.store.gets) == n
    assert await w.fs.read(fh, 3 * B, 10) == data[3 * B:3 * B + 10]    # evicted: fetched again
    assert w.store.gets[n:] == [("data/big", 3 * B, 4 * B)]
    entry = w.fs.handles.files[fh].entry
    assert os.stat(entry.path).st_blocks * 512 <= 6 * B    # evicted blocks are holes
    await w.fs.release(fh)


async def test_a_read_larger_than_the_cache_is_byte_exact(make_world):
    w, data, node = await world(make_world, cache_limit=2 * B)
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 3, 20 * B) == data[3:3 + 20 * B]   # pinned while it runs
    parts = [await w.fs.read(fh, off, 3000) for off in range(0, len(data), 3000)]
    assert b"".join(parts) == data                    # the cache fills up mid-read
    await w.fs.release(fh)
    assert w.cache.bytes <= 2 * B


async def test_eviction_never_takes_a_dirty_files_bytes(make_world):
    w = small_blocks(make_world(view("v", writable=True), cache_limit=4 * B))
    data = blob(32 * B)
    w.add("v", "data/big", data)
    await w.start()
    fh, node = await w.open_write("v/new", os.O_WRONLY | os.O_CREAT)
    await w.fs.write(fh, 0, b"d" * (3 * B))
    assert await w.read("v/big") == data              # clean blocks come and go
    assert w.cache.get("b", "data/new").dirty
    await w.close(fh)
    assert w.obj("v", "data/new")["data"] == b"d" * (3 * B)


async def test_object_changed_between_two_block_reads_is_eio_never_mixed(make_world):
    w, data, node = await world(make_world)
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 0, B) == data[:B]
    w.store.put("b", "data/big", b"N" * len(data))    # replaced in S3, same size
    with pytest.raises(FsError) as e:
        await w.fs.read(fh, 30 * B, B)
    assert e.value.errno == errno.EIO
    assert await w.fs.read(fh, 0, B) == data[:B]      # what it has stays readable
    await w.fs.release(fh)
    # a new open asks S3 in one conditional GET (If-None-Match: the cached copy is of a
    # version it no longer has); its answer, the new version's first block, is cached as
    # that version; the name moves to it, and its reads find that block there: no HEAD
    gets = len(w.store.gets)
    assert await w.read("v/big") == b"N" * len(data)
    assert w.store.calls["head"] == 0 and w.store.calls["revalidate"] == 1
    assert all(start >= B for _, start, _ in w.store.gets[gets:])


async def test_old_handles_keep_their_version_when_the_entry_moves(make_world):
    w, data, node = await world(make_world)
    old, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(old, 0, 2 * B) == data[:2 * B]
    w.store.put("b", "data/big", b"N" * len(data))
    assert await w.read("v/big") == b"N" * len(data)   # the entry moved to the new version
    assert await w.fs.read(old, B, B) == data[B:2 * B]  # its own file and entry
    with pytest.raises(FsError) as e:
        await w.fs.read(old, 40 * B, B)
    assert e.value.errno == errno.EIO
    await w.fs.release(old)


async def test_s3_failing_mid_block_is_eio_and_a_later_read_retries(make_world):
    w, data, node = await world(make_world)
    fh, _ = await w.fs.open(node.ino, 0)
    await w.fs.read(fh, 0, 1)
    w.store.fail_at = 12 * B + 1000                     # the connection drops mid-block
    with pytest.raises(FsError) as e:
        await w.fs.read(fh, 12 * B, 2 * B)
    assert e.value.errno == errno.EIO
    assert not w.fs.handles.files[fh].entry.present.intersects(12 * B, 13 * B)   # never half a block
    w.store.fail_at = None
    assert await w.fs.read(fh, 12 * B, 2 * B) == data[12 * B:14 * B]
    await w.fs.release(fh)


async def test_a_deleted_object_is_enoent_on_first_read(make_world):
    w, data, node = await world(make_world)
    w.store.objects.pop(("b", "data/big"))
    fh, _ = await w.fs.open(node.ino, 0)
    with pytest.raises(FsError) as e:
        await w.fs.read(fh, 0, B)
    assert e.value.errno == errno.ENOENT
    await w.fs.release(fh)


async def test_a_dirty_entry_gets_only_the_bytes_still_missing_never_over_a_write(tmp_path):
    from delvefs.client.mount.cache.cacheentry import CacheEntry
    from delvefs.client.mount.cache.datacache import DataCache
    from delvefs.client.mount.cache.ranges import RangeSet

    from .fakes import FakeStore
    store = FakeStore()
    data = blob(8 * B)
    etag = store.put("b", "k", data)["etag"]
    cache = DataCache(tmp_path, block_size=B, max_get=4 * B)
    entry = CacheEntry("b", "k", str(cache.dir / "w-test"))
    with open(entry.path, "wb") as f:
        f.truncate(len(data))
    entry.size, entry.dirty = len(data), True
    entry.present, entry.source, entry.source_len = RangeSet(), ("b", "k", etag), len(data)
    cache.add(entry)
    store.gate = trio.Event()
    async with trio.open_nursery() as n:
        n.start_soon(cache.ensure, store, entry, 0, len(data))
        await trio.testing.wait_all_tasks_blocked()
        fd = os.open(entry.path, os.O_WRONLY)       # a writer, while the GETs are out
        os.pwrite(fd, b"W" * 100, B + 10)
        os.close(fd)
        entry.present.add(B + 10, B + 110)
        store.gate.set()
    with open(entry.path, "rb") as f:
        assert f.read() == data[:B + 10] + b"W" * 100 + data[B + 110:]
    assert entry.present.covers(0, len(data))


async def test_reads_count_as_cache_hits_or_misses_with_their_bytes(make_world):
    # (the mount's metrics: delvefs_mount_cache_reads_total and _read_bytes_total)
    w, data, node = await world(make_world)
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 10 * B, 100) == data[10 * B:10 * B + 100]  # the first: a GET
    assert await w.fs.read(fh, 10 * B + 100, 200) == data[10 * B + 100:10 * B + 300]  # that block
    assert await w.fs.read(fh, 64 * B, B) == b""  # past the end: no read counted
    c = w.cache
    assert (c.misses, c.miss_bytes, c.hits, c.hit_bytes) == (1, 100, 1, 200)
    await w.fs.release(fh)
    await w.read("v/big")  # a new handle's first read: the blocks still missing come from S3
    assert (c.misses, c.hits) == (2, 1) and c.miss_bytes == 100 + len(data)
