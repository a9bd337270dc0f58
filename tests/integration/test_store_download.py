"""The mount's downloads against real MinIO: ranged GETs of ``s3.LeanClient`` driven by
``S3Store.download`` (static keys), into a file and into a streaming ``cache.Download``."""
from __future__ import annotations

import errno
import functools
import os

import pytest
import trio

from delvefs.shared import s3 as s3mod
from delvefs.client.datacache import Download
from delvefs.shared.config import S3Settings
from delvefs.client.errors import Changed, StoreError
from delvefs.client.s3async import S3Store

pytestmark = [pytest.mark.services]

PART = 1 << 20


def _store(**kw) -> S3Store:
    lean = s3mod.LeanClient(S3Settings.from_env())
    return S3Store(lambda: pytest.fail("botocore is not needed for downloads"), lean=lean,
                   part_size=PART, part_concurrency=3, **kw)


def _put(s3, bucket, key, data) -> str:
    return s3.put_object(Bucket=bucket, Key=key, Body=data)["ETag"].strip('"')


def test_get_range_is_pinned_to_the_etag(s3, bucket):
    data = os.urandom(3 * PART + 123)
    etag = _put(s3, bucket, "a.bin", data)
    lean = s3mod.LeanClient(S3Settings.from_env())
    got = bytearray(len(data))

    def write(offset, chunk):
        got[offset:offset + len(chunk)] = chunk

    lean.get_range(bucket, "a.bin", 5, len(data), etag=etag, write=write, chunk=4096)
    assert bytes(got[5:]) == data[5:]
    with pytest.raises(s3mod.S3Error) as exc:
        lean.get_range(bucket, "a.bin", 0, 10, etag="0" * 32, write=write)
    assert exc.value.code == "PreconditionFailed"
    with pytest.raises(s3mod.S3Error) as exc:
        lean.get_range(bucket, "missing", 0, 10, etag=etag, write=write)
    assert exc.value.code in s3mod.MISSING_CODES

    def disk_full(offset, chunk):
        raise OSError(errno.ENOSPC, "full")

    with pytest.raises(OSError):
        lean.get_range(bucket, "a.bin", 0, len(data), etag=etag, write=disk_full)
    lean.close()


def test_download_to_a_file_and_streaming(s3, bucket, tmp_path):
    data = os.urandom(5 * PART + 7)
    etag = _put(s3, bucket, "b.bin", data)

    async def main():
        store = _store()
        target = str(tmp_path / "b")
        await store.download(bucket, "b.bin", target, etag=etag, size=len(data))
        assert open(target, "rb").read() == data
        dl = Download(str(tmp_path / "s"), len(data))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(store.download, bucket, "b.bin", dl, etag=etag,
                                                 size=len(data)))
            await dl.wait_for(PART + 1)  # the first parts arrive first
            assert os.pread(dl.fd, PART + 1, 0) == data[:PART + 1]
        assert dl.done == len(data) and os.pread(dl.fd, len(data), 0) == data
        os.close(dl.fd)
        # a changed object: 412 -> Changed (the cache forgets that version, readers get EIO)
        with pytest.raises(Changed):
            await store.download(bucket, "b.bin", target, etag="0" * 32, size=len(data))
        with pytest.raises(StoreError) as exc:
            await store.download(bucket, "nope.bin", target, etag=etag, size=len(data))
        assert exc.value.errno == errno.ENOENT
        store.close()

    trio.run(main)
