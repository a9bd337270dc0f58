"""Names and attributes: lookup, getattr, access, forget, opendir/readdir, statfs.

Lookups of names missing from a fresh listing are answered locally (negative entries,
cached by the kernel for ``ttl`` and invalidated when the name appears). The lookup-count
and readdir-offset rules are the inode table's (``delvefs.client.mount.fs.inodes``).
"""
from __future__ import annotations

import errno
import os

from ..errors import FsError, read_only
from .handles import DirHandle, Handles
from .inodes import InodeTable, Node, check_name, mode_of
from .properties import Properties
from .tree import Tree
from .listings import Listings

ROOT_TIMEOUT = 3600.0
BLOCK = 4096


class Attributes:
    """The name and attribute operations."""

    def __init__(self, table: InodeTable, handles: Handles, tree: Tree, listings: Listings,
                 properties: Properties, settings):
        self.table = table
        self.handles = handles
        self.tree = tree
        self.listings = listings
        self.properties = properties
        # permission bits shown (`delvefs mount --file-mode/--dir-mode/--umask`): None =
        # 0644/0755; a read-only view's lose their write bits; umask is taken away last
        self.file_mode = settings.file_mode
        self.dir_mode = settings.dir_mode
        self.umask = settings.umask or 0

    def timeout(self, node: Node) -> float:
        vs = node.view if node.is_dir else node.parent.view
        return ROOT_TIMEOUT if vs is None else vs.ttl

    def stat(self, node: Node) -> tuple[int, int, int, int, float]:
        """(mode, nlink, size, mtime_ns, cache timeout) of ``node``."""
        vs = node.view if node.is_dir else node.parent.view
        # a view's top directory is always u+w: ``delvefs watch`` sets user.delvefs.sync
        # there (access(2) says it may); other writes there answer EROFS anyway
        writable = True if vs is None or node is vs.top else vs.writable
        mode = mode_of(node, writable)
        chosen = self.dir_mode if node.is_dir else self.file_mode
        if chosen is not None:
            mode = (mode & ~0o777) | (chosen if writable else chosen & ~0o222)
        mode &= ~self.umask
        if node.is_dir:
            return mode, 2, 0, node.mtime_ns, self.timeout(node)
        return mode, 1, node.size, node.mtime_ns, vs.ttl

    async def lookup(self, parent_ino: int, name: str) -> Node | None:
        """The child ``name`` (its lookup count + 1), or None: a negative entry."""
        parent = self.table.require(parent_ino)
        if not parent.is_dir:
            raise FsError(errno.ENOTDIR)
        if name == ".":
            node = parent
        elif name == "..":
            node = parent.parent or parent
        else:
            check_name(name)
            if self.listings.due_for(parent):
                await self.listings.fresh_for(parent)
            node = parent.children.get(name)
            if node is None:
                return None
        self.table.ref(node)
        return node

    def forget(self, items) -> None:
        for ino, n in items:
            self.table.forget(ino, n)
            if ino not in self.table.nodes:
                self.tree.unserve(ino)
                self.properties.forget(ino)

    async def getattr(self, ino: int) -> Node:
        node = self.table.require(ino)
        if not node.gone and self.listings.due_for(node):
            await self.listings.fresh_for(node)
        return node

    def access(self, ino: int, mode: int) -> None:
        """access(2) of the mount's user: the owner bits ``stat`` shows; write access
        refused in a read-only view is EROFS (as the writes there), anything else EACCES."""
        node = self.table.require(ino)
        missing = mode & (os.R_OK | os.W_OK | os.X_OK) & ~(self.stat(node)[0] >> 6)
        if missing:
            vs = node.view if node.is_dir else node.parent.view
            if missing == os.W_OK and vs is not None and not vs.writable:
                raise read_only(vs.name)
            raise FsError(errno.EACCES)

    async def opendir(self, ino: int) -> int:
        node = self.table.require(ino)
        if not node.is_dir:
            raise FsError(errno.ENOTDIR)
        await self.listings.fresh_for(node)
        return self.handles.add_dir(DirHandle(node, node.snapshot()))

    async def readdir(self, fh: int, off: int, reply) -> None:
        """Call ``reply(name, node, next_offset)`` for entries from ``off`` until it returns
        False; every accepted entry gains a lookup (readdirplus)."""
        h = self.handles.dirs.get(fh)
        if h is None:
            raise FsError(errno.EBADF)
        if off == 0:  # (re)wind: a fresh snapshot
            await self.listings.fresh_for(h.node)
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
        self.handles.drop_dir(fh)

    def statfs(self) -> dict:
        files = 1 << 32
        blocks = (1 << 50) // BLOCK  # 1 PiB: S3 has no meaningful capacity
        return {"f_bsize": BLOCK, "f_frsize": BLOCK, "f_blocks": blocks, "f_bfree": blocks,
                "f_bavail": blocks, "f_files": files, "f_ffree": files - len(self.table),
                "f_favail": files - len(self.table), "f_namemax": 255}
