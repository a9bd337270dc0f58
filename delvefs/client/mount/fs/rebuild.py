"""Rebuilding a big object from its base version and the ranges written locally.

A dirty file opened from an existing object is not downloaded (``delvefs.client.mount.fs.written``):
its cache file is sparse, ``changed`` says which bytes differ from the *source* (the base
version) and bytes at or beyond ``source_len`` are local. At least the store's part size
big and not all present, it is uploaded as a multipart upload whose parts are either
copied server-side from the source (UploadPartCopy, pinned to its ETag) or uploaded from
the local file after the part's missing bytes were fetched (``DataCache.ensure``): the
file-slicing idea of the WTF file system, with S3's part rules.

``plan`` is a pure function (unit-tested against a byte model); ``rebuild`` runs a plan.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import time
from dataclasses import dataclass

import trio

from ..errors import Changed, StoreError
from ..cache.ranges import RangeSet

log = logging.getLogger(__name__)

MIN_PART = 5 * 1024**2       # S3: every part but the last at least this big
MAX_PART = 5 * 1024**3       # S3: no part bigger
MAX_PARTS = 10_000           # S3: no more parts
# Copy parts are merged up to this size. Measured on this MinIO (1 GiB rebuilt by
# UploadPartCopy, 10 parts at a time): 8 MiB parts 3.4 s, 64 MiB parts 2.8 s; bigger parts
# leave fewer of them to run in parallel on a small object.
COPY_PART = 64 * 1024**2
COPY_CONCURRENCY = 10


@dataclass(frozen=True)
class Part:
    start: int
    end: int
    copy: bool  # True: UploadPartCopy from the source; False: uploaded from the local file

    @property
    def length(self) -> int:
        return self.end - self.start


def plan(size: int, source_len: int, changed: RangeSet, *, upload_part: int,
         copy_part: int = COPY_PART, min_part: int = MIN_PART, max_parts: int = MAX_PARTS,
         max_part: int = MAX_PART) -> list[Part]:
    """The parts of an object of ``size`` bytes whose bytes [0, source_len) not in
    ``changed`` equal the source's: as few uploaded bytes as S3's rules allow (every part
    but the last >= ``min_part``, none > ``max_part``, at most ``max_parts``), unchanged
    ranges copied in parts of up to ``copy_part``, uploaded ranges in parts of about
    ``upload_part``. An empty object is one empty uploaded part."""
    if size <= 0:
        return [Part(0, 0, False)]
    while True:
        parts = _plan(size, min(source_len, size), changed, upload_part, copy_part, min_part)
        if len(parts) <= max_parts and all(p.length <= max_part for p in parts):
            return parts
        # too many parts: bigger ones (each but the last >= min_part, so this ends)
        min_part, upload_part, copy_part = min_part * 2, upload_part * 2, copy_part * 2
        copy_part = min(copy_part, max_part)
        upload_part = min(upload_part, max_part)
        min_part = min(min_part, max_part // 2)


def _plan(size: int, source_len: int, changed: RangeSet, upload_part: int, copy_part: int,
          min_part: int) -> list[Part]:
    # segments alternating between copyable (True) and to upload (False)
    must = RangeSet(changed)
    must.truncate(source_len)
    must.add(source_len, size)
    segs: list[list] = []
    pos = 0
    for s, e in must:
        if s > pos:
            segs.append([pos, s, True])
        segs.append([s, min(e, size), False])
        pos = min(e, size)
    if pos < size:
        segs.append([pos, size, True])
    _normalize(segs, min_part)
    parts: list[Part] = []
    for s, e, copy in segs:
        for a, b in _split(s, e, copy_part if copy else upload_part, min_part):
            parts.append(Part(a, b, copy))
    return parts


def _merge(segs: list[list]) -> None:
    i = 0
    while i + 1 < len(segs):
        if segs[i][2] == segs[i + 1][2]:
            segs[i][1] = segs[i + 1][1]
            del segs[i + 1]
        else:
            i += 1


def _normalize(segs: list[list], min_part: int) -> None:
    """Make every segment but the last at least ``min_part``: a short copyable one is
    uploaded instead; a short one to upload takes the bytes it lacks from a copyable
    neighbour that can spare them (the right one first), else swallows the right one."""
    while True:
        for i, (s, e, copy) in enumerate(segs):
            last = i == len(segs) - 1
            if e - s >= min_part or last:
                continue
            if copy:
                segs[i][2] = False
                break
            need = min_part - (e - s)
            right = segs[i + 1]
            right_last = i + 1 == len(segs) - 1
            spare = right[1] - right[0] - need
            if spare >= min_part or (right_last and spare >= 1):
                segs[i][1] = right[0] = e + need
                continue
            if i > 0:
                left = segs[i - 1]
                if left[1] - left[0] - need >= min_part:
                    segs[i][0] = left[1] = s - need
                    continue
            right[2] = False
            break
        else:
            return
        _merge(segs)


def _split(start: int, end: int, bound: int, min_part: int) -> list[tuple[int, int]]:
    """[start, end) in equal parts of at most about ``bound``, each >= ``min_part`` (one
    part when shorter)."""
    length = end - start
    n = max(1, -(-length // bound))
    while n > 1 and length // n < min_part:
        n -= 1
    return [(start + length * i // n, start + length * (i + 1) // n) for i in range(n)]


def uploaded_bytes(parts: list[Part]) -> int:
    return sum(p.length for p in parts if not p.copy)


async def rebuild(store, cache, entry, parts: list[Part], source: tuple[str, str, str], *,
                  tags: dict, content_type: str, base: str | None, unanswered=None) -> str:
    """Run ``parts`` as one multipart upload of ``entry``'s key, complete it conditional on
    ``base``; the new ETag. Uploaded parts first get their missing bytes (``cache.ensure``,
    from the source). Raises StoreError: ``Changed`` when the source is no longer that
    version (a copy or an ensure got 412 / no such key) or the completion's condition
    failed; the upload is aborted on any failure. A completion whose answer was lost calls
    ``unanswered(etag)`` with the ETag the object has if S3 completed it anyway (the next
    try cannot copy from a source it replaced: the caller compares first)."""
    bucket, key = entry.bucket, entry.key
    started = time.monotonic()
    mp = store.multipart(bucket, key, tags=tags, content_type=content_type)
    etags: list[str | None] = [None] * len(parts)
    copies = trio.CapacityLimiter(COPY_CONCURRENCY)
    failures: list[StoreError] = []

    async def one(i: int, part: Part, nursery) -> None:
        try:
            if part.copy:
                async with copies:
                    await mp.wait_slot()
                    etags[i] = await mp.send_copy(i + 1, source, part.start, part.end)
            else:
                await cache.ensure(store, entry, part.start, part.end)
                await mp.wait_slot()
                etags[i] = await mp.send_part(i + 1, entry.path, part.start, part.length)
            if etags[i] is None:
                raise mp.errors[-1] if mp.errors else StoreError(errno.EIO, f"{mp.what}: part {i + 1} failed")
        except StoreError as exc:
            failures.append(_source_gone(exc, source) if part.copy else exc)
            nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            for i, part in enumerate(parts):
                nursery.start_soon(one, i, part, nursery)
        if failures:
            changed = [f for f in failures if isinstance(f, Changed)]
            raise (changed or failures)[0]
        try:
            etag = await mp.complete(parts[-1].end, base, etags)
        except StoreError as exc:
            if not isinstance(exc, Changed) and unanswered is not None:
                unanswered(multipart_etag(etags))
            raise
    except BaseException:
        with trio.CancelScope(shield=True):
            await mp.abort()
        raise
    took = time.monotonic() - started
    log.info("uploaded %s/%s: %d bytes in %.2f s by %d parts, %d of them copied from %s/%s "
             "(%d bytes sent)", bucket, key, parts[-1].end, took, len(parts),
             sum(p.copy for p in parts), source[0], source[1], uploaded_bytes(parts))
    return etag


def multipart_etag(part_etags: list[str]) -> str:
    """The ETag S3 gives an object completed from these parts: the MD5 of their MD5s, and
    their count."""
    digest = hashlib.md5(b"".join(bytes.fromhex(e.strip('"')) for e in part_etags)).hexdigest()
    return f"{digest}-{len(part_etags)}"


def _source_gone(exc: StoreError, source: tuple[str, str, str]) -> StoreError:
    """A copy part's failure: its source deleted or changed is a conflict."""
    if isinstance(exc, Changed):
        return exc
    if exc.errno == errno.ENOENT:
        return Changed(f"{source[0]}/{source[1]}: the version this file was based on was "
                       "deleted meanwhile")
    return exc
