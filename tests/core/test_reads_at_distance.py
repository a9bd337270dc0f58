"""Reads that cost as few round trips and bytes as a distant S3 needs, against the fake S3:
an uncached file's first byte is one GET (no HEAD), a revalidation past ttl one conditional
GET (304, or the new version's first block), random reads fetch about what they read,
sequential reads grow a read-ahead window to many GETs in flight, and an open fetches the
index files next to a data file (``prefetch``)."""
from __future__ import annotations

import os
import random

import pytest
import trio
import trio.testing

from .conftest import view

pytestmark = pytest.mark.trio

KiB, MiB = 1 << 10, 1 << 20
TTL = 2.0


def fetched(w) -> int:
    """Bytes the ranged GETs asked for so far."""
    return sum(end - start for _, start, end in w.store.gets)


async def test_an_uncached_open_and_first_read_is_one_get_and_no_head(make_world):
    w = make_world()
    data = os.urandom(8 * MiB)
    w.add("v", "data/big", data)
    w.add("v", "data/small", b"small bytes")
    await w.start()
    node = await w.path("v/big")
    fh, _ = await w.fs.open(node.ino, 0)
    assert w.store.gets == [] and w.store.calls["head"] == 0   # the open asks nothing
    assert await w.fs.read(fh, 3 * MiB + 5, 100) == data[3 * MiB + 5:3 * MiB + 105]
    assert len(w.store.gets) == 1                               # one ranged GET ...
    assert w.store.calls["head"] == 0 and w.store.calls["revalidate"] == 0   # ... and nothing else
    await w.fs.release(fh)
    assert await w.read("v/small") == b"small bytes"
    assert len(w.store.gets) == 2 and w.store.calls["head"] == 0


async def test_a_copy_past_its_ttl_is_revalidated_by_one_conditional_get_never_a_head(
        make_world, mock_clock):
    w = make_world(view("v", ttl=TTL))
    w.add("v", "data/a", b"version one")
    await w.start()
    assert await w.read("v/a") == b"version one"
    mock_clock.jump(TTL + 1)
    assert await w.read("v/a") == b"version one"                # 304: confirmed
    assert w.store.calls["revalidate"] == 1 and w.store.calls["head"] == 0
    assert w.store.calls["download"] == 1                       # not fetched again
    mock_clock.jump(TTL + 1)
    w.store.put("b", "data/a", b"version two, longer")           # S3 ahead of the listing
    assert await w.read("v/a") == b"version two, longer"        # its answer brought the bytes
    assert w.store.calls["revalidate"] == 2 and w.store.calls["head"] == 0
    assert w.store.calls["download"] == 1                       # no second request for them
    assert (await w.path("v/a")).size == len(b"version two, longer")


async def test_random_reads_fetch_about_what_they_read(make_world):
    w = make_world()
    data = os.urandom(64 * MiB)
    w.add("v", "data/x.bam", data)
    await w.start()
    node = await w.path("v/x.bam")
    fh, _ = await w.fs.open(node.ino, 0)
    rng = random.Random(7)
    read = 0
    for _ in range(60):  # a region query's pattern: seek, then a few 32 KiB reads on
        off = rng.randrange(0, len(data) - MiB)
        for _ in range(rng.randint(1, 4)):
            assert await w.fs.read(fh, off, 32 * KiB) == data[off:off + 32 * KiB]
            await trio.testing.wait_all_tasks_blocked()
            off += 32 * KiB
            read += 32 * KiB
    await w.fs.release(fh)
    assert fetched(w) <= 2 * read, (fetched(w), read)


async def test_purely_random_reads_fetch_no_read_ahead(make_world):
    w = make_world()
    data = os.urandom(32 * MiB)
    w.add("v", "data/big", data)
    await w.start()
    node = await w.path("v/big")
    fh, _ = await w.fs.open(node.ino, 0)
    rng = random.Random(3)
    for _ in range(50):
        off = rng.randrange(MiB, len(data) - MiB)
        assert await w.fs.read(fh, off, 32 * KiB) == data[off:off + 32 * KiB]
        await trio.testing.wait_all_tasks_blocked()
    await w.fs.release(fh)
    assert len(w.store.gets) == 50
    assert fetched(w) <= 50 * (32 + 4) * KiB                     # its pages only


