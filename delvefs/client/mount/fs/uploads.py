"""The write path's background: conditional whole-object uploads, conflicts, eager
uploads and batched deletes, retries, recovery, shutdown.

The uploads part sends written files to S3 and owns what is in flight: the entries' locks,
the parts of large files sent while they are written (``parts``), the conflict copies it
made. Which files are to be uploaded, when, and how their last try went is the written
files' state (``delvefs.client.mount.fs.written``: the queue, the write-back delay, the
retries): this part picks from that queue and reports each outcome back to it.

A dirty file's upload (``upload``: the view's ``set`` tags merged in, Content-Type from
the name) is conditional on the version it was based on (If-Match / If-None-Match: *):
when S3 has another version by then, the local copy is kept as a *conflict copy*
``NAME.conflict-<UTC time>`` beside it (a local file of this mount, never uploaded;
``conflict``) and the other writer's object stays. A file left dirty is retried by
``run_uploads`` with backoff. In eager mode ``run_uploads`` uploads up to
``upload_concurrency`` files at a time (holding back while requests keep coming: the
written files' ``upload_limit``), and unlinks queue their DELETEs
(``delvefs.client.mount.fs.deletes``). ``sync_all``
(``delvefs sync``) waits for both; ``shutdown`` uploads the rest at unmount; ``recover``
queues what an earlier mount's journal left.

A file whose key cannot match its view (``ViewCatalog.can_match``) is a
*scratch* file: never uploaded until a rename gives it a matching name. After an upload
the change is applied to every view of the bucket in this mount at once and kept in the
views' overlay until the handler's delta shows it (by ETag) or ``overlay_bound`` passes
(``delvefs.client.mount.fs.tree``).

Uploads, renames and unlinks of one dirty entry are serialized by the entry's lock
(``entry_lock``): an unlink or rename never races an upload into a junk object. An upload
of a key whose DELETE is still queued sends that delete first (``DeleteQueue.settle``).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import mimetypes
import os
import time
from typing import NoReturn

import trio

from delvefs.shared.manifests import BATCH_FIELD

from ..cache.cacheentry import CacheEntry
from ..errors import Changed, FsError, StoreError, Superseded, store_failure
from . import rebuild
from .catalog import ViewCatalog
from .deletes import DeleteQueue
from .multipart import PartStream
from .properties import Properties, final_tags
from .tree import Tree

log = logging.getLogger(__name__)


class Uploads:
    """The background of the write path: what is to be uploaded, and its uploads."""

    def __init__(self, store, cache, written, catalog: ViewCatalog, tree: Tree,
                 properties: Properties, deletes: DeleteQueue, settings):
        self.store = store
        self.cache = cache
        self.written = written
        self.catalog = catalog
        self.tree = tree
        self.properties = properties
        self.deletes = deletes
        self.upload_concurrency = max(1, settings.upload_concurrency)
        self._locks: dict[str, trio.Lock] = {}  # journal file name -> upload lock
        self.conflicts: list[dict] = []          # conflict copies made by this mount
        self._streams: dict = {}                 # file -> PartStream (parts sent while written)
        self._bg: trio.Nursery | None = None     # the uploader's nursery (background sends)
        self.count = 0  # uploads done (statistics: tests, logs)

    def entry_lock(self, entry: CacheEntry) -> trio.Lock:
        return self._locks.setdefault(os.path.basename(entry.path), trio.Lock())

    @contextlib.asynccontextmanager
    async def entry_locks(self, *entries: CacheEntry | None):
        """The locks of several entries (None: none), taken in one order (by file name), so
        two renames in opposite directions never wait for each other."""
        unique = {os.path.basename(e.path): e for e in entries if e is not None}
        async with contextlib.AsyncExitStack() as stack:
            for name in sorted(unique):
                await stack.enter_async_context(self.entry_lock(unique[name]))
            yield

    def unschedule(self, entry: CacheEntry) -> None:
        """The file is uploaded, removed, renamed or a conflict copy: its parts sent while
        it was written are aborted, and it leaves the queue."""
        self.drop_stream(entry)
        self.written.unqueue(entry)

    async def upload(self, entry: CacheEntry, *, give_way: bool = False) -> bool:
        """Upload a dirty entry as its object, conditional on the version it is based on:
        True when uploaded (or clean already), False when it is a scratch file (its name
        cannot match its view) or a conflict copy. Raises FsError (one log line naming the
        object); the entry then stays dirty and is retried — or, when S3 has another
        version, is kept as a conflict copy (EIO). A file a write into failed is never
        uploaded: its errno (``WrittenFiles.failed_write``). ``give_way`` (the background
        uploader): a multipart upload of a file nobody wrote when it began is given up when the file
        is opened for writing or changed meanwhile (raises Superseded; the close that
        follows, or the one that came, queues it again) — a tool that creates a file,
        closes it and opens it again to write (fio's layout, a header then the body) would
        otherwise have it uploaded twice, the first time beside its own writes (a changed
        file is uploaded again after an upload of what it was anyway)."""
        async with self.entry_lock(entry):
            if not entry.dirty or entry.meta is None:
                return True
            if entry.meta.get("conflict"):
                return False
            failed = self.written.failed_write(entry)
            if failed is not None:  # partial: never uploaded (``WrittenFiles.write_failed``)
                raise failed
            bucket, key, meta = entry.bucket, entry.key, entry.meta
            vs = self.catalog.get(meta.get("view"))
            base = meta.get("base")
            remote = None
            try:
                await self.deletes.settle(bucket, key)
                if base is None:  # a record without its base (an older journal): ask S3
                    try:
                        base = (await self.store.head(bucket, key))["etag"]
                    except StoreError as exc:
                        if exc.errno != errno.ENOENT:
                            raise
                        base = ""
                    if bool(base) != bool(meta.get("existing")):
                        raise Changed(f"{bucket}/{key} was " + (
                            "created" if base else "deleted") + " by someone else meanwhile")
                if base:  # the overwritten object's tags are kept
                    remote = self.properties.known_tags(bucket, key, base, vs)
                if base and remote is None:
                    try:
                        remote = await self.store.tags(bucket, key)
                    except StoreError as exc:
                        if exc.errno == errno.ENOENT:
                            raise Changed(f"{bucket}/{key}: the object this file was based on "
                                          "was deleted meanwhile") from None
                        raise
            except StoreError as exc:
                await self._upload_error(entry, exc, "uploading (tags of)", bucket, key)
            if not entry.dirty or entry.meta is None:
                return True
            tags = final_tags(entry, vs, remote)
            size = entry.size
            if vs is not None and not self.catalog.can_match(vs, key, size, tags):
                self.unschedule(entry)
                return False
            gen = entry.gen
            superseded = (lambda: bool(entry.writers) or entry.gen != gen) \
                if give_way and not entry.writers else None
            ctype = mimetypes.guess_type(key)[0] or "application/octet-stream"
            started = time.time()
            # a file of a directory being published (publish.py): its batch in its metadata
            metadata = {BATCH_FIELD: meta["batch"]} if meta.get("batch") else None
            try:
                with self.written.sending(entry):
                    info = await self._send(entry, size, tags, ctype, base, metadata, superseded)
            except Superseded:
                log.info("upload of %s/%s given up: written again (its last close uploads it)",
                         bucket, key)
                raise
            except StoreError as exc:
                await self._upload_error(entry, exc, "uploading", bucket, key)
            self.count += 1
            self.unschedule(entry)
            self.properties.wrote(bucket, key, info["etag"], tags)
            obj = {"key": key, "size": size, "mtime": info.get("mtime") or time.time(),
                   "etag": info["etag"]}
            still_dirty = entry.gen != gen or not entry.dirty
            if not still_dirty:
                self.written.uploaded(entry, info["etag"])
            else:
                self.written.rebased(entry, info["etag"], size, batch=False)
                self.written.queue(entry)
            self.properties.clear()
            self.tree.local_put(bucket, key, obj, tags, keep_local=still_dirty, quiet=vs,
                                since=started)
            return True

    async def _upload_error(self, entry: CacheEntry, exc: StoreError, what: str, bucket: str,
                            key: str) -> NoReturn:
        """An upload (or what it needed first) failed: S3 has another version (``Changed``):
        the entry becomes a conflict copy, EIO; else it stays dirty, to be retried."""
        if entry.meta is None:  # discarded meanwhile: nothing is left to keep or retry
            raise store_failure(exc, what, bucket, key) from exc
        if isinstance(exc, Changed):
            await self.conflict(entry, str(exc))
            raise FsError(errno.EIO, str(exc), logged=True) from exc
        self.written.upload_failed(entry, str(exc))
        raise store_failure(exc, what, bucket, key) from exc

    async def _send(self, entry: CacheEntry, size: int, tags: dict, ctype: str,
                    base: str | None, metadata: dict | None = None, superseded=None) -> dict:
        """The upload itself: a file based on a source version and at least a part big is
        rebuilt with its unchanged ranges copied server-side (``rebuild``); else the parts
        sent while the file was written are completed when they fit (same key, tags,
        type); else the whole file goes, its missing bytes fetched first. A file with user
        ``metadata`` (a published one) always goes whole."""
        source, part = entry.source, self.store.part_size
        if source is not None and size >= part and metadata is None:
            parts = rebuild.plan(size, entry.source_len, self.written.changed(entry),
                                 upload_part=part)
            if any(p.copy for p in parts):
                prior = self.written.take_unanswered(entry)
                if prior is not None:
                    # the last try's completion went unanswered: S3 may have the object
                    # already, and then its source (the base) is gone
                    try:
                        info = await self.store.head(entry.bucket, entry.key)
                    except StoreError:
                        info = None
                    if info is not None and (info["etag"], info["size"]) == (prior, size):
                        log.info("uploaded %s/%s: the last try had completed it", entry.bucket,
                                 entry.key)
                        return {"etag": prior, "size": size, "mtime": None}
                gen = entry.gen

                def unanswered(etag: str) -> None:
                    if entry.gen == gen:
                        self.written.unanswered(entry, etag)
                etag = await rebuild.rebuild(self.store, self.cache, entry, parts, source,
                                             tags=tags, content_type=ctype, base=base,
                                             unanswered=unanswered)
                return {"etag": etag, "size": size, "mtime": None}
        if self.written.sparse(entry):
            await self.cache.ensure(self.store, entry, 0, size)
        st = self._streams.pop(os.path.basename(entry.path), None)
        if st is not None and metadata is not None:
            await st.abort()
            st = None
        if st is not None:
            try:
                if st.key == (entry.bucket, entry.key) and st.tags == tags \
                        and st.content_type == ctype and size >= st.part_size:
                    early = len(st.done)
                    etag = await st.finish(self._bg, size, base)
                    if etag is not None:
                        log.info("uploaded %s/%s: %d bytes, %d parts, %d of them sent while it "
                                 "was written", entry.bucket, entry.key, size,
                                 -(-size // st.part_size), early)
                        return {"etag": etag, "size": size, "mtime": None}
            finally:
                if st.mp.upload_id is not None or st.sending:
                    await st.abort()
        return await self.store.upload(entry.bucket, entry.key, entry.path, size=size,
                                       tags=tags, content_type=ctype, base=base, metadata=metadata,
                                       superseded=superseded)

    async def conflict(self, entry: CacheEntry, reason: str) -> None:
        """S3 has another version of the entry's key than the one it was based on: the
        other writer's object stays; the local content becomes the conflict copy
        ``KEY.conflict-<UTC time>`` of this mount (shown beside it, never uploaded), and the
        key shows what S3 has."""
        bucket, key = entry.bucket, entry.key
        if entry.source is not None:
            # a sparse file: what it lacks comes from a version that is likely gone now
            if self.written.sparse(entry):
                try:
                    await self.cache.ensure(self.store, entry, 0, entry.size)
                except StoreError as exc:
                    log.info("conflict copy of %s/%s: fetching what it lacks: %s", bucket, key, exc)
            lost = entry.present.missing(0, min(entry.size, entry.source_len)) \
                if entry.present is not None else []
            if lost:
                reason += (f"; {sum(e - s for s, e in lost)} bytes in {len(lost)} ranges it did "
                           "not change could not be fetched from the version it was based on "
                           f"(first: {lost[0][0]}-{lost[0][1] - 1}): they read as zeros in the copy")
            self.written.unsource(entry)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        new_key, n = f"{key}.conflict-{stamp}", 1
        while self.cache.get(bucket, new_key) is not None:
            n += 1
            new_key = f"{key}.conflict-{stamp}-{n}"
        view = entry.meta.get("view")
        self.unschedule(entry)
        self.written.rekey(entry, bucket, new_key)
        self.written.update_record(entry, conflict={"key": key, "at": stamp, "reason": reason},
                                 base="")
        try:
            self.written.journal(entry)
        except StoreError as exc:
            log.warning("journal of conflict copy %s/%s: %s", bucket, new_key, exc)
        vs = self.catalog.get(view)
        path = self.catalog.path_of(bucket, new_key, view or "")
        self.conflicts.append({"path": path, "key": key, "bucket": bucket, "reason": reason,
                               "at": stamp})
        log.warning("conflict: %s/%s changed in S3 since this file was opened (%s): the other "
                    "version stays, this mount's copy is kept as %s (not uploaded)",
                    bucket, key, reason, path)
        self.tree.drop_local_pending(bucket, key)
        if vs is not None and vs.bucket == bucket and not vs.retired:
            self.tree.show_dirty(vs, entry, notify=True)
        # what S3 has at the key now (the other writer's version, or nothing)
        try:
            info = await self.store.head(bucket, key)
        except StoreError as exc:
            if exc.errno == errno.ENOENT:
                self.tree.local_delete(bucket, key)
            return
        tags = {}
        if self.catalog.needs_tags(bucket):
            try:
                tags = await self.store.tags(bucket, key)
            except StoreError:
                pass
        self.tree.local_put(bucket, key, {"key": key, "size": info["size"],
                                          "mtime": info["mtime"], "etag": info["etag"]}, tags)

    async def show_remote(self, bucket: str, key: str, *, existing: bool) -> None:
        """The local content of ``bucket/key`` was dropped (a write into it had failed): its
        nodes show what S3 has. A file S3 did not have (not ``existing``) goes (an object
        another writer made meanwhile shows with the handler's news); else the version a
        HEAD finds is shown, the kernel's pages of the dropped content invalidated."""
        self.tree.drop_local(bucket, key, None)
        if not existing:
            return
        try:
            info = await self.store.head(bucket, key)
        except StoreError as exc:
            if exc.errno == errno.ENOENT:
                self.tree.local_delete(bucket, key)
            else:
                log.warning("%s/%s: asking S3 for the version its dropped changes were based on: "
                            "%s (the view shows it again with its next change)", bucket, key, exc)
            return
        mtime_ns = int(info["mtime"] * 1e9)
        for vs in self.catalog.of_bucket(bucket):
            node = self.tree.find(vs, key)
            if node is not None and not node.is_dir:
                self.tree.object_changed(node, info["size"], mtime_ns, info["etag"])

    async def copy_into(self, entry: CacheEntry, src_bucket: str, src_key: str,
                        tags: dict) -> dict:
        """The object ``src_bucket/src_key`` copied server-side to ``entry``'s key with
        ``tags`` (a copy inside the mount); the new object's HEAD. Raises FsError."""
        bucket, key = entry.bucket, entry.key
        try:
            await self.deletes.settle(bucket, key)  # eager: a queued DELETE of it goes first
            info = await self.store.copy(bucket, key, src_bucket, src_key)
            await self.store.put_tags(bucket, key, tags)
        except StoreError as exc:
            raise store_failure(exc, "copying", src_bucket, src_key) from exc
        self.count += 1
        return info

    async def keep_source(self, entry: CacheEntry, what: str) -> None:
        """The object an entry written through descriptors takes its missing bytes from is
        about to be deleted or replaced (a rename, an unlink while open, an overwrite):
        fetch them first. A dirty entry is an ordinary local file afterwards; a clean one
        (uploaded by an fsync while descriptors still write it) holds all of its bytes.
        Raises FsError."""
        if entry.source is None:
            return
        if self.written.sparse(entry):
            try:
                await self.cache.ensure(self.store, entry, 0, entry.size)
            except StoreError as exc:
                raise store_failure(exc, what, entry.source[0], entry.source[1]) from exc
        if entry.dirty:
            self.written.unsource(entry)

    async def run_uploads(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: upload dirty files nobody writes to any more (eager closes, a flush
        that failed, journal recovery), ``upload_concurrency`` at a time (fewer while the
        mount is busy: ``WrittenFiles.upload_limit``), in the order they were queued; failures are
        retried with backoff (1 s doubling up to 60 s). Runs the DELETE batches beside it."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.deletes.run)
            await nursery.start(self.written.run_removals)
            self._bg = nursery
            task_status.started()
            started: set[str] = set()

            async def one(name: str, entry: CacheEntry) -> None:
                try:
                    await self.upload(entry, give_way=True)
                except Superseded:
                    pass  # written again: its last close queues it (or queued it)
                except FsError:
                    pass  # logged, and queued again (or kept as a conflict copy)
                except Exception:  # noqa: BLE001 — never let the uploader die
                    log.exception("uploading %s/%s", entry.bucket, entry.key)
                    self.written.upload_failed(entry, "internal error (see the log)")
                finally:
                    started.discard(name)
                    self.written.kick()

            while True:
                now = trio.current_time()
                next_at = self.written.release_waiting(now)  # their write-back delay is over
                limit = self.written.upload_limit(now)
                if limit < self.upload_concurrency:  # busy: look again once the mount is
                    # idle, and at the bounds now and then meanwhile
                    next_at = min(next_at, self.written.idle_at(),
                                  now + self.written.backlog_check_every)
                for name, entry, at in self.written.ready(now) if len(started) < limit else ():
                    if name in started:
                        continue
                    if at > now:
                        next_at = min(next_at, at)
                        continue
                    started.add(name)
                    nursery.start_soon(one, name, entry)
                    if len(started) >= limit:
                        break
                await self.written.wait_for_work(next_at, holding_back=limit == 0)

    # ------------------------------------------------------- sync and status

    def _entry_path(self, entry: CacheEntry) -> str:
        return self.catalog.path_of(entry.bucket, entry.key, (entry.meta or {}).get("view") or "")

    def _scratch(self, entry: CacheEntry) -> bool:
        vs = self.catalog.get(entry.meta.get("view"))
        return vs is not None and not self.catalog.can_match(vs, entry.key, entry.size,
                                                             final_tags(entry, vs, None))

    def upload_report(self) -> list[dict]:
        """One entry per dirty file that is to be uploaded (scratch files excepted) and per
        queued DELETE: ``{"path", "state", "error", "size", "since"}`` (``delvefs status``)."""
        out = []
        for entry in self.written.entries():
            if entry.meta is None or (not entry.meta.get("conflict") and self._scratch(entry)):
                continue
            state, error = self.written.upload_state(entry)
            out.append({"path": self._entry_path(entry), "state": state, "error": error,
                        "size": entry.size, "since": entry.meta.get("since") or time.time()})
        for (bucket, key), d in self.deletes.each():
            out.append({"path": self.catalog.path_of(bucket, key),
                        "state": "failed" if d["error"] else "pending",
                        "error": d["error"] and f"DELETE: {d['error']}", "size": 0,
                        "since": d["since"], "op": "delete"})
        return out

    async def sync_all(self) -> list[str]:
        """``delvefs sync``: upload every closed dirty file and send every queued DELETE
        now (ignoring backoff), and wait for them; one line per failure (conflict copies
        included: ``PATH: reason``)."""
        failures: list[str] = []
        limiter = trio.CapacityLimiter(self.upload_concurrency)

        async def one(entry: CacheEntry) -> None:
            async with limiter:
                try:
                    await self.upload(entry)
                except FsError as exc:
                    if not (entry.meta or {}).get("conflict"):
                        failures.append(f"{self._entry_path(entry)}: {exc}")
        async with trio.open_nursery() as nursery:
            for entry in self.written.entries():
                if entry.writers == 0 and entry.meta is not None and not entry.meta.get("conflict"):
                    nursery.start_soon(one, entry)
            if self.deletes:
                nursery.start_soon(self.deletes.send_all)
        for (bucket, key), d in self.deletes.each():
            failures.append(f"{bucket}/{key}: DELETE failed: {d['error']}")
        for entry in self.written.entries():
            state, reason = self.written.upload_state(entry)
            if state == "conflict":
                failures.append(f"{self._entry_path(entry)}: conflict copy (not uploaded): {reason}")
        await trio.to_thread.run_sync(self.written.settle_removals)  # the journal settled too
        return failures

    # ------------------------------------------------------- mount and unmount

    def recover(self) -> None:
        """Dirty files journaled by an earlier mount of this cache dir: shown again in
        their views and uploaded (conditionally) by the background uploader."""
        for entry in self.written.restore():
            vs = self.catalog.get(entry.meta.get("view"))
            if vs is not None and entry.bucket == vs.bucket:
                self.tree.show_dirty(vs, entry, notify=False)
            if entry.meta.get("conflict"):
                log.info("conflict copy %s/%s kept from an earlier mount", entry.bucket, entry.key)
                continue
            log.info("recovered dirty file %s/%s from the journal: uploading", entry.bucket, entry.key)
            self.written.queue(entry, wait=False)

    def scratch_files(self) -> list[str]:
        """Mount paths (VIEW/relative path) of dirty files whose names cannot match."""
        return sorted(self._entry_path(e) for e in self.written.entries()
                      if not e.meta.get("conflict") and self._scratch(e))

    async def shutdown(self) -> tuple[list[str], list[str]]:
        """Unmount: upload everything dirty (files still open too) and send the queued
        DELETEs. Returns (what could not be uploaded or deleted, with the reason; scratch
        files and conflict copies left behind)."""
        failed, scratch = [], []
        limiter = trio.CapacityLimiter(self.upload_concurrency)

        async def one(entry: CacheEntry) -> None:
            async with limiter:
                try:
                    if not await self.upload(entry) and not entry.meta.get("conflict"):
                        scratch.append(self._entry_path(entry))
                except FsError as exc:
                    if not (entry.meta or {}).get("conflict"):
                        failed.append(f"{entry.bucket}/{entry.key}: {exc}")
        async with trio.open_nursery() as nursery:
            for entry in self.written.entries():
                nursery.start_soon(one, entry)
        if self.deletes:
            for (bucket, key), reason in (await self.deletes.send_all()).items():
                failed.append(f"{bucket}/{key}: DELETE failed: {reason}")
        await trio.to_thread.run_sync(self.written.settle_removals)
        return failed, sorted(scratch)

    def conflict_copies(self) -> list[str]:
        """Lines for the unmount report: each conflict copy left in the cache directory."""
        out = []
        for entry in self.written.entries():
            c = (entry.meta or {}).get("conflict")
            if c:
                out.append(f"{self._entry_path(entry)} (S3 kept another writer's version of "
                           f"{c.get('key')}: {c.get('reason')})")
        return sorted(out)

    # ------------------------------------------------------- parts sent while written

    def stream(self, entry: CacheEntry, start: int, end: int) -> None:
        """Strict mode: the full parts of a large new file go to S3 while it is written
        (``delvefs.client.mount.fs.multipart``)."""
        if self._bg is None:  # the uploader is not running (a core without a mount)
            return
        name = os.path.basename(entry.path)
        st = self._streams.get(name)
        if st is None:
            part = getattr(self.store, "part_size", None)
            meta = entry.meta
            if part is None or entry.size < part or meta is None or meta.get("conflict") \
                    or entry.source is not None:  # a sparse file: rebuilt at close instead
                return
            # an overwritten object keeps its tags: known without a request only when this
            # mount wrote that version (dd closes its file once empty, then writes it)
            vs = self.catalog.get(meta.get("view"))
            remote = None
            if meta.get("base"):
                remote = self.properties.known_tags(entry.bucket, entry.key, meta["base"], vs)
                if remote is None:
                    return
            elif meta.get("base") is None:
                return
            tags = final_tags(entry, vs, remote)
            if vs is None or not self.catalog.can_match(vs, entry.key, entry.size, tags):
                return
            ctype = mimetypes.guess_type(entry.key)[0] or "application/octet-stream"
            st = self._streams[name] = PartStream(self.store, entry, tags, ctype, part)
        st.touched(start, end)
        st.pump(self._bg, end)

    def truncated(self, entry: CacheEntry, size: int) -> None:
        """The entry was truncated: parts sent of what changed are sent again."""
        st = self._streams.get(os.path.basename(entry.path))
        if st is not None:
            st.truncated(size)

    def drop_stream(self, entry: CacheEntry):
        st = self._streams.pop(os.path.basename(entry.path), None)
        if st is not None and self._bg is not None:
            self._bg.start_soon(st.abort)
        return st
