"""Open files and reads: handles over the data cache's entries.

A read-only handle fetches its object on the first read (``_ready``: from the cache, or a
download; a large object streams, and a read waits only for the bytes it needs). Local
file I/O on cache files (``os.pread``, ``os.pwrite``) happens on the loop: it is
page-cache fast and keeps reads and writes cheap. A handle keeps its own descriptor, so
it reads the version it opened however the cache changes meanwhile. The kernel may keep
the pages it cached for an inode when the ETag it was served is still the node's.
"""
from __future__ import annotations

import errno
import os

import trio

from ..datacache import CacheEntry
from ..errors import (FsError, StoreError, cache_failure, download_failed, read_only,
                      store_failure)
from .inodes import File


class FileHandle:
    __slots__ = ("node", "entry", "fd", "lock", "download", "writer")

    def __init__(self, node: File, writer: bool = False):
        self.node = node
        self.entry: CacheEntry | None = None
        self.fd: int | None = None
        self.lock = trio.Lock()
        self.download = None  # the streaming download this handle reads from, while it runs
        self.writer = writer  # opened for writing: ``entry`` is the dirty local copy


class Reads:
    """open / read / release of :class:`delvefs.client.fs.core.FileSystem`."""

    async def open(self, ino: int, flags: int) -> tuple[int, bool]:
        """A handle and whether the kernel may keep pages it cached for this inode."""
        node = self._node(ino)
        if node.is_dir:
            raise FsError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            vs = node.parent.view
            if not vs.writable:
                raise read_only(vs.name)
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
                raise store_failure(exc, "reading", vs.bucket, node.key) from exc
            try:
                h.fd = os.open(entry.path, os.O_RDONLY)
            except OSError as exc:
                self.cache.release(entry)
                raise cache_failure(exc, "opening", entry) from exc
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
                    raise download_failed(str(exc)) from exc
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
                self.dirty.drop_writer(entry)
                if entry.dirty and entry.writers == 0 and not h.node.gone:
                    self._schedule(entry)  # the flush could not upload it: retried
            self.cache.release(entry)