async def test_sequential_reads_grow_the_window_to_many_gets_in_flight(make_world, mock_clock):
    mock_clock.autojump_threshold = 0
    w = make_world()
    data = os.urandom(96 * MiB)
    w.add("v", "data/big", data)
    await w.start()
    w.cache.max_get = 4 * MiB
    w.fs.readahead.window_max = 32 * MiB        # 8 GETs of 4 MiB in flight at the top
    flying = most = 0
    get_range = w.store.get_range

    async def distant(*args, **kwargs):           # every GET: a round trip of 30 ms first
        nonlocal flying, most
        flying += 1
        most = max(most, flying)
        try:
            await trio.sleep(0.03)
            await get_range(*args, **kwargs)
        finally:
            flying -= 1
    w.store.get_range = distant
    node = await w.path("v/big")
    fh, _ = await w.fs.open(node.ino, 0)
    parts = []
    for off in range(0, len(data), 128 * KiB):   # the kernel's reads of a sequential reader
        parts.append(await w.fs.read(fh, off, 128 * KiB))
    await w.fs.release(fh)
    assert b"".join(parts) == data
    assert most >= 8                              # the window filled with parallel GETs
    assert fetched(w) == len(data)                # no byte twice, none beyond the end
    lengths = [end - start for _, start, end in w.store.gets]
    assert lengths[0] <= 128 * KiB and max(lengths) == 4 * MiB   # small first, then max_get


async def test_an_open_fetches_the_index_files_next_to_a_data_file_whole(make_world):
    w = make_world()
    bam, bai, csi = os.urandom(8 * MiB), os.urandom(3 * MiB), os.urandom(100 * KiB)
    w.add("v", "data/x.bam", bam)
    w.add("v", "data/x.bam.bai", bai)
    w.add("v", "data/x.csi", csi)
    w.add("v", "data/y.bam", bam)
    await w.start()
    node = await w.path("v/x.bam")
    fh, _ = await w.fs.open(node.ino, 0)
    await trio.testing.wait_all_tasks_blocked()
    keys = sorted({key for key, _, _ in w.store.gets})
    assert keys == ["data/x.bam.bai", "data/x.csi"]          # nothing of y.bam, nor of x.bam
    gets = len(w.store.gets)
    assert await w.read("v/x.bam.bai") == bai                 # read whole from the cache
    assert await w.read("v/x.csi") == csi
    assert len(w.store.gets) == gets
    await w.fs.release(fh)


async def test_prefetch_off_fetches_nothing_on_open(make_world):
    w = make_world(prefetch="off")
    w.add("v", "data/x.bam", b"bam")
    w.add("v", "data/x.bam.bai", b"bai")
    await w.start()
    fh, _ = await w.fs.open((await w.path("v/x.bam")).ino, 0)
    await trio.testing.wait_all_tasks_blocked()
    assert w.store.gets == []
    await w.fs.release(fh)


async def test_prefetch_dir_fetches_the_first_block_of_the_directorys_other_files(make_world):
    w = make_world(prefetch="dir")
    big = os.urandom(8 * MiB)
    for i in range(5):
        w.add("v", f"data/f{i}.bin", big)
    await w.start()
    fh, _ = await w.fs.open((await w.path("v/f0.bin")).ino, 0)
    await trio.testing.wait_all_tasks_blocked()
    first = max(w.cache.block_size, w.cache.whole_size)
    assert sorted(w.store.gets) == [(f"data/f{i}.bin", 0, first) for i in range(1, 5)]
    await w.fs.release(fh)
    gets = len(w.store.gets)
    fh, _ = await w.fs.open((await w.path("v/f3.bin")).ino, 0)
    assert await w.fs.read(fh, 0, 64 * KiB) == big[:64 * KiB]  # from the cache
    await trio.testing.wait_all_tasks_blocked()
    assert len(w.store.gets) == gets                           # once per directory and ttl
    await w.fs.release(fh)
