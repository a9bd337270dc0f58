"""The file system core: protocol-free operations on views, nodes and cached data.

``FileSystem`` answers what the FUSE adapter asks (lookup, getattr, forget, opendir /
readdir, open / read / write / flush / fsync / release, create, setattr, unlink, mkdir,
rmdir, rename, getxattr / listxattr / setxattr / removexattr, statfs) with names as
``str`` and errors as :class:`delvefs.client.mount.errors.FsError` (an errno). Tests drive it
directly with a fake handler and a fake store; the mount drives it through
``delvefs.client.mount.fuse_adapter``.

It is a facade over parts that own their state, built here and passed to each other at
construction (each names what it uses; arrows point at what a part calls):

``catalog``     the views (ViewState records), which view an object belongs to
``tree``        the directory tree, overlays of local changes, the kernel's cached pages
                                                                                → layout
``layout``      where files go in a layout by properties (each view's ``places``)
``listings``    registration, listings and delta refreshes, staleness, reload  → tree
``properties``  tags and metadata of files, retagging                           → tree
``deletes``     eager unlinks' DELETEs in DeleteObjects batches
``written``     everything about a file being written: its write-side state, journal
                record, writers, place in the upload queue, close-to-open or eager
                                                                        → catalog
``uploads``     conditional uploads and conflicts, the background uploader, sync,
                recovery, shutdown, parts sent while written
                                                    → written, tree, properties, deletes
``writes``      create, write, flush, fsync, truncate, release of writing handles
                                                               → written, uploads, listings
``reads``       open for reading, read, release of reading handles         → readahead
``readahead``   sequential read-ahead: its rule, per-handle state and settings
``publisher``   directory renames published as one batch: records, manifests, recovery
                                                                          → uploads, tree
``namespace``   unlink, mkdir, rmdir, rename            → uploads, deletes, publisher, listings
``xattrs``      extended attributes                    → properties, written, listings, reads
``attributes``  lookup, getattr, access, forget, opendir / readdir, statfs       → listings
``confirmations``  waits until the handler has what this mount wrote (``delvefs sync``)
``shape``, ``writing``  subsystems: records of parts the widest parts are given together
                (``subsystems``: what the mount shows; what happens to written files)
``handles``     open file and directory handles; ``table`` the inode table

Every setting comes from one frozen :class:`delvefs.client.mount.settings.MountSettings`.

Concurrency (trio)
------------------
Everything runs in one trio thread; code between two ``await`` s is atomic. Await points
are: waiting for a view refresh, handler HTTP calls, S3 calls (worker threads via
``delvefs.client.mount.s3async``), and waiting for another task's download of the same object.
After each await, operations re-read the node/handle state instead of trusting what they
saw before. Each part states its own rules: tree edits never await (``tree``), cache
file I/O runs on the loop (``reads``), one written file's uploads, renames and unlinks take
turns (``uploads``), and an open of a file waits for this mount's rename, replacement or
unlink of it under way (``Tree.moving``): what a descriptor lacks would come from the key
that operation deletes.
"""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Awaitable

import trio

from ..cache.datacache import DataCache
from ..errors import FsError, read_only, refused
from .attributes import Attributes
from .catalog import ViewCatalog
from .confirm import Confirmations
from .deletes import DeleteQueue
from .written import WrittenFiles
from .handles import Handles
from .inodes import Dir, File, InodeTable, Node
from .layout import PropertyLayout
from .namespace import Namespace
from .properties import Properties
from .publisher import Publisher
from .readahead import ReadAhead
from .reads import Reads
from .subsystems import Shape, Writing
from .tree import Tree
from .uploads import Uploads
from .listings import Listings
from .writes import Writes
from .xattrs import Xattrs


class NullNotifier:
    """Where the core reports what the kernel must forget (the adapter's is real)."""

    def entry(self, parent_ino: int, name: str) -> None:
        pass

    def inode(self, ino: int) -> None:
        pass


