"""Atomic directory publish, the mount's side: a directory renamed inside a view is
published as one batch (delvefs/shared/manifests.py). ``Namespace`` moves its files as
before — server-side copies of objects, uploads of dirty files — but each new object
carries the batch id in its user metadata, and the handler holds them back from every view;
then ``commit`` writes the manifest naming them (keys and ETags), which releases them all at
once, and deletes it again (its event is all the handler needs).

Crash safety: ``begin`` records the batch (its moves, source key → new key) in the cache
directory's publish journal (``journal.PublishJournal``) before the first object is written;
a record is removed once its manifest is written. A mount finishes the records an earlier
mount left (``finish_left``, in the background; also taken over from other cache
directories of the same views file): each move is done or found done (a dirty file is
uploaded; an object already at its new key with the batch's metadata is taken as it is;
else it is copied again), then the manifest is written. Until then, subscribers see nothing
of the directory (unless the handler's publish timeout passes first).
"""
from __future__ import annotations

import errno
import json
import logging
import time

import trio

from delvefs.shared.manifests import (BATCH_FIELD, manifest_key, manifest_metadata, new_batch)

from ..errors import FsError, StoreError
from .written import WrittenFiles
from .tree import Tree
from .uploads import Uploads

log = logging.getLogger(__name__)


def batch_of(metadata: dict) -> str | None:
    """The batch an object's user metadata names (keys in any case, as clients give them)."""
    for k, v in metadata.items():
        if k.lower() == BATCH_FIELD:
            return v
    return None


class Publisher:
    """The batches of directory renames: their records, manifests and recovery."""

    retry_initial = 1.0
    retry_max = 60.0

    def __init__(self, store, cache, written: WrittenFiles, uploads: Uploads, tree: Tree):
        self.store = store
        self.cache = cache
        self.written = written
        self.uploads = uploads
        self.tree = tree
        self._left = trio.Event()  # a commit failed: finish_left tries it again
        self._active: set[str] = set()  # batches of renames running now (not left)
        self.count = 0  # batches committed (statistics: tests, logs)

    async def begin(self, bucket: str, view: str, parent_prefix: str,
                    moves: list[tuple[str, str]]) -> dict:
        """A new batch for moving ``moves`` (source key, new key) of ``bucket``, recorded
        before anything is written. Raises FsError (the cache disk refused)."""
        batch = new_batch(time.time())
        record = {"batch": batch, "bucket": bucket, "view": view,
                  "manifest": manifest_key(parent_prefix, batch), "moves": [list(m) for m in moves]}
        try:
            await trio.to_thread.run_sync(self.cache.publishes.write, record)
        except StoreError as exc:
            raise FsError(exc.errno, f"publishing {parent_prefix}: {exc}") from exc
        self._active.add(batch)
        return record

    async def publish(self, record: dict, moved: list[tuple[str, str]],
                      items: list[tuple[str, str]]) -> None:
        """The rename of ``begin``'s batch is done: ``moved`` (source key, new key) of its
        moves happened (all, unless some failed), ``items`` (new key, ETag) are in S3 with
        the batch's metadata. Commits them. Raises StoreError: the record keeps the moves
        that happened, and ``finish_left`` commits them later."""
        self._active.discard(record["batch"])
        record = {**record, "moves": [list(m) for m in moved]}
        try:
            await self.commit(record, items)
        except StoreError:
            try:
                await trio.to_thread.run_sync(self.cache.publishes.write, record)
            except StoreError as exc:
                log.warning("publish %s: %s", record["batch"], exc)
            self._left.set()
            raise

    async def commit(self, record: dict, items: list[tuple[str, str]]) -> None:
        """Write the manifest of the batch's objects ``items`` (new key, ETag), delete it,
        drop the record. Raises StoreError (the record stays: ``finish_left`` retries)."""
        bucket, key, batch = record["bucket"], record["manifest"], record["batch"]
        if items:
            body = json.dumps({"batch": batch, "objects": [{"key": k, "etag": e} for k, e in sorted(items)]})
            await self.store.put_small(bucket, key, body.encode(),
                                       metadata=manifest_metadata(batch, items))
            try:
                await self.store.delete(bucket, key)
            except StoreError as exc:  # only an object no view shows is left
                log.warning("publish %s: deleting the manifest %s/%s: %s", batch, bucket, key, exc)
        await trio.to_thread.run_sync(self.cache.publishes.remove, record)
        self.count += 1
        log.info("published %d files under batch %s (%s/%s)", len(items), batch, bucket, key)

    async def finish(self, record: dict) -> None:
        """Finish a batch an earlier mount (or a failed commit) left. Raises FsError or
        StoreError (it stays recorded)."""
        items = []
        for sk, dk in record["moves"]:
            etag = await self._landed(record, sk, dk)
            if etag is not None:
                items.append((dk, etag))
        await self.commit(record, items)

    async def _landed(self, record: dict, sk: str, dk: str) -> str | None:
        """The ETag of the batch's object at ``dk`` once it is there, moving it first when
        the move had not happened; None when there is nothing to publish (gone, scratch)."""
        bucket, batch = record["bucket"], record["batch"]
        entry = self.cache.get(bucket, dk)
        if entry is None or not entry.dirty:
            source = self.cache.get(bucket, sk)
            if source is not None and source.dirty and source.meta is not None \
                    and not source.meta.get("conflict"):  # recorded, not re-keyed yet
                self.tree.drop_local(bucket, sk, None)
                self.written.rekey(source, bucket, dk)
                entry = source
        if entry is not None and entry.dirty and entry.meta is not None:
            if entry.meta.get("batch") != batch:
                self.written.update_record(entry, batch=batch)
            if not await self.uploads.upload(entry):
                return None  # a scratch file or a conflict copy: no part of it
            return entry.etag
        try:
            info = await self.store.head(bucket, dk)
        except StoreError as exc:
            if exc.errno != errno.ENOENT:
                raise
            info = None
        if info is not None and batch_of(info["metadata"]) == batch:
            return info["etag"]
        try:
            info = await self.store.copy(bucket, dk, bucket, sk, metadata={BATCH_FIELD: batch})
        except StoreError as exc:
            if exc.errno == errno.ENOENT:
                return None  # moved by someone else meanwhile
            raise
        await self.store.delete(bucket, sk)
        return info["etag"]

    async def finish_left(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: finish the batches the journal holds (at the mount's start, and
        after a failed commit), retrying with backoff while S3 refuses."""
        task_status.started()
        delay = self.retry_initial
        while True:
            if await self.finish_all():
                await trio.sleep(delay)
                delay = min(self.retry_max, delay * 2)
                continue
            delay = self.retry_initial
            self._left = trio.Event()
            await self._left.wait()

    async def finish_all(self) -> list[str]:
        """Finish every batch left (not a rename running now); what failed, and why."""
        failed = []
        for record in await trio.to_thread.run_sync(self.cache.publishes.read):
            if record["batch"] in self._active:
                continue
            try:
                await self.finish(record)
                log.info("finished the publish %s an earlier try left", record["batch"])
            except (FsError, StoreError) as exc:
                failed.append(f"{record['bucket']}/{record['manifest']}: publish not finished: {exc}")
                log.warning("publish %s (%s/%s): %s; trying again", record["batch"],
                            record["bucket"], record["manifest"], exc)
        return failed
