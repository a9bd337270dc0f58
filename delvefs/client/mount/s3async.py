"""Async access to S3 for the core: every S3 call (boto3's, or :class:`s3.LeanClient`'
for deletes, HEADs, small PUTs and ranged GETs) runs in a worker thread
(``trio.to_thread.run_sync``) under a CapacityLimiter, so the trio loop never blocks.

``S3Store`` is the real one; tests give the core a fake with the same coroutines
(read side: head, tags, get_range; write side: upload, copy, delete, put_tags).
Errors come out as :class:`StoreError` with an errno (ENOENT, EACCES, EIO, ...; the table is
``delvefs.client.mount.errors``), a 412 as its subclass :class:`Changed`. A ``get_range``
writer ends its GET by raising :class:`StopGet` (also there: the cache raises it and
knows no store).

``S3Store.requests`` counts the calls by S3 operation (``PutObject``, ``HeadObject``,
``GetObjectTagging``, ``DeleteObjects``, ...; ``errors`` those that failed): the mount's
metrics export them (``delvefs_mount_s3_requests_total``). A call is one request as the
mount asks it; the client's own retries of it are not counted.
"""
from __future__ import annotations

import collections
import errno
import functools
import hashlib
import logging
import mimetypes
import threading
import time

import trio

from delvefs.shared import s3
from .errors import Changed, StopGet, StoreError, Superseded, store_error
from .writelog import WriteLog

log = logging.getLogger(__name__)


CLIENT = object()   # placeholders in S3Store._call's arguments
LEAN = object()     # the lean client (``lean``) if given, else CLIENT

# the S3 operation of each function ``S3Store._call`` runs (its requests counted by it)
OPERATIONS = {"head_object": "HeadObject", "put_file": "PutObject", "put_bytes": "PutObject",
              "get_object_tags": "GetObjectTagging", "put_object_tags": "PutObjectTagging",
              "delete_object": "DeleteObject", "delete_objects": "DeleteObjects",
              "list_level": "ListObjectsV2", "copy": "CopyObject",
              "create_multipart": "CreateMultipartUpload", "upload_part": "UploadPart",
              "upload_part_copy": "UploadPartCopy", "complete_multipart": "CompleteMultipartUpload",
              "abort_multipart": "AbortMultipartUpload"}


class _OneTry:
    """The lean client's HeadObject in one try (``S3Store.head(once=True)``)."""

    def __init__(self, lean: s3.LeanClient):
        self.lean = lean

    def head_object(self, **kwargs) -> dict:
        return self.lean.head_object(attempts=1, **kwargs)