class FileSystem:
    def __init__(self, views, handler, store, cache: DataCache, settings, *, notifier=None,
                 reregister=None):
        self.settings = settings
        self.handler = handler
        self.store = store
        self.cache = cache
        self.uid, self.gid = settings.uid, settings.gid
        self.eager = settings.eager
        self.writeback_cache = settings.writeback_cache
        self.table = InodeTable(time.time_ns())
        self.catalog = ViewCatalog(views)
        self.handles = Handles()
        self.written = WrittenFiles(cache, settings, self.catalog)
        self.layout = PropertyLayout()
        self.tree = Tree(self.table, self.catalog, self.handles, self.layout, cache,
                         notifier or NullNotifier(), settings)
        self.listings = Listings(self.catalog, self.tree, handler, self.written, settings,
                              reregister=reregister)
        self.properties = Properties(store, cache, self.written, self.tree)
        self.deletes = DeleteQueue(store, settings)
        self.uploads = Uploads(store, cache, self.written, self.catalog, self.tree,
                               self.properties, self.deletes, settings)
        self.shape = Shape(self.table, self.catalog, self.tree, self.layout)
        self.writes = Writes(self.shape, self.handles, self.listings, self.uploads, self.written,
                             cache, store, settings)
        self.readahead = ReadAhead(cache, store, prefetch=settings.prefetch)
        self.reads = Reads(self.table, self.handles, self.tree, self.written, self.readahead,
                           cache, store, settings)
        self.publisher = Publisher(store, cache, self.written, self.uploads, self.tree)
        self.writing = Writing(self.written, self.uploads, self.deletes, self.properties,
                               self.publisher)
        self.namespace = Namespace(self.shape, self.listings, self.writing, self.reads, cache,
                                   store, settings)
        self.xattrs = Xattrs(self.table, self.listings, self.properties, self.written, cache, handler,
                             unconfirmed=self.reads.unconfirmed)
        self.confirmations = Confirmations(handler, store.written)
        self.passthrough = None  # the FUSE adapter's, once it attaches it
        self.attributes = Attributes(self.table, self.handles, self.tree, self.listings,
                                     self.properties, settings)

    def attach_passthrough(self, passthrough) -> None:
        """The FUSE adapter's passthrough (``delvefs status`` reports it)."""
        self.passthrough = passthrough

    @property
    def views(self) -> list:
        """The mount's views (ViewState records), in order."""
        return self.catalog.views

    def close(self) -> None:
        self.handles.close_all()

    # ------------------------------------------------------------ the adapter's entry points

    def stat(self, node: Node) -> tuple[int, int, int, int, float]:
        return self.attributes.stat(node)

    def timeout(self, node: Node) -> float:
        return self.attributes.timeout(node)

    # (the most frequent requests return the part's coroutine: no frame of their own)
    def lookup(self, parent_ino: int, name: str) -> Awaitable[Node | None]:
        return self.attributes.lookup(parent_ino, name)

    def forget(self, items) -> None:
        self.attributes.forget(items)

    def getattr(self, ino: int) -> Awaitable[Node]:
        return self.attributes.getattr(ino)

    def access(self, ino: int, mode: int) -> None:
        self.attributes.access(ino, mode)

    async def opendir(self, ino: int) -> int:
        return await self.attributes.opendir(ino)

    async def readdir(self, fh: int, off: int, reply) -> None:
        await self.attributes.readdir(fh, off, reply)

    def releasedir(self, fh: int) -> None:
        self.attributes.releasedir(fh)

    def statfs(self) -> dict:
        return self.attributes.statfs()

    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        """A handle and whether the kernel may keep pages it cached for this inode."""
        node = self.table.require(ino)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            vs = node.parent.view
            if not vs.writable:
                raise read_only(vs.name)
            return await self.writes.open_writer(node, truncate=bool(flags & os.O_TRUNC)), False
        return await self.reads.open(node)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return await self.reads.read(fh, off, size)

    async def release(self, fh: int) -> None:
        h = self.handles.files.get(fh)
        if h is not None and h.writer:
            await self.writes.release(fh)
        else:
            await self.reads.release(fh)

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[int, File]:
        return await self.writes.create(parent_ino, name, flags)

    async def write(self, fh: int, off: int, data: bytes) -> int:
        return await self.writes.write(fh, off, data)

    async def flush(self, fh: int) -> None:
        await self.writes.flush(fh)

    async def fsync(self, fh: int) -> None:
        await self.writes.fsync(fh)

    async def setattr(self, ino: int, *, size: int | None = None, fh: int | None = None) -> Node:
        return await self.writes.setattr(ino, size=size, fh=fh)

    async def fallocate(self, ino: int, fh: int, mode: int, offset: int, length: int) -> None:
        await self.writes.fallocate(ino, fh, mode, offset, length)

    async def copy_file_range(self, fh_in: int, off_in: int, fh_out: int, off_out: int,
                              length: int, flags: int) -> int:
        return await self.writes.copy_file_range(fh_in, off_in, fh_out, off_out, length, flags)

    async def unlink(self, parent_ino: int, name: str) -> None:
        await self.namespace.unlink(parent_ino, name)

    async def mkdir(self, parent_ino: int, name: str) -> Dir:
        return await self.namespace.mkdir(parent_ino, name)

    async def rmdir(self, parent_ino: int, name: str) -> None:
        await self.namespace.rmdir(parent_ino, name)

    async def rename(self, old_parent_ino: int, old_name: str, new_parent_ino: int,
                     new_name: str, flags: int = 0) -> None:
        await self.namespace.rename(old_parent_ino, old_name, new_parent_ino, new_name, flags)

    async def getxattr(self, ino: int, name: str) -> bytes:
        return await self.xattrs.getxattr(ino, name)

    async def listxattr(self, ino: int) -> list[str]:
        return await self.xattrs.listxattr(ino)

    async def setxattr(self, ino: int, name: str, value: bytes) -> None:
        await self.xattrs.setxattr(ino, name, value)

    async def removexattr(self, ino: int, name: str) -> None:
        await self.xattrs.removexattr(ino, name)

    def refuse(self, what: str) -> None:
        raise refused(what)

    # ------------------------------------------------------------ the mount's life

    async def register(self, client: str, proofs: dict) -> None:
        await self.listings.register(client, proofs)

    async def reload(self, views, proofs: dict) -> dict:
        return await self.listings.reload(views, proofs)

    async def prefetch(self) -> None:
        await self.listings.prefetch()

    def recover(self) -> None:
        self.uploads.recover()

    async def run_uploads(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The background of the write path: uploads, DELETE batches, and the publishes
        an earlier mount left unfinished."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.uploads.run_uploads)
            await nursery.start(self.publisher.finish_left)
            task_status.started()

    async def sync_all(self) -> list[str]:
        return await self.uploads.sync_all()

    async def wait_for_handler(self, timeout: float) -> list[str]:
        """After ``sync_all``: until the event handler has every write of this mount (a
        mount started afterwards lists them), at most ``timeout`` s; what it lacks then."""
        return await self.confirmations.wait(timeout)

    async def shutdown(self) -> tuple[list[str], list[str]]:
        failed, scratch = await self.uploads.shutdown()
        return failed + await self.publisher.finish_all(), scratch

    def upload_report(self) -> list[dict]:
        return self.uploads.upload_report()

    def conflict_copies(self) -> list[str]:
        return self.uploads.conflict_copies()

    def scratch_files(self) -> list[str]:
        return self.uploads.scratch_files()
