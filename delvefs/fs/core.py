"""The file system core: protocol-free operations on views, nodes and cached data.

``FileSystem`` answers what the FUSE adapter asks (lookup, getattr, forget, opendir /
readdir, open / read / release, getxattr / listxattr, statfs) with names as ``str`` and
errors as :class:`FsError` (an errno). Tests drive it directly with a fake handler and a
fake store; the mount drives it through ``delvefs.fuse_adapter``.

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
* Local file I/O on cache files (``os.pread``) happens on the loop: it is page-cache
  fast and keeps reads cheap.
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import time

import trio

from ..cache import CacheEntry, DataCache
from ..handler_client import HandlerError, Resync
from .inodes import ROOT_INODE, Dir, File, InodeTable, Node, flat_name, mode_of, valid_segment
from .store import StoreError

log = logging.getLogger(__name__)

ROOT_TIMEOUT = 3600.0
BLOCK = 4096


def _single(group: BaseExceptionGroup) -> BaseException:
    """The one exception inside a nursery's group (else the group itself)."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]
    return group


class FsError(Exception):
    def __init__(self, err: int, message: str = ""):
        super().__init__(message or os.strerror(err))
        self.errno = err


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
        self.ttl = float(view.ttl)
        self.writable = bool(view.writable)
        self.id: str | None = None
        self.version = 0
        self.listed = False
        self.fresh_at = float("-inf")
        self.refreshing: trio.Event | None = None
        self.top: Dir | None = None
        self.lists = 0  # statistics (tests, logs)
        self.deltas = 0


class DirHandle:
    __slots__ = ("node", "snapshot")

    def __init__(self, node: Dir, snapshot: tuple):
        self.node = node
        self.snapshot = snapshot


class FileHandle:
    __slots__ = ("node", "entry", "fd", "lock", "download")

    def __init__(self, node: File):
        self.node = node
        self.entry: CacheEntry | None = None
        self.fd: int | None = None
        self.lock = trio.Lock()
        self.download = None  # the streaming download this handle reads from, while it runs


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
        for view in views:
            vs = ViewState(view, 0)
            vs.top = self.table.new_dir(root, view.name, vs, vs.root, now_ns)
            self.views.append(vs)
        self._fh = itertools.count(1)
        self.dirs: dict[int, DirHandle] = {}
        self.files: dict[int, FileHandle] = {}
        self._served: dict[int, str] = {}       # ino -> ETag whose bytes the kernel may cache
        self._props: dict[int, tuple] = {}      # ino -> (time, tags, metadata)

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
                await vs.refreshing.wait()
                continue
            if vs.listed and trio.current_time() - vs.fresh_at < vs.ttl:
                return
            ev = vs.refreshing = trio.Event()
            try:
                if not vs.listed:
                    await self._list(vs, resync=False)
                else:
                    await self._delta(vs)
            except HandlerError as exc:
                log.warning("view %s: %s", vs.name, exc)
                raise FsError(errno.EIO, str(exc)) from exc
            finally:
                vs.refreshing = None
                ev.set()
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
        if not key.startswith(vs.root):
            return None
        rel = key[len(vs.root):]
        if vs.flat:
            name = flat_name(rel)
            if not rel or rel.endswith("/") or not valid_segment(name):
                return None
            return [], name
        parts = rel.split("/")
        name = parts.pop()
        for seg in parts:
            if not valid_segment(seg):
                return None
        if name != "" and not valid_segment(name):
            return None
        if name == "" and not parts:
            return None
        return parts, name

    def _put(self, vs: ViewState, obj: dict, *, notify: bool) -> None:
        path = self._path(vs, obj["key"])
        if path is None:
            return
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
            return  # folder marker: its directories only
        size, etag = int(obj.get("size", 0)), str(obj.get("etag", ""))
        existing = parent.children.get(name)
        if existing is None:
            table.new_file(parent, name, size, mtime_ns, etag)
            if notify and self._known(parent):
                self.notifier.entry(parent.ino, name)
        elif existing.is_dir:
            sh = existing.shadow
            if sh is None:
                existing.shadow = File(table.new_ino(), name, parent, size, mtime_ns, etag)
                existing.shadow.gone = True
            else:
                sh.size, sh.mtime_ns, sh.etag = size, mtime_ns, etag
        elif existing.etag != etag or existing.size != size or existing.mtime_ns != mtime_ns:
            existing.size, existing.mtime_ns, existing.etag = size, mtime_ns, etag
            self._served.pop(existing.ino, None)  # the next open drops the kernel's pages
            if existing.nlookup:
                self.notifier.inode(existing.ino)

    def _delete(self, vs: ViewState, key: str) -> None:
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
        self._remove(node)

    def _remove(self, node: File) -> None:
        parent = node.parent
        self.table.detach(node)
        if self._known(parent):
            self.notifier.entry(parent.ino, node.name)
        self.cache.forget(parent.view.bucket, node.key)
        self._prune(parent)

    def _prune(self, d: Dir) -> None:
        """Remove empty virtual directories upward (a view's top always stays)."""
        while d.parent is not None and d.parent.ino != ROOT_INODE and not d.children:
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
        writable = True if vs is None else vs.writable
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
            raise FsError(errno.EROFS, "writing is not supported yet")
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
            if entry.etag == node.etag:
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
        if h.entry is not None:
            self.cache.release(h.entry)
            h.entry = None

    # ------------------------------------------------------------ xattrs

    FACTS = ("user.delvefs.etag", "user.delvefs.bucket", "user.delvefs.key")

    async def _properties(self, node: File) -> tuple[dict, dict]:
        vs = node.parent.view
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
        self._props[node.ino] = (now, result["tags"], metadata, node.etag)
        return result["tags"], metadata

    async def getxattr(self, ino: int, name: str) -> bytes:
        node = self._node(ino)
        if not name.startswith("user."):
            # security.*, system.posix_acl_*, trusted.*: not supported here. ENOTSUP (not
            # ENODATA) lets tools such as ls -l stop asking for every further file.
            raise FsError(errno.EOPNOTSUPP)
        if node.is_dir:
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
            return []
        tags, metadata = await self._properties(node)
        return ([*self.FACTS] + [f"user.{t}" for t in sorted(tags)]
                + [f"user.meta.{m}" for m in sorted(metadata)])

    async def setxattr(self, ino: int, name: str, value: bytes) -> None:
        raise FsError(errno.EROFS, "writing tags is not supported yet")

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


