"""Writes to a part of a big object: no download at open, a rebuild at close whose unchanged
ranges are copied server-side (delvefs.client.mount.fs.rebuild), the ranges log that survives a
kill, conflicts of a sparse file."""
from __future__ import annotations

import errno
import os
import random

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from delvefs.client.mount.errors import FsError
from delvefs.client.mount.fs import rebuild
from delvefs.client.mount.cache.ranges import RangeSet

from .conftest import view

MiB = 1 << 20
APPEND = os.O_WRONLY | os.O_APPEND
RW = os.O_RDWR


def wview(name="v", **kw):
    kw.setdefault("writable", True)
    return view(name, **kw)


def blob(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


# ------------------------------------------------------------ the plan, against a byte model

def check_plan(size, source_len, changed, **kw):
    parts = rebuild.plan(size, source_len, changed, **kw)
    min_part, max_parts = kw["min_part"], kw["max_parts"]
    source = bytes((i * 7 + 3) % 251 for i in range(source_len))
    local = bytearray(size)
    local[:min(size, source_len)] = source[:size]
    for s, e in changed:  # what differs from the source
        for i in range(s, min(e, size)):
            local[i] = (local[i] + 1) % 256
    rebuilt = b"".join(source[p.start:p.end] if p.copy else bytes(local[p.start:p.end])
                       for p in parts)
    assert rebuilt == bytes(local)
    assert len(parts) <= max_parts
    assert all(p.length >= min_part for p in parts[:-1])
    for p in parts:
        assert not p.copy or (p.end <= source_len and not changed.intersects(p.start, p.end))
    return parts


ranges = st.lists(st.tuples(st.integers(0, 300), st.integers(1, 40)), max_size=6)


@settings(max_examples=400, deadline=None)
@given(size=st.integers(1, 300), source_len=st.integers(0, 300), writes=ranges,
       min_part=st.integers(1, 25), upload=st.integers(1, 60), copy=st.integers(2, 90),
       max_parts=st.integers(1, 40))
def test_plan_rebuilds_the_file_within_the_part_rules(size, source_len, writes, min_part, upload,
                                                       copy, max_parts):
    changed = RangeSet([(s, s + n) for s, n in writes])
    check_plan(size, source_len, changed, min_part=min_part, upload_part=max(upload, min_part),
               copy_part=max(copy, 2 * min_part), max_parts=max_parts)


def test_plan_uploads_only_what_changed_at_real_sizes():
    gib = 1 << 30
    parts = rebuild.plan(gib + MiB, gib, RangeSet(), upload_part=8 * MiB)   # an append
    assert rebuild.uploaded_bytes(parts) == MiB and parts[-1] == rebuild.Part(gib, gib + MiB, False)
    assert all(p.copy and p.length <= rebuild.COPY_PART for p in parts[:-1])
    parts = rebuild.plan(gib, gib, RangeSet([(100, 200)]), upload_part=8 * MiB)  # a header
    assert rebuild.uploaded_bytes(parts) == rebuild.MIN_PART
    parts = rebuild.plan(5 << 40, 5 << 40, RangeSet([(0, 1)]), upload_part=8 * MiB)  # 5 TiB
    assert len(parts) <= rebuild.MAX_PARTS and max(p.length for p in parts) <= rebuild.MAX_PART


# ------------------------------------------------------------ through the core

trio_test = pytest.mark.trio

SIZE = 24 * MiB


async def big_world(make_world, *, eager=False, size=SIZE):
    w = make_world(wview(), eager=eager)
    w.store.part_size = 5 * MiB
    data = blob(size)
    w.add("v", "data/big", data)
    await w.start()
    return w, data


def gets(w) -> int:
    return w.cache.gets


@trio_test
async def test_an_append_to_a_big_object_copies_it_server_side(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", APPEND)
    extra = blob(MiB, 2)
    await w.fs.write(fh, SIZE, extra)
    await w.close(fh)
    assert w.obj("v", "data/big")["data"] == data + extra
    assert gets(w) == 0 and w.store.calls["download"] == 0        # nothing of it downloaded
    assert w.store.copied_bytes == SIZE and w.store.part_bytes == MiB
    assert w.store.wcalls["upload"] == 0
    # the entry is clean now, based on the new version: a read fetches from that one
    assert await w.read("v/big") == data + extra


@trio_test
async def test_a_change_in_the_middle_uploads_one_part(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", RW)
    await w.fs.write(fh, 10 * MiB, b"X" * 100)
    assert await w.fs.read(fh, 10 * MiB - 3, 6) == data[10 * MiB - 3:10 * MiB] + b"XXX"
    await w.close(fh)
    expected = data[:10 * MiB] + b"X" * 100 + data[10 * MiB + 100:]
    assert w.obj("v", "data/big")["data"] == expected
    assert w.store.part_bytes <= 2 * rebuild.MIN_PART
    assert w.store.copied_bytes >= SIZE - 2 * rebuild.MIN_PART
    assert w.cache.got <= 2 * rebuild.MIN_PART + 2 * MiB   # only what the uploaded part lacked


@trio_test
async def test_truncate_then_extend_keeps_zeros_not_the_old_bytes(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", RW)
    await w.fs.setattr((await w.path("v/big")).ino, size=7 * MiB, fh=fh)
    await w.fs.write(fh, 20 * MiB, b"tail")
    await w.close(fh)
    expected = data[:7 * MiB] + bytes(13 * MiB) + b"tail"
    assert w.obj("v", "data/big")["data"] == expected
    assert w.store.copied_bytes >= 5 * MiB


@trio_test
async def test_a_small_object_is_appended_with_one_put(make_world):
    w = make_world(wview())
    w.add("v", "data/s", b"hello ")
    await w.start()
    await w.write("v/s", b"world", APPEND, offset=6)
    assert w.obj("v", "data/s")["data"] == b"hello world"
    assert w.store.wcalls["upload"] == 1 and not w.store.multiparts


@trio_test
async def test_a_renamed_sparse_file_keeps_the_bytes_of_its_old_name(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", RW)
    await w.fs.write(fh, MiB, b"changed")
    top = await w.path("v")
    await w.fs.rename(top.ino, "big", top.ino, "moved")   # deletes data/big: fetched first
    assert w.obj("v", "data/big") is None
    await w.close(fh)
    assert w.obj("v", "data/moved")["data"] == data[:MiB] + b"changed" + data[MiB + 7:]


@trio_test
async def test_a_killed_mount_uploads_the_sparse_file_by_its_ranges_log(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", RW)
    await w.fs.write(fh, 3 * MiB, b"A" * 10)
    await w.fs.write(fh, 3 * MiB + 10, b"B" * 10)          # continues the record in place
    await w.fs.write(fh, SIZE, b"appended")
    await w.fs.setattr((await w.path("v/big")).ino, size=SIZE + 4, fh=fh)   # 4 of 8 stay
    w2 = w.restart()                                       # SIGKILL: no close
    await w2.start()
    w2.fs.recover()
    assert await w2.fs.sync_all() == []
    expected = data[:3 * MiB] + b"A" * 10 + b"B" * 10 + data[3 * MiB + 20:] + b"appe"
    assert w2.obj("v", "data/big")["data"] == expected
    assert w2.store.copied_bytes >= SIZE - 2 * rebuild.MIN_PART
    assert not os.listdir(w2.cache.journal)
    assert not [n for n in os.listdir(w2.cache.dir) if n.endswith(".ranges")]


@trio_test
async def test_a_changed_base_is_a_conflict_whose_copy_says_what_it_lacks(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", RW)
    await w.fs.write(fh, MiB, b"mine")
    theirs = blob(SIZE, 3)
    w.store.put("b", "data/big", theirs)                  # another writer meanwhile
    with pytest.raises(FsError) as e:
        await w.close(fh)
    assert e.value.errno == errno.EIO
    assert w.obj("v", "data/big")["data"] == theirs       # never a file with holes
    [c] = w.fs.uploads.conflicts
    assert "could not be fetched" in c["reason"]
    copy = await w.read(c["path"])
    assert copy[MiB:MiB + 4] == b"mine" and len(copy) == SIZE
    assert copy[:MiB] == bytes(MiB)                       # the holes read as zeros


@trio_test
async def test_a_failed_copy_keeps_the_file_dirty_and_it_lands_later(make_world):
    w, data = await big_world(make_world)
    fh, _ = await w.open_write("v/big", APPEND)
    await w.fs.write(fh, SIZE, b"more")
    w.store.fail_writes = errno.EIO
    with pytest.raises(FsError):
        await w.close(fh)
    assert w.obj("v", "data/big")["data"] == data and w.store.multiparts[-1].aborted
    w.store.fail_writes = None
    assert await w.fs.sync_all() == []
    assert w.obj("v", "data/big")["data"] == data + b"more"


@trio_test
async def test_eager_mode_rebuilds_in_the_background(make_world):
    w, data = await big_world(make_world, eager=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.fs.run_uploads)
        fh, _ = await w.open_write("v/big", APPEND)
        await w.fs.write(fh, SIZE, b"eager")
        await w.close(fh)
        assert await w.fs.sync_all() == []
        nursery.cancel_scope.cancel()
    assert w.obj("v", "data/big")["data"] == data + b"eager"
    assert w.store.copied_bytes == SIZE and gets(w) == 0
