"""The write path: dirty files, conditional whole-object uploads, conflicts, eager mode,
batched deletes, retries, recovery, shutdown.

A file opened for writing is a dirty cache entry: a local file of its own, journaled
before its first byte (``delvefs.client.fs.dirty``) with the version it is based on (the
ETag it was opened from, "" for a new file). Its upload is conditional on that version
(If-Match / If-None-Match: *): when S3 has another version by then, the local copy is kept
as a *conflict copy* ``NAME.conflict-<UTC time>`` beside it (a local file of this mount,
never uploaded; ``_conflict``) and the other writer's object stays.

Strict mode (the default): the last writing handle's ``flush`` (close(2) returns its
error), ``fsync`` and a truncate(2) without an open handle upload the whole object
(``_upload``: the view's ``set`` tags merged in, Content-Type from the name); a release
that leaves it dirty hands it to ``run_uploads`` (background retries with backoff).
Eager mode (``eager``): ``flush`` returns once the file's journal record is written (not
fsync'd: a killed mount loses nothing, a machine crash may lose the last closes);
``run_uploads`` uploads up to ``upload_concurrency`` files at a time, and unlinks queue
their DELETEs for ``run_deletes`` (DeleteObjects batches). ``fsync`` and ``sync_all``
(``delvefs sync``) wait for the uploads. ``shutdown`` uploads the rest at unmount.

A file whose key cannot match its view (``can_match``, the compiled matcher) is a
*scratch* file: never uploaded until a rename gives it a matching name. After an upload
the change is applied to every view of the bucket in this mount at once and kept in the
views' overlay until the handler's delta shows it (by ETag) or ``overlay_bound`` passes
(``delvefs.client.fs.tree``).

Uploads, renames and unlinks of one dirty entry are serialized by the entry's lock
(``_entry_lock``): an unlink or rename never races an upload into a junk object. Writes
are not locked: a write during an upload bumps the entry's ``gen``, so the entry stays
dirty and is uploaded again. An upload of a key whose DELETE is still queued sends that
delete first (``_settle_delete``).
"""
from __future__ import annotations

import errno
import logging
import math
import mimetypes
import os
import time

import trio

from ..datacache import CacheEntry
from ..errors import (Changed, FsError, StoreError, cache_failure, download_failed, read_only,
                      store_failure)
from .inodes import File, Node, relative_path
from .parts import PartStream
from .reads import FileHandle
from .tree import Pending
from .views import ViewState

log = logging.getLogger(__name__)


