"""The mount's ranged GETs against real MinIO: ``s3.LeanClient.get_range`` and
``S3Store.get_range`` (the lean client with static keys, else boto3), pinned to an ETag."""
from __future__ import annotations

import errno
import os

import pytest
import trio

from delvefs.shared import s3 as s3mod
from delvefs.shared.config import S3Settings
from delvefs.client.mount.errors import Changed, StopGet, StoreError
from delvefs.client.mount.s3async import S3Store

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


@pytest.mark.parametrize("client", ["lean", "boto3"])
def test_store_get_range_into_a_writer(s3, bucket, client):
    data = os.urandom(5 * PART + 7)
    etag = _put(s3, bucket, "b.bin", data)

    async def main():
        if client == "lean":
            store = _store()
        else:
            store = S3Store(s3mod.make_client(S3Settings.from_env()), part_size=PART)
        got = bytearray(len(data))

        def write(offset, chunk):
            got[offset:offset + len(chunk)] = chunk

        await store.get_range(bucket, "b.bin", PART - 3, 4 * PART + 5, etag=etag, write=write)
        assert got[PART - 3:4 * PART + 5] == data[PART - 3:4 * PART + 5]
        assert not any(got[:PART - 3]) and not any(got[4 * PART + 5:])
        # a changed object: 412 -> Changed (its readers get EIO, never another version's bytes)
        with pytest.raises(Changed):
            await store.get_range(bucket, "b.bin", 0, 10, etag="0" * 32, write=write)
        with pytest.raises(StoreError) as exc:
            await store.get_range(bucket, "nope.bin", 0, 10, etag=etag, write=write)
        assert exc.value.errno == errno.ENOENT

        def stop(offset, chunk):
            raise StopGet()

        with pytest.raises(StopGet):  # nobody wants the bytes: ended, not an S3 error
            await store.get_range(bucket, "b.bin", 0, len(data), etag=etag, write=stop)

        def disk_full(offset, chunk):
            raise OSError(errno.ENOSPC, "full")

        with pytest.raises(StoreError) as exc:
            await store.get_range(bucket, "b.bin", 0, len(data), etag=etag, write=disk_full)
        assert exc.value.errno == errno.ENOSPC
        store.close()

    trio.run(main)
