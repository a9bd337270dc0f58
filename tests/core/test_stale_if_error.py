"""S3 outages against the core's reads (stale-if-error): an open whose revalidation S3
cannot answer is served the cached copy, logged once per outage, counted and shown by
``user.delvefs.unconfirmed``; with ``stale_if_error=off`` it fails EIO; an answer of S3
(404, another version, 403) is no outage; once S3 answers again the copy is confirmed."""
from __future__ import annotations

import errno
import logging

import pytest

from delvefs.client.mount.errors import FsError, StoreError

from .conftest import view
from .test_blocks import B, blob, small_blocks

pytestmark = pytest.mark.trio

TTL = 2.0
UNCONFIRMED = "user.delvefs.unconfirmed"


@pytest.fixture
def reads_log(caplog):
    caplog.set_level(logging.INFO, "delvefs.client.mount.fs.reads")

    def lines(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]
    return lines


async def cached_world(make_world, data: bytes = b"cached bytes", **settings):
    """A world whose ``v/a`` was read whole (cached), its ttl passed since."""
    w = make_world(view("v", ttl=TTL), **settings)
    w.add("v", "data/a", data)
    await w.start()
    assert await w.read("v/a") == data
    return w


async def unconfirmed(w, path: str = "v/a") -> str | None:
    node = await w.path(path)
    try:
        return (await w.fs.getxattr(node.ino, UNCONFIRMED)).decode()
    except FsError as exc:
        assert exc.errno == errno.ENODATA
        return None


async def test_a_cached_file_past_its_ttl_is_served_while_s3_is_unreachable(
        make_world, mock_clock, reads_log):
    w = await cached_world(make_world)
    mock_clock.jump(TTL + 1)
    w.store.unreachable = True
    for _ in range(3):
        assert await w.read("v/a") == b"cached bytes"
    # asked at each open (a conditional GET, never a HEAD), in one try
    assert w.store.calls["revalidate"] == 3 and w.store.revalidations_once == 3
    assert w.store.calls["head"] == 0
    assert w.fs.reads.unconfirmed.opens == 3
    text = await unconfirmed(w)
    assert text.startswith("since ") and "S3 could not be asked" in text
    assert "Connection refused" in text
    assert len(reads_log("serving it unconfirmed")) == 1  # once per file and outage


async def test_with_stale_if_error_off_an_unreachable_s3_fails_the_open_eio(make_world, mock_clock):
    w = await cached_world(make_world, stale_if_error="off")
    mock_clock.jump(TTL + 1)
    w.store.unreachable = True
    a = await w.path("v/a")
    with pytest.raises(FsError) as e:
        await w.fs.open(a.ino, 0)
    assert e.value.errno == errno.EIO
    assert w.store.calls["revalidate"] == 1   # with the client's retries: the open has no
    assert w.store.revalidations_once == 0    # other answer
    assert w.fs.reads.unconfirmed.opens == 0 and await unconfirmed(w) is None


async def test_within_the_ttl_an_unreachable_s3_is_not_asked(make_world, mock_clock):
    w = await cached_world(make_world)
    w.store.unreachable = True
    assert await w.read("v/a") == b"cached bytes"
    assert w.store.calls["revalidate"] == 0 and await unconfirmed(w) is None


async def test_s3_answering_that_the_object_is_gone_is_no_outage(make_world, mock_clock, reads_log):
    w = await cached_world(make_world)
    mock_clock.jump(TTL + 1)
    del w.store.objects[("b", "data/a")]  # 404: what is cached of the version is all there is
    assert await w.read("v/a") == b"cached bytes"
    assert w.fs.reads.unconfirmed.opens == 0 and await unconfirmed(w) is None
    assert reads_log("unconfirmed") == []


async def test_s3_answering_another_version_serves_that_version(make_world, mock_clock):
    w = await cached_world(make_world)
    mock_clock.jump(TTL + 1)
    w.store.put("b", "data/a", b"a newer version")
    assert await w.read("v/a") == b"a newer version"
    assert w.fs.reads.unconfirmed.opens == 0 and await unconfirmed(w) is None


async def test_s3_refusing_access_fails_the_open_as_before(make_world, mock_clock):
    w = await cached_world(make_world)
    mock_clock.jump(TTL + 1)

    async def denied(bucket, key, *args, **kw):
        raise StoreError(errno.EACCES, f"GET {bucket}/{key}: access denied")
    w.store.get_if_changed = denied
    a = await w.path("v/a")
    with pytest.raises(FsError) as e:
        await w.fs.open(a.ino, 0)
    assert e.value.errno == errno.EACCES
    assert w.fs.reads.unconfirmed.opens == 0


async def test_once_s3_answers_again_the_copy_is_confirmed_and_the_xattr_cleared(
        make_world, mock_clock, reads_log):
    w = await cached_world(make_world)
    mock_clock.jump(TTL + 1)
    w.store.unreachable = True
    assert await w.read("v/a") == b"cached bytes"
    assert await unconfirmed(w) is not None
    w.store.unreachable = False
    assert await w.read("v/a") == b"cached bytes"  # the next open asks S3: same version
    assert await unconfirmed(w) is None
    assert w.store.calls["download"] == 1           # confirmed, not fetched again
    assert len(reads_log("answers again")) == 1
    mock_clock.jump(TTL + 1)                        # a second outage: logged again
    w.store.unreachable = True
    assert await w.read("v/a") == b"cached bytes"
    assert await unconfirmed(w) is not None
    assert len(reads_log("serving it unconfirmed")) == 2


async def test_a_partly_cached_file_serves_its_cached_blocks_and_fails_the_others_eio(
        make_world, mock_clock):
    w = small_blocks(make_world(view("v", ttl=TTL)))
    data = blob(16 * B)
    w.add("v", "data/big", data)
    await w.start()
    node = await w.path("v/big")
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 0, B) == data[:B]
    await w.fs.release(fh)
    mock_clock.jump(TTL + 1)
    w.store.unreachable = True
    fh, _ = await w.fs.open(node.ino, 0)
    assert await w.fs.read(fh, 0, B) == data[:B]
    with pytest.raises(FsError) as e:
        await w.fs.read(fh, 12 * B, B)
    assert e.value.errno == errno.EIO
    await w.fs.release(fh)
    assert await unconfirmed(w, "v/big") is not None
