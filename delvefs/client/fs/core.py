"""The file system core: protocol-free operations on views, nodes and cached data.

``FileSystem`` answers what the FUSE adapter asks (lookup, getattr, forget, opendir /
readdir, open / read / write / flush / fsync / release, create, setattr, unlink, mkdir,
rmdir, rename, getxattr / listxattr / setxattr / removexattr, statfs) with names as
``str`` and errors as :class:`FsError` (an errno). Tests drive it directly with a fake
handler and a fake store; the mount drives it through ``delvefs.client.fuse_adapter``.

Writes, whole objects
---------------------
A file opened for writing is a *dirty* cache entry: a local file of its own, journaled
(``delvefs.client.datacache``) before its first byte. The last writing handle's ``flush`` (close(2)
returns its error), ``fsync`` and a truncate(2) without an open handle upload the whole
object (``_upload``: the view's ``set`` tags merged in, Content-Type from the name);
a release that leaves it dirty hands it to ``run_uploads`` (background retries with
backoff); ``shutdown`` uploads the rest at unmount. A file whose key cannot match its
view (``can_match``, the compiled matcher) is a *scratch* file: never uploaded until a
rename gives it a matching name. unlink = DeleteObject; rename = server-side copy +
delete (a dirty file is only re-keyed); tags = PutObjectTagging.

Read your writes: after each local change the core applies it to every view of the
bucket at once (``_local_put`` / ``_local_delete``) and records it in the view's
``overlay`` (key -> :class:`Pending`). Changes from the handler (listing pages, deltas)
for an overlay key are ignored until they confirm it — a put with the uploaded ETag, a
delete — or until ``overlay_bound`` passes; a dirty file (``local``) always wins.

Metadata, lazily
----------------
A view's listing is fetched on first use (paged, each page applied to the tree as it
arrives), then trusted for the view's ``ttl``. The first operation on a view after that
asks the handler for the changes since the last version (a delta) and applies them; a
410 from the handler means "too old": the view is listed again and nodes not seen are
swept. One refresh per view runs at a time; other operations on the view wait for it.
Every change that the kernel may have cached is sent to the ``notifier`` (invalidate an
entry / an inode); the adapter delivers those from a separate task, never from inside a
request handler. Lookups of names missing from a fresh listing are answered locally
(negative entries, cached by the kernel for ``ttl`` and invalidated when the name
appears).

Concurrency (trio)
------------------
Everything runs in one trio thread; code between two ``await`` s is atomic. The rules:

* Tree edits (``_put``, ``_delete``, sweeps) never await, so an operation never sees a
  half-applied change; a listing page or a batch of changes is applied in one go.
* Await points are: waiting for a view refresh, handler HTTP calls, S3 calls (worker
  threads via ``store``), and waiting for another task's download of the same object.
  After each await, operations re-read the node/handle state instead of trusting what
  they saw before.
* Local file I/O on cache files (``os.pread``, ``os.pwrite``) happens on the loop: it
  is page-cache fast and keeps reads and writes cheap.
* Uploads, renames and unlinks of one dirty entry are serialized by the entry's lock
  (``_entry_lock``): an unlink or rename never races an upload into a junk object. Writes
  are not locked: a write during an upload bumps the entry's ``gen``, so the entry stays
  dirty and is uploaded again.
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import math
import mimetypes
import os
import time

import trio

from ..datacache import CacheEntry, DataCache
from ..handler_api import HandlerError, Resync
from .inodes import (ROOT_INODE, Dir, File, InodeTable, Node, flat_key, flat_name, key_path,
                     mode_of, relative_path, valid_segment)
from ..s3async import StoreError

log = logging.getLogger(__name__)

ROOT_TIMEOUT = 3600.0
BLOCK = 4096


def _single(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside a nursery's group (else the group itself)."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]
    return group


class FsError(Exception):
    def __init__(self, err: int, message: str = "", *, logged: bool = False):
        super().__init__(message or os.strerror(err))
        self.errno = err
        self.logged = logged  # the core has written its log line already


OVERLAY_BOUND = 120.0  # seconds a local change outranks the handler's view of it (at most)


class Pending:
    """One local change of a view not yet confirmed by the handler (the overlay).
    ``local``: a dirty file (its local content wins until uploaded); ``put``: uploaded
    with ``etag`` (retired when a change with that ETag arrives); ``delete``: gone
    (retired when the handler reports the key gone)."""

    __slots__ = ("kind", "etag", "deadline")

    def __init__(self, kind: str, etag: str | None, deadline: float):
        self.kind = kind
        self.etag = etag
        self.deadline = deadline


class NullNotifier:
    """Where the core reports what the kernel must forget (the adapter's is real)."""

    def entry(self, parent_ino: int, name: str) -> None:
        pass

    def inode(self, ino: int) -> None:
        pass


class ViewState:
    """One mounted view: its definition, the handler's id and version, its top dir."""

    def __init__(self, view, top_ino: int):
        self.view = view
        self.name = view.name
        self.bucket = view.bucket
        self.root = view.root or ""
        self.flat = view.layout == "flat"
        self.layout = view.layout
        self.set = dict(getattr(view, "set", None) or {})
        self.index = 0  # position in the mount's views (the matcher's answers)
        self.overlay: dict[str, Pending] = {}  # key -> local change not yet seen in a delta
        self.ttl = float(view.ttl)
        self.writable = bool(view.writable)
        self.id: str | None = None
        self.version = 0
        self.listed = False
        self.fresh_at = float("-inf")
        self.refreshing: Refresh | None = None
        self.top: Dir | None = None
        self.lists = 0  # statistics (tests, logs)
        self.deltas = 0


class Refresh:
    """A listing or delta under way for a view; tasks that need the view wait for it and
    share its failure (rather than each asking the handler again: a view of a bucket still
    being scanned would make every waiter wait for its own 503 in turn)."""
    __slots__ = ("done", "error")

    def __init__(self):
        self.done = trio.Event()
        self.error: FsError | None = None


class DirHandle:
    __slots__ = ("node", "snapshot")

    def __init__(self, node: Dir, snapshot: tuple):
        self.node = node
        self.snapshot = snapshot


class FileHandle:
    __slots__ = ("node", "entry", "fd", "lock", "download", "writer")

    def __init__(self, node: File, writer: bool = False):
        self.node = node
        self.entry: CacheEntry | None = None
        self.fd: int | None = None
        self.lock = trio.Lock()
        self.download = None  # the streaming download this handle reads from, while it runs
        self.writer = writer  # opened for writing: ``entry`` is the dirty local copy


class FileSystem:
    def __init__(self, views, handler, store, cache: DataCache, *, notifier=None,
                 uid: int | None = None, gid: int | None = None, page_size: int = 20000):
        now_ns = time.time_ns()
        self.table = InodeTable(now_ns)
        self.handler = handler
        self.store = store
        self.cache = cache
        self.notifier = notifier or NullNotifier()
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.page_size = page_size
        self.views: list[ViewState] = []
        root = self.table.root
        for i, view in enumerate(views):
            vs = ViewState(view, 0)
            vs.index = i
            vs.top = self.table.new_dir(root, view.name, vs, vs.root, now_ns)
            self.views.append(vs)
        self.by_name = {vs.name: vs for vs in self.views}
        self._matcher_obj = None
        self._fh = itertools.count(1)
        self.dirs: dict[int, DirHandle] = {}
        self.files: dict[int, FileHandle] = {}
        self._served: dict[int, str] = {}       # ino -> ETag whose bytes the kernel may cache
        self._props: dict[int, tuple] = {}      # ino -> (time, tags, metadata)
        # write side
        self.local_dirs: set[int] = set()       # inos of mkdir'ed dirs no object lies below yet
        self.overlay_bound = OVERLAY_BOUND
        self._locks: dict[str, trio.Lock] = {}  # journal file name -> upload lock
        self._pending: dict[str, CacheEntry] = {}   # dirty entries the uploader retries
        self._retry: dict[str, tuple[float, float]] = {}  # file -> (next attempt, delay)
        self._kick = trio.Event()
        self.retry_initial = 1.0
        self.retry_max = 60.0
        self.uploads = 0  # statistics (tests, logs)

    # ------------------------------------------------------------------ setup

    async def register(self, client: str, proofs: dict[str, str]) -> None:
        """Register all views with the handler (ids and starting versions)."""
        answer = await self.handler.register(
            client, [{"name": vs.name, "spec": vs.view.filter_spec()} for vs in self.views], proofs)
        by_name = {v["name"]: v for v in answer}
        for vs in self.views:
            vs.id = by_name[vs.name]["id"]

    async def prefetch(self) -> None:
        """List every view in the background right after mounting (errors only logged)."""
        async def one(vs):
            try:
                await self._fresh(vs)
            except FsError as exc:
                log.warning("prefetching view %s: %s", vs.name, exc)
        async with trio.open_nursery() as nursery:
            for vs in self.views:
                nursery.start_soon(one, vs)

    # ------------------------------------------------------------- freshness

    async def _fresh(self, vs: ViewState) -> None:
        """Make ``vs`` recent: list it (first use) or apply the handler's delta."""
        while True:
            if vs.refreshing is not None:
                r = vs.refreshing
                await r.done.wait()
                if r.error is not None:
                    raise FsError(r.error.errno, str(r.error), logged=True)
                continue
            if vs.listed and trio.current_time() - vs.fresh_at < vs.ttl:
                return
            r = vs.refreshing = Refresh()
            try:
                if not vs.listed:
                    await self._list(vs, resync=False)
                else:
                    await self._delta(vs)
            except HandlerError as exc:
                log.warning("view %s: %s", vs.name, exc)
                # the handler's first scan of the bucket is still running: try again later
                r.error = FsError(errno.EAGAIN if exc.code == "scanning" else errno.EIO, str(exc),
                                  logged=True)
                raise r.error from exc
            finally:
                vs.refreshing = None
                r.done.set()
            return

    async def _list(self, vs: ViewState, *, resync: bool) -> None:
        started = trio.current_time()
        vs.lists += 1
        first_version = None
        seen: set[str] | None = set() if resync else None
        # pages are fetched one ahead: the handler produces page k+1 while page k is applied
        send, recv = trio.open_memory_channel(1)

        async def fetch_pages():
            async with send:
                after = None
                while True:
                    page = await self.handler.list_page(vs.id, after, self.page_size)
                    await send.send(page)
                    after = page.get("next")
                    if not after or not page["objects"]:
                        return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch_pages)
                async with recv:
                    async for page in recv:
                        if first_version is None:
                            first_version = page["version"]
                        put = self._put
                        for obj in page["objects"]:  # one page: applied without an await
                            put(vs, obj, notify=resync)
                        if seen is not None:
                            seen.update(obj["key"] for obj in page["objects"])
        except BaseExceptionGroup as group:
            raise _single(group) from None
        if seen is not None:
            now = trio.current_time()
            seen.update(k for k, p in vs.overlay.items() if p.kind != "delete" and p.deadline > now)
            self._sweep(vs, seen)
        vs.version = first_version
        vs.listed = True
        await self._delta(vs, started=started, allow_resync=False)

    async def _delta(self, vs: ViewState, *, started: float | None = None,
                     allow_resync: bool = True) -> None:
        started = trio.current_time() if started is None else started
        vs.deltas += 1
        try:
            while True:
                r = await self.handler.changes(vs.id, vs.version, self.page_size)
                changes = r["changes"]
                for ch in changes:
                    if ch["op"] == "put" and ch.get("object"):
                        self._put(vs, ch["object"], notify=True)
                    elif ch["op"] == "delete":
                        self._delete(vs, ch["key"])
                more = bool(r.get("more")) and bool(changes)
                vs.version = changes[-1]["v"] if more else r["version"]
                if not more:
                    break
        except Resync:
            if not allow_resync:
                raise HandlerError(f"view {vs.name}: handler asks to resync right after a listing")
            log.info("view %s: version %s too old, listing again", vs.name, vs.version)
            await self._list(vs, resync=True)
            return
        vs.fresh_at = started

    # ------------------------------------------------------------ tree edits
    # (never await: atomic with respect to every other task)

    def _known(self, d: Dir) -> bool:
        return d.nlookup > 0 or d.ino == ROOT_INODE

    def _path(self, vs: ViewState, key: str) -> tuple[list[str], str] | None:
        """(directory segments, file name) of ``key`` in ``vs``, None when not shown."""
        rel = key_path(vs.root, vs.flat, key)
        if rel is None:
            return None
        if vs.flat:
            return [], rel
        parts = rel.split("/")
        name = parts.pop()
        return parts, name

    def _stale(self, vs: ViewState, key: str, obj: dict | None) -> bool:
        """True when the handler's change (``obj`` for a put, None for a delete) of ``key``
        must not undo a local change in the overlay; retires the overlay entry when the
        change confirms it (same ETag / gone) or when it is older than the bound."""
        p = vs.overlay.get(key)
        if p is None:
            return False
        if p.kind == "local":
            return True
        if p.deadline <= trio.current_time():
            del vs.overlay[key]
            return False
        if p.kind == "put":
            if obj is not None and str(obj.get("etag", "")) == p.etag:
                del vs.overlay[key]
                return False
            return True
        if obj is None:  # delete confirmed
            del vs.overlay[key]
            return False
        return True

    def _put(self, vs: ViewState, obj: dict, *, notify: bool, remote: bool = True,
             written: bool = False) -> File | None:
        """Show ``obj`` in ``vs`` (``notify``: tell the kernel of a new name; ``written``: the
        kernel holds this very content, written through the file: no inode invalidation)."""
        if remote and vs.overlay and self._stale(vs, obj["key"], obj):
            return None
        path = self._path(vs, obj["key"])
        if path is None:
            return None
        dirs, name = path
        mtime_ns = int(obj.get("mtime", 0) * 1e9)
        table = self.table
        parent = vs.top
        for seg in dirs:
            child = parent.children.get(seg)
            if child is None or not child.is_dir:
                shadowed = child
                if shadowed is not None:  # a directory hides a file of the same name
                    table.detach(shadowed)
                child = table.new_dir(parent, seg, vs, parent.prefix + seg + "/", mtime_ns)
                if shadowed is not None:
                    child.shadow = shadowed
                    if shadowed.nlookup:
                        self.notifier.inode(shadowed.ino)
                if notify and self._known(parent):
                    self.notifier.entry(parent.ino, seg)
            parent = child
        if name == "":
            return None  # folder marker: its directories only
        if self.local_dirs:  # a file landed: mkdir'ed directories above it are ordinary now
            d = parent
            while d is not None and d.view is vs:
                self.local_dirs.discard(d.ino)
                d = d.parent
        size, etag = int(obj.get("size", 0)), str(obj.get("etag", ""))
        existing = parent.children.get(name)
        if existing is None:
            f = table.new_file(parent, name, size, mtime_ns, etag)
            if notify and self._known(parent):
                self.notifier.entry(parent.ino, name)
            return f
        elif existing.is_dir:
            sh = existing.shadow
            if sh is None:
                existing.shadow = File(table.new_ino(), name, parent, size, mtime_ns, etag)
                existing.shadow.gone = True
            else:
                sh.size, sh.mtime_ns, sh.etag = size, mtime_ns, etag
            return None
        elif existing.etag != etag or existing.size != size or existing.mtime_ns != mtime_ns:
            existing.size, existing.mtime_ns, existing.etag = size, mtime_ns, etag
            self._served.pop(existing.ino, None)  # the next open drops the kernel's pages
            if existing.nlookup and not written:
                self.notifier.inode(existing.ino)
        return existing

    def _delete(self, vs: ViewState, key: str, *, remote: bool = True, notify: bool = True) -> None:
        if remote and vs.overlay and self._stale(vs, key, None):
            return
        path = self._path(vs, key)
        if path is None:
            return
        dirs, name = path
        if name == "":
            return
        parent = vs.top
        for seg in dirs:
            parent = parent.children.get(seg)
            if parent is None or not parent.is_dir:
                return
        node = parent.children.get(name)
        if node is None:
            return
        if node.is_dir:
            node.shadow = None
            return
        self._remove(node, notify)

    def _remove(self, node: File, notify: bool = True) -> None:
        parent = node.parent
        self.table.detach(node)
        if notify and self._known(parent):
            self.notifier.entry(parent.ino, node.name)
        self.cache.forget(parent.view.bucket, node.key)
        self._prune(parent)

    def _prune(self, d: Dir) -> None:
        """Remove empty virtual directories upward (a view's top always stays)."""
        while d.parent is not None and d.parent.ino != ROOT_INODE and not d.children \
                and d.ino not in self.local_dirs:
            parent = d.parent
            self.table.detach(d)
            if d.shadow is not None:  # the hidden file of the same name shows again
                d.shadow.gone = False
                parent.children[d.name] = d.shadow
                parent.changed()
            if self._known(parent):
                self.notifier.entry(parent.ino, d.name)
            d = parent

    def _sweep(self, vs: ViewState, seen: set[str]) -> None:
        """After a relist: remove files whose keys the listing did not contain."""
        stack = [vs.top]
        doomed = []
        while stack:
            d = stack.pop()
            for child in d.children.values():
                if child.is_dir:
                    stack.append(child)
                    if child.shadow is not None and child.shadow.key not in seen:
                        child.shadow = None
                elif child.key not in seen:
                    doomed.append(child)
        for f in doomed:
            if not f.gone:
                self._remove(f)

    # ------------------------------------------------------------ attributes

    def _node(self, ino: int) -> Node:
        node = self.table.get(ino)
        if node is None:
            raise FsError(errno.ENOENT, f"inode {ino} unknown")
        return node

    def timeout(self, node: Node) -> float:
        vs = node.view if node.is_dir else node.parent.view
        return ROOT_TIMEOUT if vs is None else vs.ttl

    def stat(self, node: Node) -> tuple[int, int, int, int, float]:
        """(mode, nlink, size, mtime_ns, cache timeout) of ``node``."""
        vs = node.view if node.is_dir else node.parent.view
        # a view's top directory is always u+w: ``delvefs watch`` sets user.delvefs.sync
        # there (access(2) says it may); other writes there answer EROFS anyway
        writable = True if vs is None or node is vs.top else vs.writable
        if node.is_dir:
            return mode_of(node, writable), 2, 0, node.mtime_ns, self.timeout(node)
        return mode_of(node, writable), 1, node.size, node.mtime_ns, vs.ttl

    async def _fresh_for(self, node: Node) -> None:
        vs = node.view if node.is_dir else node.parent.view
        if vs is not None:
            await self._fresh(vs)

    # ------------------------------------------------------------ operations

    async def lookup(self, parent_ino: int, name: str) -> Node | None:
        """The child ``name`` (its lookup count + 1), or None: a negative entry."""
        parent = self._node(parent_ino)
        if not parent.is_dir:
            raise FsError(errno.ENOTDIR)
        if name == ".":
            node = parent
        elif name == "..":
            node = parent.parent or parent
        else:
            await self._fresh_for(parent)
            node = parent.children.get(name)
            if node is None:
                return None
        self.table.ref(node)
        return node

    def forget(self, items) -> None:
        for ino, n in items:
            self.table.forget(ino, n)
            if ino not in self.table.nodes:
                self._served.pop(ino, None)
                self._props.pop(ino, None)

    async def getattr(self, ino: int) -> Node:
        node = self._node(ino)
        if not node.gone:
            await self._fresh_for(node)
        return node

    def access(self, ino: int, mode: int) -> None:
        """access(2) of the mount's user: the owner bits ``stat`` shows; write access
        refused in a read-only view is EROFS (as the writes there), anything else EACCES."""
        node = self._node(ino)
        missing = mode & (os.R_OK | os.W_OK | os.X_OK) & ~(self.stat(node)[0] >> 6)
        if missing:
            vs = node.view if node.is_dir else node.parent.view
            read_only = missing == os.W_OK and vs is not None and not vs.writable
            raise FsError(errno.EROFS if read_only else errno.EACCES)

    async def opendir(self, ino: int) -> int:
        node = self._node(ino)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR)
        await self._fresh_for(node)
        fh = next(self._fh)
        self.dirs[fh] = DirHandle(node, node.snapshot())
        return fh

    async def readdir(self, fh: int, off: int, reply) -> None:
        """Call ``reply(name, node, next_offset)`` for entries from ``off`` until it returns
        False; every accepted entry gains a lookup (readdirplus)."""
        h = self.dirs.get(fh)
        if h is None:
            raise FsError(errno.EBADF)
        if off == 0:  # (re)wind: a fresh snapshot
            await self._fresh_for(h.node)
            h.snapshot = h.node.snapshot()
        snap = h.snapshot
        ref = self.table.ref
        for i in range(off, len(snap)):
            node = snap[i]
            if node.gone:
                continue
            if not reply(node.name, node, i + 1):
                break
            ref(node)

    def releasedir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        """A handle and whether the kernel may keep pages it cached for this inode."""
        node = self._node(ino)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            vs = node.parent.view
            if not vs.writable:
                raise FsError(errno.EROFS, f"view {vs.name} is read-only")
            return await self._open_writer(node, truncate=bool(flags & os.O_TRUNC)), False
        fh = next(self._fh)
        self.files[fh] = FileHandle(node)
        return fh, self._served.get(ino) == node.etag

    async def _ready(self, h: FileHandle) -> int:
        async with h.lock:
            if h.fd is not None:
                return h.fd
            node = h.node
            vs = node.parent.view
            try:
                entry, info = await self.cache.fetch(self.store, vs.bucket, node.key, etag=node.etag,
                                                     size=node.size, ttl=vs.ttl)
            except StoreError as exc:
                if exc.errno not in (errno.ENOENT,):
                    log.warning("reading %s/%s: %s", vs.bucket, node.key, exc)
                raise FsError(exc.errno, str(exc)) from exc
            try:
                h.fd = os.open(entry.path, os.O_RDONLY)
            except OSError as exc:
                self.cache.release(entry)
                raise FsError(exc.errno or errno.EIO, str(exc)) from exc
            h.entry = entry
            h.download = entry.download
            if info is not None and (info["etag"] != node.etag or info["size"] != node.size):
                # S3 is ahead of the listing: show what was read
                node.etag, node.size = info["etag"], info["size"]
                self._served.pop(node.ino, None)
                node.mtime_ns = int(info.get("mtime", 0) * 1e9) or node.mtime_ns
                if node.nlookup:
                    self.notifier.inode(node.ino)
            if entry.etag == node.etag and not entry.dirty:
                self._served[node.ino] = entry.etag
            return h.fd

    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.files.get(fh)
        if h is None:
            raise FsError(errno.EBADF)
        fd = h.fd if h.fd is not None else await self._ready(h)
        dl = h.download
        if dl is not None:
            if dl.done < min(off + size, dl.size):
                try:
                    await dl.wait_for(off + size)
                except StoreError as exc:
                    raise FsError(errno.EIO, str(exc)) from exc
            elif dl.finished and dl.error is None:
                h.download = None
        return os.pread(fd, size, off)

    async def release(self, fh: int) -> None:
        h = self.files.pop(fh, None)
        if h is None:
            return
        if h.fd is not None:
            os.close(h.fd)
            h.fd = None
        entry = h.entry
        if entry is not None:
            h.entry = None
            if h.writer:
                entry.writers -= 1
                if entry.dirty and entry.writers == 0 and not h.node.gone:
                    self._schedule(entry)  # the flush could not upload it: retried
            self.cache.release(entry)

    # ------------------------------------------------------------ write path
    #
    # A file opened for writing is a dirty cache entry (its own local file, journaled).
    # flush of the last writing handle (close(2) returns its error), fsync, and a
    # truncate(2) without an open handle upload the whole object; release of a still-dirty
    # file leaves it to the background uploader (backoff). After an upload the change is
    # applied to every view of the bucket in this mount at once and kept in the views'
    # overlay until the handler's delta shows it (by ETag) or OVERLAY_BOUND passes.

    def _failed(self, exc: StoreError, what: str, bucket: str, key: str) -> FsError:
        """One log line naming the object, and the errno for the caller."""
        if exc.errno != errno.ENOENT:
            log.warning("%s %s/%s: %s", what, bucket, key, exc)
        return FsError(exc.errno, f"{what} {bucket}/{key}: {exc}", logged=True)

    def _oserror(self, exc: OSError, what: str, entry: CacheEntry) -> FsError:
        err = exc.errno or errno.EIO
        log.warning("%s %s/%s (cache file %s): %s", what, entry.bucket, entry.key, entry.path,
                    os.strerror(err))
        return FsError(err, f"{what} {entry.bucket}/{entry.key}: {os.strerror(err)}", logged=True)

    def _writable_dir(self, ino: int) -> tuple[Dir, ViewState]:
        d = self._node(ino)
        if not d.is_dir:
            raise FsError(errno.ENOTDIR)
        vs = d.view
        if vs is None:
            raise FsError(errno.EACCES, "the mount's root holds the views only")
        if not vs.writable:
            raise FsError(errno.EROFS, f"view {vs.name} is read-only")
        return d, vs

    def _key_for(self, parent: Dir, vs: ViewState, name: str) -> str:
        """The key a file ``name`` in ``parent`` has (EINVAL when no key maps to it)."""
        if vs.flat:
            rel = flat_key(name)
            if not rel or flat_name(rel) != name:
                raise FsError(errno.EINVAL, f"{name!r} is not a flat name (write % as %25, / as %2F)")
            return vs.root + rel
        if not valid_segment(name):
            raise FsError(errno.EINVAL, f"{name!r} cannot be a key segment")
        return parent.prefix + name

    def _matcher(self):
        if self._matcher_obj is None:
            from rulesets.matcher import compile_views
            self._matcher_obj = compile_views([vs.view for vs in self.views])
        return self._matcher_obj

    def can_match(self, vs: ViewState, key: str, size: int, tags: dict) -> bool:
        """Whether an object ``key`` of ``size`` with ``tags`` would be in view ``vs`` (and
        shown as a file there): the scratch rule asks this before every upload."""
        rel = relative_path(vs, key)
        if rel is None or rel.endswith("/"):
            return False
        from rulesets.model import ObjectInfo
        obj = ObjectInfo(vs.bucket, key, int(size), time.time(), None, dict(tags), {})
        return vs.index in self._matcher().match(obj)

    def _needs_tags(self, bucket: str) -> bool:
        return any(vs.view.properties for vs in self.views if vs.bucket == bucket)

    def _find(self, vs: ViewState, key: str) -> Node | None:
        path = self._path(vs, key)
        if path is None:
            return None
        d = vs.top
        for seg in path[0]:
            d = d.children.get(seg)
            if d is None or not d.is_dir:
                return None
        return d.children.get(path[1]) if path[1] else d

    def _entry_lock(self, entry: CacheEntry) -> trio.Lock:
        return self._locks.setdefault(os.path.basename(entry.path), trio.Lock())

    def _local_put(self, bucket: str, key: str, obj: dict, tags: dict, *,
                   keep_local: bool = False, quiet: ViewState | None = None) -> None:
        """Show an object this mount just wrote/copied/retagged in every view of ``bucket``
        it matches (and remove it from those it no longer matches), at once."""
        deadline = trio.current_time() + self.overlay_bound
        for vs in self.views:
            if vs.bucket != bucket:
                continue
            p = vs.overlay.get(key)
            if keep_local and p is not None and p.kind == "local":
                continue
            if self.can_match(vs, key, obj["size"], tags):
                vs.overlay[key] = Pending("put", obj["etag"], deadline)
                # ``quiet``: the view written through; the kernel knows that file already
                self._put(vs, obj, notify=vs is not quiet, remote=False, written=vs is quiet)
            else:
                present = self._find(vs, key) is not None
                vs.overlay.pop(key, None)
                self._delete(vs, key, remote=False)
                if present or p is not None:
                    vs.overlay[key] = Pending("delete", None, deadline)

    def _local_delete(self, bucket: str, key: str, also: ViewState | None = None,
                      quiet: bool = False) -> None:
        """This mount deleted (or moved away) ``key``: gone from every view at once
        (``quiet``: the kernel removed the entry of ``also`` itself)."""
        deadline = trio.current_time() + self.overlay_bound
        for vs in self.views:
            if vs.bucket != bucket:
                continue
            p = vs.overlay.pop(key, None)
            node = self._find(vs, key)
            if node is not None and not node.is_dir:
                self._delete(vs, key, remote=False, notify=not (quiet and vs is also))
            if node is not None or p is not None or vs is also:
                vs.overlay[key] = Pending("delete", None, deadline)

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
                raise self._failed(exc, "downloading for writing", bucket, key) from exc
            try:
                dl = held.download
                if dl is not None:
                    await dl.wait_finished()
                    if dl.error is not None:
                        raise FsError(errno.EIO, f"downloading {bucket}/{key} failed")
                if node.gone:
                    raise FsError(errno.ENOENT, f"{key}: removed meanwhile")
            except BaseException:
                self.cache.release(held)
                raise
            vs = node.parent.view
        bucket, key = vs.bucket, node.key
        try:
            entry = self.cache.writable(
                bucket, key, {"view": vs.name, "existing": bool(node.etag), "tags": {}, "untag": []},
                truncate=truncate, held=int(held is not None and self.cache.get(bucket, key) is held))
        except StoreError as exc:
            raise self._failed(exc, "writing", bucket, key) from exc
        finally:
            if held is not None:
                self.cache.release(held)
        self._dirtied(vs, node, entry)
        return entry

    async def _open_writer(self, node: File, *, truncate: bool) -> int:
        if node.gone:
            raise FsError(errno.ENOENT, f"{node.name}: removed")
        entry = await self._make_writable(node, truncate=truncate)
        try:
            fd = os.open(entry.path, os.O_RDWR)
        except OSError as exc:
            raise self._oserror(exc, "opening", entry) from exc
        fh = next(self._fh)
        h = self.files[fh] = FileHandle(node, writer=True)
        h.fd, h.entry = fd, entry
        entry.opens += 1
        entry.writers += 1
        return fh

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
            entry = self.cache.writable(vs.bucket, key, {"view": vs.name, "existing": False,
                                                         "tags": {}, "untag": []}, truncate=True)
        except StoreError as exc:
            raise self._failed(exc, "creating", vs.bucket, key) from exc
        node = self._put(vs, {"key": key, "size": 0, "mtime": time.time(), "etag": ""},
                         notify=False, remote=False)
        if node is None or node.is_dir:  # cannot happen: the name was checked
            self.cache.discard(entry)
            raise FsError(errno.EINVAL, f"{key}: cannot be created")
        self._dirtied(vs, node, entry)
        try:
            fd = os.open(entry.path, os.O_RDWR)
        except OSError as exc:
            raise self._oserror(exc, "creating", entry) from exc
        self.table.ref(node)
        fh = next(self._fh)
        h = self.files[fh] = FileHandle(node, writer=True)
        h.fd, h.entry = fd, entry
        entry.opens += 1
        entry.writers += 1
        return fh, node

    async def write(self, fh: int, off: int, data: bytes) -> int:
        h = self.files.get(fh)
        if h is None or not h.writer:
            raise FsError(errno.EBADF)
        entry, node = h.entry, h.node
        if node.gone:  # unlinked while open: the data goes nowhere (as on any file system)
            return os.pwrite(h.fd, data, off)
        if not entry.dirty:  # uploaded by an fsync/flush, written again through this handle
            vs = node.parent.view
            try:
                self.cache.redirty(entry, {"view": vs.name, "existing": True, "tags": {}, "untag": []})
            except StoreError as exc:
                raise self._failed(exc, "writing", entry.bucket, entry.key) from exc
            self._dirtied(vs, node, entry)
        if not entry.journaled:
            try:
                self.cache.journal_record(entry)
            except StoreError as exc:
                raise self._failed(exc, "writing", entry.bucket, entry.key) from exc
        try:
            n = os.pwrite(h.fd, data, off)
        except OSError as exc:
            raise self._oserror(exc, "writing", entry) from exc
        end = off + n
        if end > entry.size:
            self.cache.resized(entry, end)
        else:
            entry.gen += 1
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
            raise FsError(errno.EROFS, f"view {vs.name} is read-only")
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
                    self.cache.redirty(entry, {"view": vs.name, "existing": True, "tags": {}, "untag": []})
                except StoreError as exc:
                    raise self._failed(exc, "truncating", entry.bucket, entry.key) from exc
        else:
            entry = await self._make_writable(node, truncate=size == 0)
        try:
            self.cache.truncate(entry, size)
        except StoreError as exc:
            raise self._failed(exc, "truncating", entry.bucket, entry.key) from exc
        self._dirtied(node.parent.view, node, entry)
        if entry.writers == 0:
            await self._upload(entry)
        return node

    def _schedule(self, entry: CacheEntry, *, failed: bool = False) -> None:
        name = os.path.basename(entry.path)
        self._pending[name] = entry
        if not entry.journaled:  # left to the background: must survive a crash now
            try:
                self.cache.journal_record(entry)
            except StoreError as exc:
                log.warning("journal of %s/%s: %s", entry.bucket, entry.key, exc)
        if failed:
            _, delay = self._retry.get(name, (0.0, 0.0))
            delay = min(self.retry_max, max(self.retry_initial, delay * 2))
            self._retry[name] = (trio.current_time() + delay, delay)
        self._kick.set()

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
            name = os.path.basename(entry.path)
            vs = self.by_name.get(meta.get("view"))
            remote = None
            if meta.get("existing"):
                try:
                    remote = await self.store.tags(bucket, key)
                except StoreError as exc:
                    self._schedule(entry, failed=True)
                    raise self._failed(exc, "uploading (tags of)", bucket, key) from exc
            if not entry.dirty or entry.meta is None:
                return True
            tags = self._final_tags(entry, vs, remote)
            size = entry.size
            if vs is not None and not self.can_match(vs, key, size, tags):
                self._pending.pop(name, None)
                self._retry.pop(name, None)
                return False
            gen = entry.gen
            ctype = mimetypes.guess_type(key)[0] or "application/octet-stream"
            try:
                info = await self.store.upload(bucket, key, entry.path, size=size, tags=tags,
                                               content_type=ctype)
            except StoreError as exc:
                self._schedule(entry, failed=True)
                raise self._failed(exc, "uploading", bucket, key) from exc
            self.uploads += 1
            self._pending.pop(name, None)
            self._retry.pop(name, None)
            obj = {"key": key, "size": size, "mtime": info.get("mtime") or time.time(),
                   "etag": info["etag"]}
            still_dirty = entry.gen != gen or not entry.dirty
            if not still_dirty:
                self.cache.clean(entry, info["etag"])
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

    def recover(self) -> None:
        """Dirty files journaled by an earlier mount of this cache dir: shown again in
        their views and uploaded by the background uploader."""
        for entry in self.cache.recovered:
            vs = self.by_name.get(entry.meta.get("view"))
            if vs is not None and entry.bucket == vs.bucket:
                node = self._put(vs, {"key": entry.key, "size": entry.size, "mtime": time.time(),
                                      "etag": ""}, notify=False, remote=False)
                if node is not None and not node.is_dir:
                    vs.overlay[entry.key] = Pending("local", None, math.inf)
            log.info("recovered dirty file %s/%s from the journal: uploading", entry.bucket, entry.key)
            self._schedule(entry)
        self.cache.recovered = []

    def scratch_files(self) -> list[str]:
        """Mount paths (VIEW/relative path) of dirty files whose names cannot match."""
        out = []
        for entry in self.cache.dirty_entries():
            vs = self.by_name.get(entry.meta.get("view"))
            if vs is not None and not self.can_match(vs, entry.key, entry.size,
                                                     self._final_tags(entry, vs, None)):
                out.append(f"{vs.name}/{relative_path(vs, entry.key) or entry.key}")
        return sorted(out)

    async def shutdown(self) -> tuple[list[str], list[str]]:
        """Unmount: upload everything dirty (files still open too). Returns (what could not
        be uploaded, with the reason; scratch files left behind)."""
        failed, scratch = [], []
        for entry in self.cache.dirty_entries():
            try:
                if not await self._upload(entry):
                    vs = self.by_name.get(entry.meta.get("view")) if entry.meta else None
                    scratch.append(f"{vs.name}/{relative_path(vs, entry.key)}" if vs else entry.key)
            except FsError as exc:
                failed.append(f"{entry.bucket}/{entry.key}: {exc}")
        return failed, sorted(scratch)

    # --- namespace

    async def unlink(self, parent_ino: int, name: str) -> None:
        parent, vs = self._writable_dir(parent_ino)
        await self._fresh(vs)
        node = parent.children.get(name)
        if node is None:
            raise FsError(errno.ENOENT)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        await self._remove_file(node)

    async def _remove_file(self, node: File) -> None:
        vs = node.parent.view
        bucket, key = vs.bucket, node.key
        entry = self.cache.get(bucket, key)
        # only a dirty file has an upload to wait for (a lock nobody else holds costs a yield)
        lock = self._entry_lock(entry) if entry is not None and entry.dirty else contextlib.nullcontext()
        async with lock:
            if node.gone:
                raise FsError(errno.ENOENT)
            vs = node.parent.view
            bucket, key = vs.bucket, node.key
            entry = self.cache.get(bucket, key)
            local_only = entry is not None and entry.dirty and not entry.meta.get("existing") \
                and not node.etag
            if not local_only:
                try:
                    await self.store.delete(bucket, key)
                except StoreError as exc:
                    raise self._failed(exc, "deleting", bucket, key) from exc
            entry = self.cache.get(bucket, key)
            if entry is not None:
                name = os.path.basename(entry.path)
                self._pending.pop(name, None)
                self._retry.pop(name, None)
                self.cache.discard(entry)
            vs.overlay.pop(key, None)
            self._keep_dir(node.parent)
            self._local_delete(bucket, key, also=vs, quiet=True)
            if not node.gone:  # not shown by the view's rules (scratch): remove it here
                self._remove(node, notify=False)

    async def mkdir(self, parent_ino: int, name: str) -> Dir:
        parent, vs = self._writable_dir(parent_ino)
        if vs.flat:
            raise FsError(errno.EPERM, f"view {vs.name} is flat: no directories")
        if not valid_segment(name):
            raise FsError(errno.EINVAL)
        await self._fresh(vs)
        if name in parent.children:
            raise FsError(errno.EEXIST)
        d = self.table.new_dir(parent, name, vs, parent.prefix + name + "/", time.time_ns())
        self.local_dirs.add(d.ino)
        self.table.ref(d)
        return d

    async def rmdir(self, parent_ino: int, name: str) -> None:
        parent, vs = self._writable_dir(parent_ino)
        await self._fresh(vs)
        d = parent.children.get(name)
        if d is None:
            raise FsError(errno.ENOENT)
        if not d.is_dir:
            raise FsError(errno.ENOTDIR)
        if d.children:
            raise FsError(errno.ENOTEMPTY)
        if d.ino not in self.local_dirs:  # an empty virtual directory: a folder marker
            try:
                await self.store.delete(vs.bucket, d.prefix)
            except StoreError as exc:
                raise self._failed(exc, "deleting folder marker", vs.bucket, d.prefix) from exc
            self._local_delete(vs.bucket, d.prefix, also=vs)
        if d.gone or d.children:
            return
        self._keep_dir(parent)
        self.local_dirs.discard(d.ino)
        self.table.detach(d)
        if d.shadow is not None:
            d.shadow.gone = False
            parent.children[d.name] = d.shadow
            parent.changed()
        self._prune(parent)

    def refuse(self, what: str) -> None:
        log.info("%s refused: DelveFS views hold plain files only (EPERM)", what)
        raise FsError(errno.EPERM, f"{what}: not supported", logged=True)

    def _keep_dir(self, d: Dir) -> None:
        """``d`` is about to lose its last entry through this mount (unlink, rename): it
        stays, as if mkdir'ed, until rmdir (rm -r removes a file, then its directory)."""
        if len(d.children) == 1 and d.view is not None and d is not d.view.top:
            self.local_dirs.add(d.ino)

    def _move(self, node: Node, dst: Dir, name: str) -> None:
        """Move ``node`` (keeping its inode) to ``dst``/``name``, replacing what is there."""
        self._keep_dir(node.parent)
        target = dst.children.get(name)
        if target is not None and target is not node:
            self.table.detach(target)
        old = node.parent
        if old.children.get(node.name) is node:
            del old.children[node.name]
            old.changed()
        node.name = name
        node.parent = dst
        dst.children[name] = node
        dst.changed()
        node.gone = False
        if self.local_dirs and not node.is_dir:
            d = dst
            while d is not None:
                self.local_dirs.discard(d.ino)
                d = d.parent
        if node.is_dir:  # keys below it changed: fix the prefixes of its subtree
            stack = [node]
            while stack:
                d = stack.pop()
                d.prefix = d.parent.prefix + d.name + "/"
                stack.extend(c for c in d.children.values() if c.is_dir)
        self._served.pop(node.ino, None)
        self._prune(old)

    async def rename(self, old_parent_ino: int, old_name: str, new_parent_ino: int,
                     new_name: str, flags: int = 0) -> None:
        src_parent, src_vs = self._writable_dir(old_parent_ino)
        dst_parent, dst_vs = self._writable_dir(new_parent_ino)
        if flags & 2:  # RENAME_EXCHANGE
            raise FsError(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        await self._fresh(src_vs)
        if dst_vs is not src_vs:
            await self._fresh(dst_vs)
        node = src_parent.children.get(old_name)
        if node is None:
            raise FsError(errno.ENOENT)
        self._key_for(dst_parent, dst_vs, new_name)  # a valid name there
        target = dst_parent.children.get(new_name)
        if target is node:
            return
        if target is not None and flags & 1:  # RENAME_NOREPLACE
            raise FsError(errno.EEXIST)
        if node.is_dir:
            if dst_vs is not src_vs:
                raise FsError(errno.EXDEV, "directories move within their view only")
            if target is not None:
                if not target.is_dir:
                    raise FsError(errno.ENOTDIR)
                if target.children:
                    raise FsError(errno.ENOTEMPTY)
            a = dst_parent
            while a is not None:
                if a is node:
                    raise FsError(errno.EINVAL, "cannot move a directory into itself")
                a = a.parent
            await self._rename_dir(node, dst_parent, new_name)
        else:
            if target is not None and target.is_dir:
                raise FsError(errno.EISDIR)
            await self._rename_file(node, dst_parent, new_name, target)

    async def _relocate(self, node: File, dst_vs: ViewState, dk: str, target: Node | None,
                        result: dict) -> None:
        """Move one file's object (server-side copy + delete) or its dirty local copy
        (re-keyed) to ``dst_vs``/``dk``; the tree is changed by the caller. ``result``
        gets ``obj``, ``tags``, ``dirty`` (the entry, when local content moved)."""
        src_vs = node.parent.view
        sb, sk, db = src_vs.bucket, node.key, dst_vs.bucket
        entry = self.cache.get(sb, sk)
        if entry is not None and entry.dirty:
            async with self._entry_lock(entry):
                if entry.dirty and (entry.bucket, entry.key) == (sb, sk):
                    if entry.meta.get("existing") or node.etag:
                        try:
                            await self.store.delete(sb, sk)
                        except StoreError as exc:
                            raise self._failed(exc, "deleting (rename)", sb, sk) from exc
                    self.cache.rekey(entry, db, dk)
                    replaced = target is not None and not target.is_dir and bool(target.etag)
                    self.cache.update_record(entry, view=dst_vs.name, existing=replaced)
                    result["dirty"] = entry
                    return
        tags = {}
        if self._needs_tags(db) or self._needs_tags(sb):
            try:
                tags = await self.store.tags(sb, sk)
            except StoreError as exc:
                raise self._failed(exc, "renaming (tags of)", sb, sk) from exc
            if tags is None:
                raise FsError(errno.ENOENT, f"{sb}/{sk}: no such object")
        if not self.can_match(dst_vs, dk, node.size, tags):
            raise FsError(errno.EXDEV, f"{dk} cannot be in view {dst_vs.name} (mv copies, then "
                          "removes: the copy is a scratch file of this mount)")
        try:
            info = await self.store.copy(db, dk, sb, sk)
        except StoreError as exc:
            raise self._failed(exc, "copying (rename)", sb, sk) from exc
        try:
            await self.store.delete(sb, sk)
        except StoreError as exc:
            raise self._failed(exc, "deleting (rename; the copy exists)", sb, sk) from exc
        ce = self.cache.get(sb, sk)
        if ce is not None and not ce.dirty:
            self.cache.rekey(ce, db, dk)
            ce.etag = info["etag"]
        result["obj"] = {"key": dk, "size": info["size"], "mtime": info["mtime"], "etag": info["etag"]}
        result["tags"] = tags

    async def _rename_file(self, node: File, dst: Dir, name: str, target: Node | None) -> None:
        src_vs, dst_vs = node.parent.view, dst.view
        sb, sk = src_vs.bucket, node.key
        dk = self._key_for(dst, dst_vs, name)
        if (sb, sk) == (dst_vs.bucket, dk):
            # two views of one bucket showing the same key: the object stays where it is
            raise FsError(errno.EXDEV, f"{sk} is already the object {dst_vs.name}/{name} shows")
        result: dict = {}
        await self._relocate(node, dst_vs, dk, target, result)
        if node.gone or node.key != sk:
            return  # changed meanwhile: the next refresh shows what is there
        src_vs.overlay.pop(sk, None)
        self._move(node, dst, name)
        self._local_delete(sb, sk, also=src_vs)
        entry = result.get("dirty")
        if entry is not None:
            self._dirtied(dst_vs, node, entry)
            if entry.writers == 0:
                await self._upload(entry)  # a tmp file renamed to its final name: uploaded now
            return
        obj = result["obj"]
        node.etag, node.size = obj["etag"], obj["size"]
        self._local_put(dst_vs.bucket, dk, obj, result["tags"])

    async def _rename_dir(self, d: Dir, dst: Dir, name: str) -> None:
        """Every object below ``d`` is moved (copy + delete, 16 at a time): not atomic.
        On success the directory node moves with its subtree; after a partial failure the
        moved files show at their new place and the error is returned."""
        vs = d.view
        new_prefix = dst.prefix + name + "/"
        files: list[tuple[File, str]] = []
        stack = [d]
        while stack:
            x = stack.pop()
            for c in list(x.children.values()):
                if c.is_dir:
                    stack.append(c)
                else:
                    files.append((c, new_prefix + c.key[len(d.prefix):]))
        results: list[tuple[File, str, str, dict]] = []
        errors: list[FsError] = []
        limiter = trio.CapacityLimiter(16)

        async def one(f: File, dk: str):
            r: dict = {}
            sk = f.key
            async with limiter:
                try:
                    await self._relocate(f, vs, dk, None, r)
                except FsError as exc:
                    errors.append(exc)
                    return
            results.append((f, sk, dk, r))
        async with trio.open_nursery() as nursery:
            for f, dk in files:
                nursery.start_soon(one, f, dk)
        if not errors and not d.gone:
            self._move(d, dst, name)
            for f, sk, dk, r in results:
                vs.overlay.pop(sk, None)
                self._local_delete(vs.bucket, sk, also=vs)
                if r.get("dirty") is not None:
                    self._dirtied(vs, f, r["dirty"])
                else:
                    f.etag, f.size = r["obj"]["etag"], r["obj"]["size"]
                    self._local_put(vs.bucket, dk, r["obj"], r["tags"])
        else:
            for f, sk, dk, r in results:
                vs.overlay.pop(sk, None)
                self._local_delete(vs.bucket, sk, also=vs)
                if r.get("dirty") is not None:
                    e = r["dirty"]
                    n = self._put(vs, {"key": dk, "size": e.size, "mtime": time.time(), "etag": ""},
                                  notify=True, remote=False)
                    vs.overlay[dk] = Pending("local", None, math.inf)
                    if n is None:
                        log.warning("rename: %s moved to %s, not shown here", sk, dk)
                else:
                    self._local_put(vs.bucket, dk, r["obj"], r["tags"])
        for f, sk, dk, r in results:
            e = r.get("dirty")
            if e is not None and e.writers == 0:
                try:
                    await self._upload(e)
                except FsError as exc:
                    errors.append(exc)
        if errors:
            raise FsError(errors[0].errno, f"renaming {d.prefix} -> {new_prefix}: "
                          f"{len(errors)} of {len(files)} files failed: {errors[0]}", logged=True)

    # ------------------------------------------------------------ xattrs

    FACTS = ("user.delvefs.etag", "user.delvefs.bucket", "user.delvefs.key")

    async def _properties(self, node: File) -> tuple[dict, dict]:
        vs = node.parent.view
        entry = self.cache.get(vs.bucket, node.key)
        if entry is not None and entry.dirty and not entry.meta.get("existing") and not node.etag:
            return self._final_tags(entry, vs, None), {}  # not uploaded yet: what it will get
        cached = self._props.get(node.ino)
        now = trio.current_time()
        if cached is not None and now - cached[0] < vs.ttl and cached[3] == node.etag:
            return cached[1], cached[2]
        result = {}

        async def head():
            result["head"] = await self.store.head(vs.bucket, node.key)

        async def tags():
            result["tags"] = await self.store.tags(vs.bucket, node.key)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(head)
                nursery.start_soon(tags)
        except* StoreError as group:
            exc = group.exceptions[0]
            raise FsError(exc.errno, str(exc)) from None
        metadata = {k.lower(): v for k, v in result["head"]["metadata"].items()}
        tags = result["tags"] or {}
        if entry is not None and entry.dirty:
            tags = self._final_tags(entry, vs, tags)
        self._props[node.ino] = (now, tags, metadata, node.etag)
        return tags, metadata

    def view_info(self, vs: ViewState) -> dict:
        """What ``user.delvefs.view`` on a view's directory answers (delvefs watch)."""
        return {"id": vs.id, "name": vs.name,
                "handler": getattr(self.handler, "base_url", None), "bucket": vs.bucket,
                "root": vs.root, "layout": "flat" if vs.flat else "tree", "version": vs.version}

    async def getxattr(self, ino: int, name: str) -> bytes:
        node = self._node(ino)
        if not name.startswith("user."):
            # security.*, system.posix_acl_*, trusted.*: not supported here. ENOTSUP (not
            # ENODATA) lets tools such as ls -l stop asking for every further file.
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
            vs = node.view
            if vs is not None and node is vs.top and name == "user.delvefs.view":
                if not vs.listed:  # a version means something once the view is listed
                    await self._fresh(vs)
                return json.dumps(self.view_info(vs)).encode()
            raise FsError(errno.ENODATA)
        vs = node.parent.view
        if name == "user.delvefs.etag":
            return node.etag.encode()
        if name == "user.delvefs.bucket":
            return vs.bucket.encode()
        if name == "user.delvefs.key":
            return node.key.encode("utf-8", "surrogateescape")
        tags, metadata = await self._properties(node)
        if name.startswith("user.meta."):
            value = metadata.get(name[len("user.meta."):].lower())
        else:
            value = tags.get(name[len("user."):])
        if value is None:
            raise FsError(errno.ENODATA)
        return value.encode("utf-8", "surrogateescape")

    async def listxattr(self, ino: int) -> list[str]:
        node = self._node(ino)
        if node.is_dir:
            vs = node.view
            return ["user.delvefs.view"] if vs is not None and node is vs.top else []
        tags, metadata = await self._properties(node)
        return ([*self.FACTS] + [f"user.{t}" for t in sorted(tags)]
                + [f"user.meta.{m}" for m in sorted(metadata)])

    async def setxattr(self, ino: int, name: str, value: bytes) -> None:
        node = self._node(ino)
        if not name.startswith("user."):
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
            vs = node.view
            if vs is not None and node is vs.top and name == "user.delvefs.sync":
                await self.sync(vs, value)
                return
            raise FsError(errno.EPERM, "directories have no tags")
        if name.startswith(("user.delvefs.", "user.meta.")):
            raise FsError(errno.EPERM, f"{name} is read-only")
        await self._retag(node, {name[len("user."):]: value.decode("utf-8", "surrogateescape")}, ())

    async def removexattr(self, ino: int, name: str) -> None:
        node = self._node(ino)
        if not name.startswith("user."):
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir or name.startswith(("user.delvefs.", "user.meta.")):
            raise FsError(errno.EPERM, f"{name} is read-only")
        await self._retag(node, {}, (name[len("user."):],))

    async def _retag(self, node: File, add: dict, remove: tuple) -> None:
        """PutObjectTagging (merged with the current tag set); the file moves into and out
        of this mount's views at once (other mounts: through the handler)."""
        vs = node.parent.view
        if not vs.writable:
            raise FsError(errno.EROFS, f"view {vs.name} is read-only")
        if node.gone:
            raise FsError(errno.ENOENT)
        bucket, key = vs.bucket, node.key
        entry = self.cache.get(bucket, key)
        if entry is not None and entry.dirty:  # applied with the upload
            tags = dict(entry.meta.get("tags") or {})
            untag = set(entry.meta.get("untag") or ())
            current, _ = await self._properties(node)
            for t in remove:
                if t not in current:
                    raise FsError(errno.ENODATA)
                tags.pop(t, None)
                untag.add(t)
            tags.update(add)
            untag -= set(add)
            try:
                self.cache.update_record(entry, tags=tags, untag=sorted(untag))
            except StoreError as exc:
                raise self._failed(exc, "tagging", bucket, key) from exc
            self._props.pop(node.ino, None)
            return
        try:
            current = await self.store.tags(bucket, key)
        except StoreError as exc:
            raise self._failed(exc, "tagging (reading tags of)", bucket, key) from exc
        if current is None:
            raise FsError(errno.ENOENT, f"{bucket}/{key}: no such object")
        new = {**current, **add}
        for t in remove:
            if t not in new:
                raise FsError(errno.ENODATA)
            del new[t]
        try:
            await self.store.put_tags(bucket, key, new)
        except StoreError as exc:
            raise self._failed(exc, "tagging", bucket, key) from exc
        self._props.clear()
        if node.gone or node.key != key:
            return
        obj = {"key": key, "size": node.size, "mtime": node.mtime_ns / 1e9, "etag": node.etag}
        self._local_put(bucket, key, obj, new)

    async def sync(self, vs: ViewState, value: bytes) -> None:
        """``setxattr(VIEWDIR, "user.delvefs.sync", b"<version>")``: returns once this
        mount's listing of the view includes the handler's changes up to ``version``
        (a delta is fetched now, ignoring ttl, unless the known version is that recent)."""
        try:
            version = int(value.decode().strip())
        except (UnicodeDecodeError, ValueError):
            raise FsError(errno.EINVAL, "user.delvefs.sync wants a version number") from None
        for _ in range(2):
            if vs.listed and vs.version >= version:
                return
            if vs.refreshing is not None:
                await vs.refreshing.done.wait()
                continue
            vs.fresh_at = float("-inf")
            await self._fresh(vs)

    def statfs(self) -> dict:
        files = 1 << 32
        blocks = (1 << 50) // BLOCK  # 1 PiB: S3 has no meaningful capacity
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": blocks, "f_bfree": blocks,
                "f_bavail": blocks, "f_files": files, "f_ffree": files - len(self.table),
                "f_favail": files - len(self.table), "f_namemax": 255}

    def close(self) -> None:
        for fh in list(self.files):
            h = self.files.pop(fh)
            if h.fd is not None:
                os.close(h.fd)


