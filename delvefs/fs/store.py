"""Async access to S3 for the core: every boto3 call runs in a worker thread
(``trio.to_thread.run_sync``) under a CapacityLimiter, so the trio loop never blocks.

``S3Store`` is the real one; tests give the core a fake with the same four coroutines.
Errors come out as :class:`StoreError` with an errno (ENOENT, EACCES, EIO, ...).
"""
from __future__ import annotations

import errno
import logging

import trio

from .. import s3

log = logging.getLogger(__name__)


class StoreError(Exception):
    def __init__(self, err: int, message: str):
        super().__init__(message)
        self.errno = err


class Changed(StoreError):
    """The object no longer has the ETag the download asked for (HTTP 412)."""

    def __init__(self, message: str):
        super().__init__(errno.EAGAIN, message)


def _map(exc: BaseException, what: str) -> StoreError:
    code = s3.error_code(exc)
    if code in ("404", "NoSuchKey", "NotFound"):
        return StoreError(errno.ENOENT, f"{what}: no such object")
    if code in ("412", "PreconditionFailed"):
        return Changed(f"{what}: object changed during download")
    if code in ("403", "AccessDenied"):
        return StoreError(errno.EACCES, f"{what}: access denied")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return StoreError(errno.ENOSPC, f"{what}: cache disk full")
    return StoreError(errno.EIO, f"{what}: {type(exc).__name__}: {exc}")


class S3Store:
    def __init__(self, client, *, threads: int = 32, part_size: int = 8 * 1024 * 1024,
                 part_concurrency: int = 10):
        self.client = client
        self.limiter = trio.CapacityLimiter(threads)
        self._downloads = trio.CapacityLimiter(4)  # whole-object transfers at once
        self.manager = s3.make_transfer_manager(client, part_size=part_size,
                                                concurrency=part_concurrency)

    def close(self) -> None:
        self.manager.shutdown()

    async def _call(self, what: str, fn, *args, **kwargs):
        try:
            return await trio.to_thread.run_sync(lambda: fn(*args, **kwargs), limiter=self.limiter)
        except Exception as exc:  # noqa: BLE001 — mapped to an errno
            raise _map(exc, what) from exc

    async def head(self, bucket: str, key: str) -> dict:
        return await self._call(f"HEAD {bucket}/{key}", s3.head_object, self.client, bucket, key)

    async def tags(self, bucket: str, key: str) -> dict[str, str]:
        return await self._call(f"GetObjectTagging {bucket}/{key}", s3.get_object_tags,
                                self.client, bucket, key)

    async def download(self, bucket: str, key: str, filename: str, *, etag: str, size: int) -> None:
        async with self._downloads:
            await self._call(f"GET {bucket}/{key}", s3.download_object, self.manager, bucket, key,
                             filename, etag=etag, size=size)

    async def check_bucket(self, bucket: str) -> None:
        await self._call(f"bucket {bucket}", self.client.head_bucket, Bucket=bucket)