class Writes:
    """The write path of :class:`delvefs.client.fs.core.FileSystem`."""

    def _entry_lock(self, entry: CacheEntry) -> trio.Lock:
        return self._locks.setdefault(os.path.basename(entry.path), trio.Lock())

    def _dirtied(self, vs: ViewState, node: File, entry: CacheEntry) -> None:
        vs.overlay[entry.key] = Pending("local", None, math.inf)
        self._served.pop(node.ino, None)
        node.size = entry.size
        node.mtime_ns = time.time_ns()
        self._sizes(entry)

    def _sizes(self, entry: CacheEntry) -> None:
        """The entry's size on the nodes of its key in every view that shows the local
        content (a file opened through several views)."""
        now = time.time_ns()
        for vs in self.views:
            p = vs.overlay.get(entry.key) if vs.bucket == entry.bucket else None
            if p is not None and p.kind == "local":
                node = self._find(vs, entry.key)
                if node is not None and not node.is_dir:
                    node.size, node.mtime_ns = entry.size, now

    async def _make_writable(self, node: File, *, truncate: bool) -> CacheEntry:
        """The dirty local copy of ``node`` (downloaded first unless truncating)."""
        vs = node.parent.view
        entry = self.cache.get(vs.bucket, node.key)
        held = None  # the downloaded entry, kept open (never evicted) until it is taken over
        base = node.etag
        if not (entry is not None and entry.dirty) and not truncate and node.size > 0:
            bucket, key = vs.bucket, node.key
            try:
                held, _ = await self.cache.fetch(self.store, bucket, key, etag=node.etag,
                                                 size=node.size, ttl=vs.ttl)
            except StoreError as exc:
                raise store_failure(exc, "downloading for writing", bucket, key) from exc
            try:
                dl = held.download
                if dl is not None:
                    await dl.wait_finished()
                    if dl.error is not None:
                        raise download_failed(f"downloading {bucket}/{key} failed")
                if node.gone:
                    raise FsError(errno.ENOENT, f"{key}: removed meanwhile")
            except BaseException:
                self.cache.release(held)
                raise
            base = held.etag or base  # the version whose bytes it starts from
            vs = node.parent.view
        bucket, key = vs.bucket, node.key
        try:
            entry = self.dirty.take(
                bucket, key, view=vs.name, base=base or "", truncate=truncate,
                held=int(held is not None and self.cache.get(bucket, key) is held))
        except StoreError as exc:
            raise store_failure(exc, "writing", bucket, key) from exc
        finally:
            if held is not None:
                self.cache.release(held)
        self._dirtied(vs, node, entry)
        return entry

    def _writer(self, node: File, entry: CacheEntry, what: str) -> int:
        """A handle writing to ``node`` through its dirty ``entry``."""
        try:
            fd = os.open(entry.path, os.O_RDWR)
        except OSError as exc:
            raise cache_failure(exc, what, entry) from exc
        fh = next(self._fh)
        h = self.files[fh] = FileHandle(node, writer=True)
        h.fd, h.entry = fd, entry
        self.dirty.add_writer(entry)
        return fh

    async def _open_writer(self, node: File, *, truncate: bool) -> int:
        if node.gone:
            raise FsError(errno.ENOENT, f"{node.name}: removed")
        entry = await self._make_writable(node, truncate=truncate)
        return self._writer(node, entry, "opening")

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[int, File]:
        """Create (or, without O_EXCL, open for writing) the file ``name``: a handle and
        the node (its lookup count + 1)."""
        self._request_seen()
        parent, vs = self._writable_dir(parent_ino)
        key = self._key_for(parent, vs, name)
        await self._fresh(vs)
        existing = parent.children.get(name)
        if existing is not None:
            if existing.is_dir:
                raise FsError(errno.EISDIR)
            if flags & os.O_EXCL:
                raise FsError(errno.EEXIST)
            fh = await self._open_writer(existing, truncate=bool(flags & os.O_TRUNC))
            self.table.ref(existing)
            return fh, existing
        implied = self._implied_tags(parent, key)  # layout by properties: tags from its directories
        try:
            entry = self.dirty.take(vs.bucket, key, view=vs.name, base="", truncate=True)
            if implied is not None:
                self.dirty.update_record(entry, **implied)
        except StoreError as exc:
            raise store_failure(exc, "creating", vs.bucket, key) from exc
        node = self._put(vs, {"key": key, "size": 0, "mtime": time.time(), "etag": ""},
                         notify=False, remote=False)
        if node is None or node.is_dir:  # cannot happen: the name was checked
            self.dirty.discard(entry)
            raise FsError(errno.EINVAL, f"{key}: cannot be created")
        self._dirtied(vs, node, entry)
        fh = self._writer(node, entry, "creating")
        self.table.ref(node)
        return fh, node

    async def write(self, fh: int, off: int, data: bytes) -> int:
        self._request_seen()
        h = self.files.get(fh)
        if h is None or not h.writer:
            raise FsError(errno.EBADF)
        entry, node = h.entry, h.node
        if node.gone or self.cache.get(entry.bucket, entry.key) is not entry:
            # unlinked (or replaced by a rename) while open: the data goes nowhere (as on
            # any file system)
            return os.pwrite(h.fd, data, off)
        try:
            if not entry.dirty:  # uploaded by an fsync/flush, written again through this handle
                vs = node.parent.view
                self.dirty.redirty(entry, vs.name)
                self._dirtied(vs, node, entry)
            self.dirty.journal(entry)
        except StoreError as exc:
            raise store_failure(exc, "writing", entry.bucket, entry.key) from exc
        try:
            n = os.pwrite(h.fd, data, off)
        except OSError as exc:
            raise cache_failure(exc, "writing", entry) from exc
        grew = off + n > entry.size
        self.dirty.written(entry, off + n)
        node.size = entry.size
        node.mtime_ns = time.time_ns()
        if grew:
            self._sizes(entry)
        if self.stream_parts and self._bg is not None and not self.eager:
            self._stream(entry, off, off + n)
        return n

    def _stream(self, entry: CacheEntry, start: int, end: int) -> None:
        """Strict mode: the full parts of a large new file go to S3 while it is written
        (``delvefs.client.fs.parts``)."""
        name = os.path.basename(entry.path)
        st = self._streams.get(name)
        if st is None:
            part = getattr(self.store, "part_size", None)
            meta = entry.meta
            if part is None or entry.size < part or meta is None or meta.get("conflict"):
                return
            # an overwritten object keeps its tags: known without a request only when this
            # mount uploaded that version (dd closes its file once empty, then writes it)
            remote = None
            if meta.get("base"):
                own = self._own_tags.get((entry.bucket, entry.key))
                if own is None or own[0] != meta["base"]:
                    return
                remote = own[1]
            elif meta.get("base") is None:
                return
            vs = self.by_name.get(meta.get("view"))
            tags = self._final_tags(entry, vs, remote)
            if vs is None or not self.can_match(vs, entry.key, entry.size, tags):
                return
            ctype = mimetypes.guess_type(entry.key)[0] or "application/octet-stream"
            st = self._streams[name] = PartStream(self.store, entry, tags, ctype, part)
        st.touched(start, end)
        st.pump(self._bg, end)

    def _drop_stream(self, entry: CacheEntry):
        st = self._streams.pop(os.path.basename(entry.path), None)
        if st is not None and self._bg is not None:
            self._bg.start_soon(st.abort)
        return st

    def _live(self, h: FileHandle) -> bool:
        """The handle's entry is still the file of a key (not unlinked, not replaced)."""
        e = h.entry
        return e.dirty and self.cache.get(e.bucket, e.key) is e

    async def flush(self, fh: int) -> None:
        """close(2) of a descriptor: the last writing handle uploads (errors returned); in
        eager mode it only makes the file safe in the journal and queues the upload."""
        self._request_seen()
        h = self.files.get(fh)
        if h is None or not h.writer:
            return
        entry = h.entry
        if entry.writers <= 1 and self._live(h):
            if self.eager:
                self._persist(entry)
                self._schedule(entry)
            else:
                await self._upload(entry)

    def _persist(self, entry: CacheEntry) -> None:
        """Eager close: the record on disk (written on the loop when it is not there yet; not
        fsync'd, see ``DirtyFiles.persist``) before close returns."""
        try:
            self.dirty.persist(entry)
        except StoreError as exc:
            raise store_failure(exc, "journaling", entry.bucket, entry.key) from exc

    async def fsync(self, fh: int) -> None:
        h = self.files.get(fh)
        if h is None or not h.writer:
            return
        if self._live(h):
            if not await self._upload(h.entry):
                log.info("fsync of scratch file %s/%s: kept local (its name cannot match view %s)",
                         h.entry.bucket, h.entry.key, h.entry.meta.get("view"))

    async def setattr(self, ino: int, *, size: int | None = None, fh: int | None = None) -> Node:
        """chmod/chown/utimens are accepted and not stored; a size truncates the local
        copy (uploaded at once when no handle writes to it: truncate(2))."""
        node = self._node(ino)
        vs = node.view if node.is_dir else node.parent.view
        if vs is not None and not vs.writable:
            raise read_only(vs.name)
        if size is None:
            return node
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if node.gone:
            raise FsError(errno.ENOENT)
        h = self.files.get(fh) if fh is not None else None
        if h is not None and h.writer and h.node is node:
            entry = h.entry
            if not entry.dirty:
                try:
                    self.dirty.redirty(entry, vs.name)
                except StoreError as exc:
                    raise store_failure(exc, "truncating", entry.bucket, entry.key) from exc
        else:
            entry = await self._make_writable(node, truncate=size == 0)
        try:
            self.dirty.truncate(entry, size)
        except StoreError as exc:
            raise store_failure(exc, "truncating", entry.bucket, entry.key) from exc
        st = self._streams.get(os.path.basename(entry.path))
        if st is not None:
            st.truncated(size)
        self._dirtied(node.parent.view, node, entry)
        self._sizes(entry)
        if entry.writers == 0:
            if self.eager:
                self._persist(entry)
                self._schedule(entry)
            else:
                await self._upload(entry)
        return node

    # ------------------------------------------------------------ uploads

    def _schedule(self, entry: CacheEntry, *, failed: bool = False) -> None:
        name = os.path.basename(entry.path)
        self._pending[name] = entry
        if not entry.journaled:  # left to the background: must survive a crash now
            try:
                self.dirty.journal(entry)
            except StoreError as exc:
                log.warning("journal of %s/%s: %s", entry.bucket, entry.key, exc)
        if failed:
            _, delay = self._retry.get(name, (0.0, 0.0))
            delay = min(self.retry_max, max(self.retry_initial, delay * 2))
            self._retry[name] = (trio.current_time() + delay, delay)
        self._kick.set()

    def _unschedule(self, entry: CacheEntry) -> None:
        name = os.path.basename(entry.path)
        self._drop_stream(entry)
        self._pending.pop(name, None)
        self._retry.pop(name, None)
        self._failures.pop(name, None)

    def _upload_failed(self, entry: CacheEntry, reason: str) -> None:
        self._failures[os.path.basename(entry.path)] = reason
        self._schedule(entry, failed=True)

    def _final_tags(self, entry: CacheEntry, vs: ViewState | None, remote: dict | None) -> dict:
        tags = dict(remote or {})
        if vs is not None:
            tags.update(vs.set)
        tags.update(entry.meta.get("tags") or {})
        for t in entry.meta.get("untag") or ():
            tags.pop(t, None)
        return tags

    async def _upload(self, entry: CacheEntry) -> bool:
        """Upload a dirty entry as its object, conditional on the version it is based on:
        True when uploaded (or clean already), False when it is a scratch file (its name
        cannot match its view) or a conflict copy. Raises FsError (one log line naming the
        object); the entry then stays dirty and is retried — or, when S3 has another
        version, is kept as a conflict copy (EIO)."""
        async with self._entry_lock(entry):
            if not entry.dirty or entry.meta is None:
                return True
            if entry.meta.get("conflict"):
                return False
            bucket, key, meta = entry.bucket, entry.key, entry.meta
            vs = self.by_name.get(meta.get("view"))
            base = meta.get("base")
            remote = None
            try:
                await self._settle_delete(bucket, key)
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
                if base:
                    try:
                        remote = await self.store.tags(bucket, key)
                    except StoreError as exc:
                        if exc.errno == errno.ENOENT:
                            raise Changed(f"{bucket}/{key}: the object this file was based on "
                                          "was deleted meanwhile") from None
                        raise
            except Changed as exc:
                await self._conflict(entry, str(exc))
                raise FsError(errno.EIO, str(exc), logged=True) from exc
            except StoreError as exc:
                self._upload_failed(entry, str(exc))
                raise store_failure(exc, "uploading (tags of)", bucket, key) from exc
            if not entry.dirty or entry.meta is None:
                return True
            tags = self._final_tags(entry, vs, remote)
            size = entry.size
            if vs is not None and not self.can_match(vs, key, size, tags):
                self._unschedule(entry)
                return False
            gen = entry.gen
            ctype = mimetypes.guess_type(key)[0] or "application/octet-stream"
            name = os.path.basename(entry.path)
            self._uploading.add(name)
            try:
                info = await self._send(entry, size, tags, ctype, base)
            except Changed as exc:
                await self._conflict(entry, str(exc))
                raise FsError(errno.EIO, str(exc), logged=True) from exc
            except StoreError as exc:
                self._upload_failed(entry, str(exc))
                raise store_failure(exc, "uploading", bucket, key) from exc
            finally:
                self._uploading.discard(name)
            self.uploads += 1
            self._unschedule(entry)
            self._own_tags[(bucket, key)] = (info["etag"], tags)
            self._own_tags.move_to_end((bucket, key))
            if len(self._own_tags) > 4096:
                self._own_tags.popitem(last=False)
            obj = {"key": key, "size": size, "mtime": info.get("mtime") or time.time(),
                   "etag": info["etag"]}
            still_dirty = entry.gen != gen or not entry.dirty
            if not still_dirty:
                self.dirty.uploaded(entry, info["etag"])
            else:
                if entry.meta is not None:
                    self.dirty.update_record(entry, base=info["etag"])
                self._schedule(entry)
            self._props.clear()
            self._local_put(bucket, key, obj, tags, keep_local=still_dirty, quiet=vs)
            return True

    async def _send(self, entry: CacheEntry, size: int, tags: dict, ctype: str,
                    base: str | None) -> dict:
        """The upload itself: completing the parts sent while the file was written when
        they fit (same key, tags, type), else the whole file."""
        st = self._streams.pop(os.path.basename(entry.path), None)
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
                                       tags=tags, content_type=ctype, base=base)

    async def _conflict(self, entry: CacheEntry, reason: str) -> None:
        """S3 has another version of the entry's key than the one it was based on: the
        other writer's object stays; the local content becomes the conflict copy
        ``KEY.conflict-<UTC time>`` of this mount (shown beside it, never uploaded), and the
        key shows what S3 has."""
        bucket, key = entry.bucket, entry.key
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        new_key, n = f"{key}.conflict-{stamp}", 1
        while self.cache.get(bucket, new_key) is not None:
            n += 1
            new_key = f"{key}.conflict-{stamp}-{n}"
        view = entry.meta.get("view")
        self._unschedule(entry)
        self.dirty.rekey(entry, bucket, new_key)
        self.dirty.update_record(entry, conflict={"key": key, "at": stamp, "reason": reason},
                                 base="")
        try:
            self.dirty.journal(entry)
        except StoreError as exc:
            log.warning("journal of conflict copy %s/%s: %s", bucket, new_key, exc)
        vs = self.by_name.get(view)
        path = f"{vs.name}/{relative_path(vs, new_key) or new_key}" if vs else f"{bucket}/{new_key}"
        self.conflicts.append({"path": path, "key": key, "bucket": bucket, "reason": reason,
                               "at": stamp})
        log.warning("conflict: %s/%s changed in S3 since this file was opened (%s): the other "
                    "version stays, this mount's copy is kept as %s (not uploaded)",
                    bucket, key, reason, path)
        for v in self.views:
            if v.bucket != bucket:
                continue
            p = v.overlay.get(key)
            if p is not None and p.kind == "local":
                del v.overlay[key]
            if v is vs:
                node = self._put(v, {"key": new_key, "size": entry.size, "mtime": time.time(),
                                     "etag": ""}, notify=True, remote=False)
                if node is not None and not node.is_dir:
                    v.overlay[new_key] = Pending("local", None, math.inf)
        # what S3 has at the key now (the other writer's version, or nothing)
        try:
            info = await self.store.head(bucket, key)
        except StoreError as exc:
            if exc.errno == errno.ENOENT:
                self._local_delete(bucket, key)
            return
        tags = {}
        if self._needs_tags(bucket):
            try:
                tags = await self.store.tags(bucket, key)
            except StoreError:
                pass
        self._local_put(bucket, key, {"key": key, "size": info["size"], "mtime": info["mtime"],
                                      "etag": info["etag"]}, tags)

    async def run_uploads(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: upload dirty files nobody writes to any more (eager closes, a flush
        that failed, journal recovery), ``upload_concurrency`` at a time (fewer while the
        mount is busy: ``_upload_limit``), in the order they were queued; failures are retried with backoff (1 s doubling up to 60 s). Runs the
        DELETE batcher (``run_deletes``) beside it."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.run_deletes)
            await nursery.start(self.cache.run_removals)
            self._bg = nursery
            task_status.started()
            started: set[str] = set()

            async def one(name: str, entry: CacheEntry) -> None:
                try:
                    await self._upload(entry)
                except FsError:
                    pass  # logged, and scheduled again (or kept as a conflict copy)
                except Exception:  # noqa: BLE001 — never let the uploader die
                    log.exception("uploading %s/%s", entry.bucket, entry.key)
                    self._upload_failed(entry, "internal error (see the log)")
                finally:
                    started.discard(name)
                    self._kick.set()

            while True:
                kick = self._kick = trio.Event()
                now = trio.current_time()
                limit = self._upload_limit(now)
                next_at = math.inf
                if limit < self.upload_concurrency:  # busy: look again once the mount is idle
                    next_at = self._last_request + self.upload_idle
                for name, entry in list(self._pending.items()) if len(started) < limit else ():
                    if not entry.dirty or entry.meta is None or entry.writers:
                        self._pending.pop(name, None)  # clean, gone, or its last close uploads
                        continue
                    if name in started:
                        continue
                    at, _ = self._retry.get(name, (now, 0.0))
                    if at > now:
                        next_at = min(next_at, at)
                        continue
                    started.add(name)
                    nursery.start_soon(one, name, entry)
                    if len(started) >= limit:
                        break
                with trio.move_on_at(next_at):
                    await kick.wait()

    # Background uploads give way to the mount's requests (they compete for the loop and the
    # CPU; measured: even 1-2 uploads beside an untar cost as much as 16): all of
    # ``upload_concurrency`` run once no request came for ``upload_idle`` seconds or the
    # backlog passes a bound (as the kernel's dirty_background_* limits), else
    # ``upload_busy`` at a time. sync, fsync and unmount upload at once, whatever this says.
    upload_idle = 0.075
    upload_busy = 0
    backlog_files = 1024
    backlog_bytes = 256 << 20
    backlog_age = 10.0
    _last_request = -math.inf

    def _request_seen(self) -> None:
        """A create/write/close came (cheap: called for every write)."""
        self._last_request = trio.current_time()

    def _upload_limit(self, now: float) -> int:
        """How many background uploads may run now."""
        if now - self._last_request >= self.upload_idle or len(self._pending) >= self.backlog_files:
            return self.upload_concurrency
        oldest = next(iter(self._pending.values()), None)
        if oldest is not None and oldest.meta is not None \
                and time.time() - oldest.meta.get("since", time.time()) >= self.backlog_age:
            return self.upload_concurrency
        if sum(e.size for e in self._pending.values()) >= self.backlog_bytes:
            return self.upload_concurrency
        return min(self.upload_busy, self.upload_concurrency)  # 0: none until idle

    # ------------------------------------------------------------ deletes (eager)

    def _queue_delete(self, bucket: str, key: str) -> None:
        """Eager unlink: the DELETE is sent by ``run_deletes`` in a DeleteObjects batch."""
        self._deletes[(bucket, key)] = {"since": time.time(), "at": 0.0, "delay": 0.0,
                                        "error": None}
        self._delete_kick.set()

    async def _settle_delete(self, bucket: str, key: str) -> None:
        """An upload of ``key`` waits until a queued DELETE of it has been sent (or raises
        its failure): the delete must not remove the new object, nor the old one fail the
        upload's condition."""
        while (bucket, key) in self._deletes:
            d = self._deletes[(bucket, key)]
            if d["error"] is not None and d["at"] > trio.current_time():
                raise StoreError(errno.EIO, f"the DELETE queued before it failed: {d['error']}")
            self._delete_now = True
            self._delete_kick.set()
            await self._deletes_sent.wait()

    async def run_deletes(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: send queued DELETEs in DeleteObjects batches of up to 1,000 keys per
        bucket, once a batch is full or no unlink came for ``delete_gather`` seconds; a key
        that failed is retried with backoff."""
        task_status.started()
        while True:
            kick = self._delete_kick = trio.Event()
            now = trio.current_time()
            due = [k for k, d in self._deletes.items() if d["at"] <= now]
            if not due:
                later = [d["at"] for d in self._deletes.values()]
                with trio.move_on_at(min(later, default=math.inf)):
                    await kick.wait()
                continue
            if not self._delete_now and len(due) < 1000:
                # gather: more unlinks usually follow (rm -r)
                with trio.move_on_after(self.delete_gather):
                    await kick.wait()
                if self._delete_kick.is_set():
                    continue
            self._delete_now = False
            await self._send_deletes()

    async def _send_deletes(self) -> dict[tuple[str, str], str]:
        """Send every due DELETE (batches of 1,000 per bucket, a few at once); the reason of
        each one that failed."""
        now = trio.current_time()
        by_bucket: dict[str, list[str]] = {}
        for (bucket, key), d in list(self._deletes.items()):
            if d["at"] <= now:
                by_bucket.setdefault(bucket, []).append(key)
        failed: dict[tuple[str, str], str] = {}
        limiter = trio.CapacityLimiter(4)

        async def batch(bucket: str, keys: list[str]) -> None:
            async with limiter:
                errors = await self.store.delete_many(bucket, keys)
            log.info("DeleteObjects %s: %d keys, %d failed", bucket, len(keys), len(errors))
            for key in keys:
                d = self._deletes.get((bucket, key))
                exc = errors.get(key)
                if exc is None or exc.errno == errno.ENOENT:
                    self._deletes.pop((bucket, key), None)
                    continue
                failed[(bucket, key)] = str(exc)
                if d is not None:
                    log.warning("deleting %s/%s: %s", bucket, key, exc)
                    d["error"] = str(exc)
                    d["delay"] = min(self.retry_max, max(self.retry_initial, d["delay"] * 2))
                    d["at"] = trio.current_time() + d["delay"]
        async with trio.open_nursery() as nursery:
            for bucket, keys in by_bucket.items():
                for i in range(0, len(keys), 1000):
                    nursery.start_soon(batch, bucket, keys[i:i + 1000])
        sent, self._deletes_sent = self._deletes_sent, trio.Event()
        sent.set()
        return failed

    # ------------------------------------------------------- sync and status

    def _entry_path(self, entry: CacheEntry) -> str:
        vs = self.by_name.get((entry.meta or {}).get("view"))
        if vs is None:
            return f"{entry.bucket}/{entry.key}"
        return f"{vs.name}/{relative_path(vs, entry.key) or entry.key}"

    def _scratch(self, entry: CacheEntry) -> bool:
        vs = self.by_name.get(entry.meta.get("view"))
        return vs is not None and not self.can_match(vs, entry.key, entry.size,
                                                     self._final_tags(entry, vs, None))

    def upload_state(self, entry: CacheEntry) -> tuple[str, str | None]:
        """(state, reason) of a dirty entry: pending, uploading, failed or conflict."""
        name = os.path.basename(entry.path)
        conflict = (entry.meta or {}).get("conflict")
        if conflict:
            return "conflict", f"S3 has another version of {conflict.get('key')}: {conflict.get('reason')}"
        if name in self._uploading:
            return "uploading", None
        if name in self._failures:
            return "failed", self._failures[name]
        return "pending", None

    def upload_report(self) -> list[dict]:
        """One entry per dirty file that is to be uploaded (scratch files excepted) and per
        queued DELETE: ``{"path", "state", "error", "size", "since"}`` (``delvefs status``)."""
        out = []
        for entry in self.dirty.entries():
            if entry.meta is None or (not entry.meta.get("conflict") and self._scratch(entry)):
                continue
            state, error = self.upload_state(entry)
            out.append({"path": self._entry_path(entry), "state": state, "error": error,
                        "size": entry.size, "since": entry.meta.get("since") or time.time()})
        for (bucket, key), d in self._deletes.items():
            path = f"{bucket}/{key}"
            for vs in self.views:
                rel = relative_path(vs, key) if vs.bucket == bucket else None
                if rel is not None:
                    path = f"{vs.name}/{rel}"
                    break
            out.append({"path": path, "state": "failed" if d["error"] else "pending",
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
                    await self._upload(entry)
                except FsError as exc:
                    if not (entry.meta or {}).get("conflict"):
                        failures.append(f"{self._entry_path(entry)}: {exc}")
        async with trio.open_nursery() as nursery:
            for entry in self.dirty.entries():
                if entry.writers == 0 and entry.meta is not None and not entry.meta.get("conflict"):
                    nursery.start_soon(one, entry)
            if self._deletes:
                for d in self._deletes.values():
                    d["at"] = 0.0
                nursery.start_soon(self._send_deletes)
        for (bucket, key), d in self._deletes.items():
            failures.append(f"{bucket}/{key}: DELETE failed: {d['error']}")
        for entry in self.dirty.entries():
            state, reason = self.upload_state(entry)
            if state == "conflict":
                failures.append(f"{self._entry_path(entry)}: conflict copy (not uploaded): {reason}")
        await trio.to_thread.run_sync(self.cache.remove_doomed)  # the journal settled too
        return failures

    # ------------------------------------------------------- mount and unmount

    def recover(self) -> None:
        """Dirty files journaled by an earlier mount of this cache dir: shown again in
        their views and uploaded (conditionally) by the background uploader."""
        for entry in self.dirty.restore():
            vs = self.by_name.get(entry.meta.get("view"))
            if vs is not None and entry.bucket == vs.bucket:
                node = self._put(vs, {"key": entry.key, "size": entry.size, "mtime": time.time(),
                                      "etag": ""}, notify=False, remote=False)
                if node is not None and not node.is_dir:
                    vs.overlay[entry.key] = Pending("local", None, math.inf)
            if entry.meta.get("conflict"):
                log.info("conflict copy %s/%s kept from an earlier mount", entry.bucket, entry.key)
                continue
            log.info("recovered dirty file %s/%s from the journal: uploading", entry.bucket, entry.key)
            self._schedule(entry)

    def scratch_files(self) -> list[str]:
        """Mount paths (VIEW/relative path) of dirty files whose names cannot match."""
        return sorted(self._entry_path(e) for e in self.dirty.entries()
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
                    if not await self._upload(entry) and not entry.meta.get("conflict"):
                        scratch.append(self._entry_path(entry))
                except FsError as exc:
                    if not (entry.meta or {}).get("conflict"):
                        failed.append(f"{entry.bucket}/{entry.key}: {exc}")
        async with trio.open_nursery() as nursery:
            for entry in self.dirty.entries():
                nursery.start_soon(one, entry)
        if self._deletes:
            for d in self._deletes.values():
                d["at"] = 0.0
            for (bucket, key), reason in (await self._send_deletes()).items():
                failed.append(f"{bucket}/{key}: DELETE failed: {reason}")
        await trio.to_thread.run_sync(self.cache.remove_doomed)
        return failed, sorted(scratch)

    def conflict_copies(self) -> list[str]:
        """Lines for the unmount report: each conflict copy left in the cache directory."""
        out = []
        for entry in self.dirty.entries():
            c = (entry.meta or {}).get("conflict")
            if c:
                out.append(f"{self._entry_path(entry)} (S3 kept another writer's version of "
                           f"{c.get('key')}: {c.get('reason')})")
        return sorted(out)
