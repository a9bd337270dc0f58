"""The write path: dirty files, whole-object uploads, retries, recovery, shutdown.

A file opened for writing is a dirty cache entry: a local file of its own, journaled
before its first byte (``delvefs.client.fs.dirty``). The last writing handle's ``flush``
(close(2) returns its error), ``fsync`` and a truncate(2) without an open handle upload
the whole object (``_upload``: the view's ``set`` tags merged in, Content-Type from the
name); a release that leaves it dirty hands it to ``run_uploads`` (background retries with
backoff); ``shutdown`` uploads the rest at unmount. A file whose key cannot match its view
(``can_match``, the compiled matcher) is a *scratch* file: never uploaded until a rename
gives it a matching name. After an upload the change is applied to every view of the
bucket in this mount at once and kept in the views' overlay until the handler's delta
shows it (by ETag) or ``overlay_bound`` passes (``delvefs.client.fs.tree``).

Uploads, renames and unlinks of one dirty entry are serialized by the entry's lock
(``_entry_lock``): an unlink or rename never races an upload into a junk object. Writes
are not locked: a write during an upload bumps the entry's ``gen``, so the entry stays
dirty and is uploaded again.
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
from ..errors import (FsError, StoreError, cache_failure, download_failed, read_only,
                      store_failure)
from .inodes import File, Node, relative_path
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

    async def _make_writable(self, node: File, *, truncate: bool) -> CacheEntry:
        """The dirty local copy of ``node`` (downloaded first unless truncating)."""
        vs = node.parent.view
        entry = self.cache.get(vs.bucket, node.key)
        held = None  # the downloaded entry, kept open (never evicted) until it is taken over
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
            vs = node.parent.view
        bucket, key = vs.bucket, node.key
        try:
            entry = self.dirty.take(
                bucket, key, view=vs.name, existing=bool(node.etag), truncate=truncate,
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
        try:
            entry = self.dirty.take(vs.bucket, key, view=vs.name, existing=False, truncate=True)
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
        h = self.files.get(fh)
        if h is None or not h.writer:
            raise FsError(errno.EBADF)
        entry, node = h.entry, h.node
        if node.gone:  # unlinked while open: the data goes nowhere (as on any file system)
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
        self.dirty.written(entry, off + n)
        node.size = entry.size
        node.mtime_ns = time.time_ns()
        return n

    async def flush(self, fh: int) -> None:
        """close(2) of a descriptor: the last writing handle uploads (errors returned)."""
        h = self.files.get(fh)
        if h is None or not h.writer:
            return
        entry = h.entry
        if entry.dirty and entry.writers <= 1 and not h.node.gone:
            await self._upload(entry)

    async def fsync(self, fh: int) -> None:
        h = self.files.get(fh)
        if h is None or not h.writer:
            return
        if h.entry.dirty and not h.node.gone:
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
        self._dirtied(node.parent.view, node, entry)
        if entry.writers == 0:
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
        self._pending.pop(name, None)
        self._retry.pop(name, None)

    def _final_tags(self, entry: CacheEntry, vs: ViewState | None, remote: dict | None) -> dict:
        tags = dict(remote or {})
        if vs is not None:
            tags.update(vs.set)
        tags.update(entry.meta.get("tags") or {})
        for t in entry.meta.get("untag") or ():
            tags.pop(t, None)
        return tags

    async def _upload(self, entry: CacheEntry) -> bool:
        """Upload a dirty entry as its object: True when uploaded (or clean already),
        False when it is a scratch file (its name cannot match its view). Raises FsError
        (one log line naming the object); the entry then stays dirty and is retried."""
        async with self._entry_lock(entry):
            if not entry.dirty or entry.meta is None:
                return True
            bucket, key, meta = entry.bucket, entry.key, entry.meta
            vs = self.by_name.get(meta.get("view"))
            remote = None
            if meta.get("existing"):
                try:
                    remote = await self.store.tags(bucket, key)
                except StoreError as exc:
                    self._schedule(entry, failed=True)
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
            try:
                info = await self.store.upload(bucket, key, entry.path, size=size, tags=tags,
                                               content_type=ctype)
            except StoreError as exc:
                self._schedule(entry, failed=True)
                raise store_failure(exc, "uploading", bucket, key) from exc
            self.uploads += 1
            self._unschedule(entry)
            obj = {"key": key, "size": size, "mtime": info.get("mtime") or time.time(),
                   "etag": info["etag"]}
            still_dirty = entry.gen != gen or not entry.dirty
            if not still_dirty:
                self.dirty.uploaded(entry, info["etag"])
            else:
                self._schedule(entry)
            self._props.clear()
            self._local_put(bucket, key, obj, tags, keep_local=still_dirty, quiet=vs)
            return True

    async def run_uploads(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: upload dirty files nobody writes to any more (a flush that failed,
        journal recovery), retrying failures with backoff (1 s doubling up to 60 s)."""
        task_status.started()
        while True:
            kick = self._kick = trio.Event()
            now = trio.current_time()
            next_at = math.inf
            for name, entry in list(self._pending.items()):
                if not entry.dirty or entry.meta is None or entry.writers:
                    self._pending.pop(name, None)  # clean, gone, or its last close uploads
                    continue
                at, _ = self._retry.get(name, (now, 0.0))
                if at > now:
                    next_at = min(next_at, at)
                    continue
                try:
                    await self._upload(entry)
                except FsError:
                    at, _ = self._retry.get(name, (now, 0.0))
                    next_at = min(next_at, at)
                except Exception:  # noqa: BLE001 — never let the uploader die
                    log.exception("uploading %s/%s", entry.bucket, entry.key)
                    self._schedule(entry, failed=True)
                    next_at = min(next_at, self._retry[name][0])
            with trio.move_on_at(next_at):
                await kick.wait()

    # ------------------------------------------------------- mount and unmount

    def recover(self) -> None:
        """Dirty files journaled by an earlier mount of this cache dir: shown again in
        their views and uploaded by the background uploader."""
        for entry in self.dirty.restore():
            vs = self.by_name.get(entry.meta.get("view"))
            if vs is not None and entry.bucket == vs.bucket:
                node = self._put(vs, {"key": entry.key, "size": entry.size, "mtime": time.time(),
                                      "etag": ""}, notify=False, remote=False)
                if node is not None and not node.is_dir:
                    vs.overlay[entry.key] = Pending("local", None, math.inf)
            log.info("recovered dirty file %s/%s from the journal: uploading", entry.bucket, entry.key)
            self._schedule(entry)

    def scratch_files(self) -> list[str]:
        """Mount paths (VIEW/relative path) of dirty files whose names cannot match."""
        out = []
        for entry in self.dirty.entries():
            vs = self.by_name.get(entry.meta.get("view"))
            if vs is not None and not self.can_match(vs, entry.key, entry.size,
                                                     self._final_tags(entry, vs, None)):
                out.append(f"{vs.name}/{relative_path(vs, entry.key) or entry.key}")
        return sorted(out)

    async def shutdown(self) -> tuple[list[str], list[str]]:
        """Unmount: upload everything dirty (files still open too). Returns (what could not
        be uploaded, with the reason; scratch files left behind)."""
        failed, scratch = [], []
        for entry in self.dirty.entries():
            try:
                if not await self._upload(entry):
                    vs = self.by_name.get(entry.meta.get("view")) if entry.meta else None
                    scratch.append(f"{vs.name}/{relative_path(vs, entry.key)}" if vs else entry.key)
            except FsError as exc:
                failed.append(f"{entry.bucket}/{entry.key}: {exc}")
        return failed, sorted(scratch)