class S3Store:
    """``client`` is a boto3 client, or a function that makes one: then it is made on first
    use (or by ``warm``) in a worker thread, so a mount need not wait for botocore.
    ``lean`` (an :class:`s3.LeanClient`, when the credentials are static) makes the
    DeleteObject, HeadObject and single-PutObject requests and the reads' ranged GETs
    instead of it."""

    def __init__(self, client, *, threads: int = 32, part_size: int = 8 * 1024 * 1024,
                 part_concurrency: int = 10, copy_threshold: int = s3.MAX_SINGLE_COPY,
                 lean: s3.LeanClient | None = None, upload_concurrency: int = 16,
                 multipart_concurrency: int = 4):
        self._factory = client if callable(client) and not hasattr(client, "meta") else None
        self._client = None if self._factory is not None else client
        self._made = threading.Lock()
        self.limiter = trio.CapacityLimiter(threads)
        # ranged GETs (reads, read-ahead) in threads of their own: a long sequential read
        # never keeps the HEADs, PUTs and DELETEs of other operations waiting for a thread
        self._gets = trio.CapacityLimiter(max(1, threads // 2))
        self.part_size = part_size
        self.part_concurrency = part_concurrency
        self._copier = None
        # renames below it are one CopyObject: the copy appears with its tags at once
        self.copy_threshold = copy_threshold
        # whole-object uploads at once: single PutObjects (at a distance each one mostly
        # waits: enough of them fill the link), and multipart uploads, fewer (each holds up
        # to ``part_concurrency`` parts in memory)
        self._uploads = trio.CapacityLimiter(max(1, upload_concurrency))
        self._multipart_uploads = trio.CapacityLimiter(max(1, multipart_concurrency))
        self.lean = lean
        self.written = WriteLog()  # what S3 accepted, until the event handler confirms it
        self.requests: collections.Counter = collections.Counter()  # S3 operation -> calls
        self.errors: collections.Counter = collections.Counter()    # ... that failed

    def _make(self):
        """The client (made once; any thread)."""
        with self._made:
            if self._client is None:
                self._client = self._factory()
            return self._client

    @property
    def client(self):
        return self._client if self._client is not None else self._make()

    async def warm(self) -> None:
        """Make the client now (in a worker thread); errors show at its first use."""
        try:
            await trio.to_thread.run_sync(self._make)
        except Exception as exc:  # noqa: BLE001
            log.warning("S3 client: %s", exc)

    def close(self) -> None:
        if self.lean is not None:
            self.lean.close()
        if self._copier is not None:
            self._copier.shutdown()

    async def _call(self, what: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in a worker thread; ``CLIENT`` / ``LEAN`` in args stand
        for the client (made there on first use) and the lean client."""
        lean = self.lean if self.lean is not None else CLIENT
        args = tuple(lean if a is LEAN else a for a in args)
        operation = OPERATIONS.get(getattr(fn, "__name__", ""), what.split(" ", 1)[0])
        self.requests[operation] += 1

        def run():
            if self._client is None and any(a is CLIENT for a in args):
                self._make()
            return fn(*(self._client if a is CLIENT else a for a in args), **kwargs)
        try:
            result = await trio.to_thread.run_sync(run, limiter=self.limiter)
        except Exception as exc:  # noqa: BLE001 — mapped to an errno
            self.errors[operation] += 1
            error = store_error(exc, what)
            log.debug("S3 %s: %s", what, error)
            raise error from exc
        log.debug("S3 %s: done", what)
        return result

    async def head(self, bucket: str, key: str, *, once: bool = False) -> dict:
        """``once``: one try, no retries (the lean client's; boto3's retries as configured):
        for a caller that has an answer of its own when S3 cannot be asked."""
        if once and self.lean is not None:
            return await self._call(f"HEAD {bucket}/{key}", s3.head_object, _OneTry(self.lean),
                                    bucket, key)
        return await self._call(f"HEAD {bucket}/{key}", s3.head_object, LEAN, bucket, key)

    async def get_if_changed(self, bucket: str, key: str, start: int, end: int, *, etag: str,
                             once: bool = False) -> dict | None:
        """Whether ``etag`` is still the object's version, in one round trip: a ranged GET
        of bytes [start, end) with If-None-Match. None when it is (304, no bytes); else
        ``{"etag", "size", "mtime", "metadata", "start", "data"}`` of the version S3 has,
        ``data`` its bytes from ``start`` (None for an empty object: only a HEAD tells its
        version, and one is asked then). ``once``: one try (as ``head``). A missing object
        is StoreError ENOENT."""
        what = f"GET {bucket}/{key} bytes {start}-{end - 1} unless version {etag}"
        self.requests["GetObject"] += 1
        if self.lean is not None:
            get = functools.partial(self.lean.get_if_changed, bucket, key, start, end, etag=etag,
                                    attempts=1 if once else None)
        else:
            def get():
                return _boto_get_if_changed(self.client, bucket, key, start, end, etag)
        try:
            # (the HEADs' threads, not the ranged GETs': an open never waits for read-ahead)
            got = await trio.to_thread.run_sync(get, limiter=self.limiter)
        except Exception as exc:  # noqa: BLE001 — mapped to an errno
            self.errors["GetObject"] += 1
            raise store_error(exc, what) from exc
        if got is not None and got["data"] is None:
            return {**await self.head(bucket, key, once=once), "start": 0, "data": b""}
        return got

    async def tags(self, bucket: str, key: str) -> dict[str, str]:
        return await self._call(f"GetObjectTagging {bucket}/{key}", s3.get_object_tags,
                                CLIENT, bucket, key)

    async def get_range(self, bucket: str, key: str, start: int, end: int, *, etag: str,
                        write) -> None:
        """Bytes [start, end) of the object version ``etag`` (If-Match: a changed object is
        :class:`Changed`), handed to ``write(offset, data)`` in a worker thread as they
        arrive (``data`` is valid only during the call). An exception of ``write`` ends the
        GET and is raised (:class:`StopGet` as it is: nobody needs the bytes). With
        ``lean`` its ``get_range`` (a failed try resumes where it stopped), else boto3's
        GetObject with Range."""
        what = f"GET {bucket}/{key} bytes {start}-{end - 1}"
        self.requests["GetObject"] += 1
        try:
            if self.lean is not None:
                get = functools.partial(self.lean.get_range, bucket, key, start, end, etag=etag,
                                        write=write)
            else:
                def get():
                    _boto_get_range(self.client, bucket, key, start, end, etag, write)
            await trio.to_thread.run_sync(get, limiter=self._gets)
        except StopGet:
            raise
        except StoreError:
            self.errors["GetObject"] += 1
            raise
        except Exception as exc:  # noqa: BLE001 — mapped to an errno
            self.errors["GetObject"] += 1
            raise store_error(exc, what) from exc

    async def upload(self, bucket: str, key: str, filename: str, *, size: int,
                     tags: dict[str, str] | None, content_type: str | None,
                     base: str | None = None, metadata: dict[str, str] | None = None,
                     superseded=None) -> dict:
        """Upload the whole file as ``bucket/key``: one PutObject below the part size, a
        multipart upload (``part_concurrency`` parts at a time) above — given up before
        any further part once ``superseded()`` is true (raises :class:`Superseded`; never
        later, at the completion: S3 would have the object while the caller thinks not). Conditional on
        ``base``, the version the file was based on: its ETag (If-Match), "" (the object
        must not exist: If-None-Match: *) or None (unconditional). A failed condition
        raises :class:`Changed`. ``metadata``: the object's user metadata. Returns
        ``{"etag", "size", "mtime"}``."""
        what = f"PUT {bucket}/{key}"
        log.debug("S3 %s: %d bytes, based on %r", what, size, base)
        started = time.monotonic()
        since = time.time()
        async with self._uploads if size < self.part_size else self._multipart_uploads:
            if size < self.part_size:
                try:
                    etag = await self._conditional(what, base, self._call(
                        what, s3.put_file, LEAN, bucket, key, filename, tags=tags,
                        content_type=content_type, base=base, metadata=metadata))
                except Changed:
                    # a try whose answer was lost may have written it, and the next one found
                    # its own object: that is no conflict (a PUT's ETag is its MD5)
                    def md5() -> str:
                        with open(filename, "rb") as f:
                            return hashlib.md5(f.read()).hexdigest()
                    etag = await self._landed(bucket, key, size, await trio.to_thread.run_sync(md5))
                self.written.wrote(bucket, key, etag, since)
                return {"etag": etag, "size": size, "mtime": None}
            mp = self.multipart(bucket, key, tags=tags, content_type=content_type, metadata=metadata)
            try:
                sent = 0
                async with trio.open_nursery() as nursery:
                    for start in range(0, size, self.part_size):
                        if superseded is not None and superseded():
                            break
                        sent += 1
                        await mp.send(nursery, sent, filename, start, min(self.part_size, size - start))
                if sent * self.part_size < size:  # (raised here: not grouped by the nursery)
                    raise Superseded(f"{what}: given up after {sent} parts")
                etag = await mp.complete(size, base)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await mp.abort()
                raise
        took = time.monotonic() - started
        log.info("uploaded %s/%s: %d bytes in %.2f s (%.0f MiB/s)", bucket, key, size, took,
                 size / max(took, 1e-9) / 2**20)
        return {"etag": etag, "size": size, "mtime": None}

    async def _landed(self, bucket: str, key: str, size: int, etag: str) -> str:
        """After a failed condition: ``etag`` when S3 holds exactly what was sent (an
        earlier try of the same request succeeded), else the conflict is raised again."""
        try:
            info = await self.head(bucket, key)
        except StoreError:
            info = None
        if info is not None and info["etag"] == etag and info["size"] == size:
            log.info("PUT %s/%s: an earlier try had written it", bucket, key)
            return etag
        raise Changed(f"PUT {bucket}/{key}: S3 has another version than the one this file "
                      "was based on")

    async def _conditional(self, what: str, base: str | None, call):
        """Await ``call`` (a write conditional on ``base``): a failed condition, or an
        If-Match on a key that is gone, is :class:`Changed` (a conflict)."""
        try:
            return await call
        except Changed:
            raise Changed(f"{what}: S3 has another version than the one this file was based on") from None
        except StoreError as exc:
            if base and exc.errno == errno.ENOENT:
                raise Changed(f"{what}: the object this file was based on was deleted meanwhile") from None
            raise

    def multipart(self, bucket: str, key: str, *, tags: dict[str, str] | None,
                  content_type: str | None, metadata: dict[str, str] | None = None) -> "Multipart":
        return Multipart(self, bucket, key, tags, content_type, metadata)

    async def put_small(self, bucket: str, key: str, body: bytes, *,
                        metadata: dict[str, str]) -> str:
        """One unconditional PutObject of a small ``body`` with user ``metadata``; its ETag."""
        since = time.time()
        etag = await self._call(f"PUT {bucket}/{key}", s3.put_bytes, LEAN, bucket, key, body,
                                content_type="application/json", metadata=metadata)
        self.written.wrote(bucket, key, etag, since)
        return etag

    async def delete_many(self, bucket: str, keys: list[str]) -> dict[str, StoreError]:
        """DeleteObjects of up to 1,000 keys; the StoreError of each key not deleted (all of
        them when the request failed)."""
        what = f"DeleteObjects {bucket} ({len(keys)} keys)"
        since = time.time()
        try:
            failed = await self._call(what, s3.delete_objects, CLIENT, bucket, keys)
        except StoreError as exc:
            return {k: exc for k in keys}
        for k in keys:
            if k not in failed:
                self.written.wrote(bucket, k, None, since)
        from .errors import errno_of_s3_code
        return {k: StoreError(errno_of_s3_code(code), f"DELETE {bucket}/{k}: {code}")
                for k, code in failed.items()}

    async def copy(self, bucket: str, key: str, src_bucket: str, src_key: str, *,
                   src_etag: str | None = None,
                   metadata: dict[str, str] | None = None) -> dict:
        """Server-side copy (tags and metadata carried over; ``metadata`` is added to the
        source's user metadata, the Content-Type then follows the new name); the new
        object's HEAD. With ``src_etag``: only of that version of the source (else
        :class:`Changed`)."""
        merged = ctype = None
        if metadata is not None:
            merged = {**(await self.head(src_bucket, src_key))["metadata"], **metadata}
            ctype = mimetypes.guess_type(key)[0] or "application/octet-stream"

        def copy(client):
            with self._made:
                if self._copier is None:
                    self._copier = s3.make_copy_manager(client, threshold=self.copy_threshold)
            s3.copy_object(self._copier, bucket, key, src_bucket, src_key, src_etag=src_etag,
                           metadata=merged, content_type=ctype)
        since = time.time()
        await self._call(f"COPY {src_bucket}/{src_key} to {bucket}/{key}", copy, CLIENT)
        info = await self.head(bucket, key)
        self.written.wrote(bucket, key, info["etag"], since)
        return info

    async def delete(self, bucket: str, key: str) -> None:
        since = time.time()
        await self._call(f"DELETE {bucket}/{key}", s3.delete_object, LEAN, bucket, key)
        self.written.wrote(bucket, key, None, since)

    async def list_level(self, bucket: str, prefix: str, continuation: str | None = None) -> dict:
        """One page of the objects and common prefixes one level below ``prefix``
        (:func:`delvefs.shared.s3.list_level`)."""
        return await self._call(f"LIST {bucket}/{prefix}", s3.list_level, CLIENT, bucket, prefix,
                                continuation)

    async def put_tags(self, bucket: str, key: str, tags: dict[str, str]) -> None:
        await self._call(f"PutObjectTagging {bucket}/{key}", s3.put_object_tags, CLIENT,
                         bucket, key, tags)

    async def check_bucket(self, bucket: str, *, proof: str | None = None) -> None:
        """The bucket exists, the store answers and these credentials may read it. With the
        lean client and ``proof`` (the bucket's presigned ListObjectsV2 URL): by GETting the
        proof, without botocore, with the lean client's tries and timeouts; else HeadBucket.
        StoreError: ENOENT (no such bucket), EACCES (access denied), else EIO."""
        from .errors import errno_of_s3_code

        def check():
            if proof is not None and self.lean is not None:
                s3.check_bucket_with_proof(proof, attempts=self.lean.attempts,
                                           connect_timeout=self.lean.connect_timeout,
                                           read_timeout=self.lean.read_timeout)
            else:
                s3.check_bucket(self.client, bucket)
        try:
            await trio.to_thread.run_sync(check, limiter=self.limiter)
        except s3.S3Error as exc:
            code = f"HTTP {exc.status}" if exc.code == str(exc.status) else exc.code
            err = errno_of_s3_code(exc.code, exc.status)
            message = {errno.ENOENT: f"no such bucket ({code})",
                       errno.EACCES: f"access denied ({code})"}.get(err, code)
            raise StoreError(err, message) from exc
        except Exception as exc:  # noqa: BLE001 — the store could not be reached
            raise StoreError(errno.EIO, f"{type(exc).__name__}: {exc}") from exc


class Multipart:
    """One multipart upload whose parts may be sent while the file is still written:
    parts go out ``part_concurrency`` at a time (``send`` in the caller's nursery, or
    ``try_slot``/``wait_slot`` then ``send_part``), then ``complete`` (conditional on a base
    version, as ``S3Store.upload``) or ``abort``. A part sent again replaces the earlier
    one (S3 keeps the last)."""

    def __init__(self, store: S3Store, bucket: str, key: str, tags, content_type, metadata=None):
        self.store, self.bucket, self.key = store, bucket, key
        self.tags, self.content_type, self.metadata = tags, content_type, metadata
        self.upload_id: str | None = None
        self.parts: dict[int, str] = {}       # number -> ETag of the part S3 has
        self.errors: list[StoreError] = []
        self._started = trio.Lock()
        self._running = trio.Semaphore(store.part_concurrency)
        self._idle = trio.Event()
        self._idle.set()
        self._active = 0
        self.what = f"PUT {bucket}/{key} (multipart)"

    async def _start(self) -> str:
        async with self._started:
            if self.upload_id is None:
                self.upload_id = await self.store._call(
                    self.what, s3.create_multipart, CLIENT, self.bucket, self.key,
                    tags=self.tags, content_type=self.content_type, metadata=self.metadata)
        return self.upload_id

    def try_slot(self) -> bool:
        """Take a sending slot if one is free (then ``send_part`` must follow)."""
        try:
            self._running.acquire_nowait()
        except trio.WouldBlock:
            return False
        return True

    async def wait_slot(self) -> None:
        await self._running.acquire()

    async def send(self, nursery, number: int, filename: str, offset: int, length: int) -> None:
        """Start sending part ``number`` (returns once it is under way)."""
        await self.wait_slot()
        nursery.start_soon(self.send_part, number, filename, offset, length)

    async def send_part(self, number: int, filename: str, offset: int, length: int) -> str | None:
        """Send part ``number`` in a slot taken before (released here): its ETag, or None
        when it failed (the error kept in ``errors``)."""
        return await self._part(number, f"{self.what} part {number}", s3.upload_part,
                                filename, offset, length)

    async def send_copy(self, number: int, source: tuple[str, str, str], start: int,
                        end: int) -> str | None:
        """Part ``number`` copied server-side (UploadPartCopy) from bytes [start, end) of
        ``source`` = (bucket, key, etag), pinned to that ETag (a changed source: ``Changed``
        in ``errors``); in a slot taken before, like ``send_part``."""
        sb, sk, etag = source
        return await self._part(number, f"{self.what} part {number} (copy of {sb}/{sk} "
                                f"bytes {start}-{end - 1})", s3.upload_part_copy,
                                sb, sk, etag, start, end)

    async def _part(self, number: int, what: str, fn, *args) -> str | None:
        self._active += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        try:
            upload_id = await self._start()
            etag = await self.store._call(what, fn, CLIENT, self.bucket, self.key, upload_id,
                                          number, *args)
            self.parts[number] = etag
            return etag
        except StoreError as exc:
            self.errors.append(exc)
            return None
        finally:
            self._running.release()
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def wait(self) -> None:
        """Until every part sent so far has been answered (the first failure raised)."""
        await self._idle.wait()
        if self.errors:
            raise self.errors[0]

    async def complete(self, size: int, base: str | None, parts: list[str] | None = None) -> str:
        """Complete from ``parts`` (the part ETags in order; default: the last sent of each
        number) once every part sent is answered."""
        await self.wait()
        count = max(1, -(-size // self.store.part_size))
        if parts is None:
            missing = [n for n in range(1, count + 1) if n not in self.parts]
            if missing:
                raise StoreError(errno.EIO, f"{self.what}: parts {missing} were not sent")
            parts = [self.parts[n] for n in range(1, count + 1)]
        upload_id = await self._start()
        since = time.time()
        try:
            etag = await self.store._conditional(self.what, base, self.store._call(
                self.what, s3.complete_multipart, CLIENT, self.bucket, self.key, upload_id,
                parts, base=base))
        except Changed:
            # an earlier try may have completed it: a multipart ETag is the MD5 of the
            # parts' MD5s and their count
            digest = hashlib.md5(b"".join(bytes.fromhex(p.strip('"')) for p in parts)).hexdigest()
            etag = await self.store._landed(self.bucket, self.key, size, f"{digest}-{len(parts)}")
        self.upload_id = None  # completed: nothing to abort
        self.store.written.wrote(self.bucket, self.key, etag, since)
        return etag

    async def abort(self) -> None:
        """Drop the parts sent (best effort: S3's lifecycle rules collect what remains)."""
        await self._idle.wait()
        upload_id, self.upload_id = self.upload_id, None
        if upload_id is not None:
            try:
                await self.store._call(self.what, s3.abort_multipart, CLIENT, self.bucket,
                                       self.key, upload_id)
            except StoreError as exc:
                log.info("aborting %s: %s", self.what, exc)


def _boto_get_if_changed(client, bucket: str, key: str, start: int, end: int,
                         etag: str) -> dict | None:
    """``S3Store.get_if_changed`` through a boto3 client (a worker thread)."""
    import re
    try:
        r = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                              IfNoneMatch=f'"{etag}"')
    except Exception as exc:  # noqa: BLE001 — 304 is the answer "unchanged"
        code = s3.error_code(exc)
        if code in ("304", "NotModified"):
            return None
        if code == "InvalidRange":
            return {"data": None}
        raise
    body = r["Body"]
    try:
        data = body.read()
    finally:
        body.close()
    span = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", (r.get("ContentRange") or "").strip())
    return {"etag": r.get("ETag", "").strip('"'),
            "size": int(span[2]) if span else len(data), "start": int(span[1]) if span else 0,
            "mtime": r["LastModified"].timestamp() if r.get("LastModified") else 0.0,
            "metadata": dict(r.get("Metadata") or {}), "data": data}


def _boto_get_range(client, bucket: str, key: str, start: int, end: int, etag: str, write,
                    chunk: int = 1 << 20) -> None:
    """``S3Store.get_range`` through a boto3 client (a worker thread)."""
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                             IfMatch=f'"{etag}"')["Body"]
    try:
        while start < end:
            data = body.read(min(chunk, end - start))
            if not data:
                raise OSError(errno.EIO, f"{end - start} bytes missing at the end of the GET")
            write(start, data)
            start += len(data)
    finally:
        body.close()
