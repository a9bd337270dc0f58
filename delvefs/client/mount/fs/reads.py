"""Open files and reads: handles over the data cache's entries.

A read-only handle opens its object's cache entry on its first read (``_ready``:
``DataCache.fetch`` with the bytes of that read, the whole object when it is small).
Every read makes sure of the blocks it needs (``DataCache.ensure``: a cached block costs
no request, missing ones are ranged GETs of the handle's version) and then preads them
without awaiting in between, so an eviction can never take them away first. Local file
I/O on cache files (``os.pread``, ``os.pwrite``) happens on the loop: it is page-cache
fast and keeps reads and writes cheap. A handle keeps its own descriptor and entry, so it
reads the version it opened however the cache changes meanwhile; a byte of it that is no
longer in the cache and no longer in S3 is EIO, never a byte of another version.

Every read of a clean copy tells the read-ahead part (``delvefs.client.mount.fs.readahead``),
which fetches ahead of sequential readers; a handle's close stops its fetches. The kernel
may keep the pages it cached for an inode when the ETag it was served is still the node's.

An open of a file of which nothing is held asks S3 nothing: its first read's GET, pinned
to the listed version, is its first request. An open of a cached copy checked more than
``ttl`` ago revalidates it in one round trip (``DataCache.current``: a conditional GET of
its first block, If-None-Match; 304 confirms it, another version's answer brings that
version's first block along). An open also tells the read-ahead part (``opened``), which
starts fetching the index files next to the file (the ``prefetch`` mount option).

Stale-if-error (``stale_if_error=on``, the default; as an HTTP cache's, RFC 5861): an open
whose revalidation S3 cannot answer (no connection, a reset, a timeout, 5xx) is served
the cached copy; its revalidation is one try then. :class:`Unconfirmed` keeps which copies are
served so and since when (``user.delvefs.unconfirmed``), logs each once per outage and
counts the opens; the next revalidation S3 answers ends it. A 404 or another version in
S3 is an answer: served as without S3 trouble.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from datetime import datetime, timezone

from ..cache.cacheentry import CacheEntry
from ..errors import FsError, StoreError, cache_failure, read_failed, store_failure
from .handles import FileHandle, Handles, ReadHandle
from .inodes import InodeTable, looked_up_again
from .readahead import ReadAhead
from .tree import Tree

log = logging.getLogger(__name__)

# An object removed or replaced through this mount while descriptors read it is fetched
# whole first, up to this size (a bigger one: its bytes not read yet are EIO afterwards,
# as after a delete by another client)
KEEP_FOR_READERS_MAX = 256 << 20


class Unconfirmed:
    """The cached copies opens are served although S3 could not be asked whether they are
    still current (stale-if-error): per (bucket, key) the version served, since when (wall
    clock, the first failed revalidation of this outage) and why. ``opens`` counts the
    opens served so (the mount's metrics)."""

    def __init__(self):
        self.copies: dict[tuple[str, str], tuple[str, float, str]] = {}
        self.opens = 0

    def served(self, bucket: str, key: str, etag: str, reason: str) -> None:
        """An open of version ``etag`` is served its cached copy, unconfirmed: logged once
        per copy until S3 answers about it again."""
        self.opens += 1
        held = self.copies.get((bucket, key))
        if held is not None and held[0] == etag:
            return
        self.copies[(bucket, key)] = (etag, time.time(), reason)
        log.warning("%s/%s: S3 cannot be asked whether the cached copy is current (%s): "
                    "serving it unconfirmed (stale_if_error=on)", bucket, key, reason)

    def confirmed(self, bucket: str, key: str) -> None:
        """S3 answered a revalidation of ``bucket/key``: its copy is no longer unconfirmed."""
        if self.copies.pop((bucket, key), None) is not None:
            log.info("%s/%s: S3 answers again about the cached copy", bucket, key)

    def text(self, bucket: str, key: str, etag: str) -> str | None:
        """``user.delvefs.unconfirmed`` of version ``etag``: "since <UTC time>: <reason>",
        or None when its copy is not served unconfirmed."""
        held = self.copies.get((bucket, key))
        if held is None or held[0] != etag:
            return None
        since = datetime.fromtimestamp(held[1], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"since {since}: S3 could not be asked: {held[2]}"


class Reads:
    """open (for reading), read and release of file handles."""

    def __init__(self, table: InodeTable, handles: Handles, tree: Tree, written,
                 readahead: ReadAhead, cache, store, settings=None):
        self.stale_if_error = settings is None or settings.stale_if_error == "on"
        self.unconfirmed = Unconfirmed()
        self.table = table
        self.readahead = readahead
        self.handles = handles
        self.tree = tree
        self.written = written
        self.cache = cache
        self.store = store

    async def open(self, node) -> tuple[int, bool]:
        """A reading handle of ``node`` and whether the kernel may keep pages it cached for
        this inode (``_revalidate`` first). A rename or removal of the file under way ends
        first: it fetched the bytes of the readers it found (``keep_for_readers``) before
        deleting the object; a reader opened meanwhile would find neither."""
        while True:
            while (moved := self.tree.move_of(node)) is not None:
                await moved.wait()
            if node.gone:
                break
            await self._revalidate(node)
            if self.tree.move_of(node) is None and not node.gone:
                break
            # a move or removal began while S3 was asked: it found no handle of this open
            # to fetch bytes for; this open is one after it
        if node.gone and self._cached_version(node) is None \
                and self.handles.reader_of_version(node) is None:
            # removed (or replaced) after the kernel looked its name up, nothing of it held
            # here
            raise looked_up_again(node)
        h = ReadHandle(node)
        keep = self.tree.serves(node.ino, node.etag)
        entry = self._cached_version(node)
        if entry is not None:
            # the kernel may serve this descriptor pages of that version without asking:
            # it holds the version's cached bytes from now on (an overwrite replaces the
            # cache's entry, never the one a descriptor holds)
            try:
                h.fd = os.open(entry.path, os.O_RDONLY)
            except OSError:
                pass  # the first read opens what is there then
            else:
                self.cache.hold(entry)
                h.entry = entry
                self.tree.served(node.ino, entry.etag)  # its reads bring in pages of it
        elif node.gone and (other := self.handles.reader_of_version(node)) is not None:
            # what another descriptor holds of a removed file is all there is of it: held
            # from now on, as that one may close before this one's first read
            self._share(h, other)
        fh = self.handles.add_file(h)
        self.readahead.opened(node)  # its index files (prefetch=dir: its directory's files)
        return fh, keep

    def _share(self, h: FileHandle, other: FileHandle) -> None:
        """``h`` reads what ``other`` reads (its own descriptor of that file, its own hold)."""
        try:
            h.fd = os.dup(other.fd)
        except OSError as exc:
            raise cache_failure(exc, "opening", other.entry) from exc
        self.cache.hold(other.entry)
        h.entry = other.entry

    def _cached_version(self, node) -> CacheEntry | None:
        """The cache's clean entry of ``node``'s version, if it has one."""
        entry = self.cache.get(node.parent.view.bucket, node.key)
        if entry is not None and not entry.dirty and entry.etag and entry.etag == node.etag:
            return entry
        return None

    async def _revalidate(self, node) -> None:
        """Before the kernel serves an open anything: whether the node's version is still
        S3's, when this mount holds bytes of it (a cached copy; or another handle reads the
        inode). The kernel keeps one page cache per inode, so all handles of an inode read
        one version (``_ready``) and a newer one must not reach its pages: asked past
        ``ttl`` (always while another handle reads a version of which bytes are missing
        here, as a byte of it gone from S3 would be EIO). A newer version moves the name to
        the new version: the same inode with its pages dropped, or, while others read this
        one (or the kernel's writeback cache holds its size), a new inode, and the open fails
        ESTALE: the kernel then looks the name up again and opens that. S3 that cannot be
        asked (stale-if-error, module docstring): the open is served what is held of the
        version, unconfirmed; with ``stale_if_error=off`` it fails EIO."""
        vs = node.parent.view
        others = self.handles.reading(node)
        cached = self.cache.get(vs.bucket, node.key)
        if not others and (cached is None or cached.etag != node.etag):
            return  # nothing of this version here: the first read's GET, pinned to it, tells
        holder = self.handles.reader_of_version(node)
        whole = holder is not None and (holder.entry.present is None or holder.entry.present.covers(
            0, min(holder.entry.size, holder.entry.source_len)))
        try:
            # one try when an unreachable S3 has an answer here (the cached copy): an open
            # waits at most one connect or read timeout, a refused connection not at all
            info = await self.cache.current(self.store, vs.bucket, node.key, etag=node.etag,
                                            ttl=0.0 if others and not whole else vs.ttl,
                                            once=self.stale_if_error)
        except StoreError as exc:
            if exc.unreachable and self.stale_if_error:
                # an outage of S3 takes away no data this mount holds (as a handler outage
                # takes away no listing): served, and said so
                self.unconfirmed.served(vs.bucket, node.key, node.etag, str(exc))
                return
            if exc.errno != errno.ENOENT:
                raise store_failure(exc, "opening", vs.bucket, node.key) from exc
            self.unconfirmed.confirmed(vs.bucket, node.key)
            return  # deleted: what is cached of the version is all there is
        self.unconfirmed.confirmed(vs.bucket, node.key)
        if info is None:
            return
        if node.gone:  # the name moved on while S3 was asked
            raise looked_up_again(node)
        current = self.tree.object_changed(node, info["size"],
                                           int(info.get("mtime", 0) * 1e9) or node.mtime_ns,
                                           info["etag"])
        if current is not node:
            raise looked_up_again(node)

    async def keep_for_readers(self, node) -> None:
        """``node``'s object is about to be deleted or replaced through this mount while
        descriptors read it: the bytes they lack are fetched first (objects of at most
        ``KEEP_FOR_READERS_MAX``), so they read on as on a local file system; a descriptor
        not read yet takes the file's local copy (of a file S3 never had, the only one).
        Best effort: what cannot be fetched is EIO later, as after another client's delete."""
        readers = [h for h in self.handles.files.values() if not h.writer and h.node is node]
        entry = self.cache.get(node.parent.view.bucket, node.key)
        local = entry is not None and entry.dirty and not self.written.sparse(entry)
        if not readers or (not local and node.size > KEEP_FOR_READERS_MAX):
            return
        for h in readers:
            try:
                await self._ready(h, 0, node.size)
                if h.entry is not None and h.entry.present is not None:
                    await self.cache.ensure(self.store, h.entry, 0, h.entry.size)
            except (FsError, StoreError) as exc:
                log.info("%s/%s: fetching it for its readers before it goes: %s",
                         node.parent.view.bucket, node.key, exc)

    async def _ready(self, h: FileHandle, off: int, size: int) -> int:
        async with h.lock:
            if h.fd is not None:
                return h.fd
            node = h.node
            other = self.handles.reader_of_version(node)
            if other is not None:
                # one version per inode (``open``): the pages this handle's reads bring in
                # are the other handle's pages too
                self._share(h, other)
                return h.fd
            vs = node.parent.view
            # the kernel may serve this handle pages of the node's version (kept at open, or
            # of an inode the name has left): its reads are of that version or fail, never
            # of a newer one
            exact = node.gone or self.tree.serves(node.ino, node.etag)
            rewritten = 0
            while True:
                asked = node.etag
                try:
                    entry, info = await self.cache.fetch(
                        self.store, vs.bucket, node.key, etag=node.etag, size=node.size,
                        ttl=vs.ttl, want=(off, off + size), exact=exact)
                except StoreError as exc:
                    now = self.cache.get(vs.bucket, node.key)
                    if exact and not node.gone and rewritten < 3 and (
                            node.etag != asked or (now is not None and now.dirty)):
                        # written through this mount meanwhile (the same inode: the kernel
                        # dropped or rewrote its pages; a change from elsewhere would have
                        # moved the name off this inode, as a handle reads it): read the
                        # file as it is now
                        rewritten += 1
                        exact = self.tree.serves(node.ino, node.etag)
                        continue
                    failure = store_failure(exc, "reading", vs.bucket, node.key)
                    if exact:  # its version is gone (or unreachable): EIO, never another's bytes
                        failure.errno = errno.EIO
                    raise failure from exc
                if exact or not node.gone or entry.dirty or entry.etag == node.etag:
                    try:
                        h.fd = os.open(entry.path, os.O_RDONLY)
                    except OSError as exc:
                        self.cache.release(entry)
                        if isinstance(exc, FileNotFoundError) and not node.gone and rewritten < 3 \
                                and self.cache.get(vs.bucket, node.key) is not entry:
                            # the copy was dropped as it arrived: a writer of this mount took
                            # the key meanwhile (the same inode): read the file as it is now
                            rewritten += 1
                            exact = self.tree.serves(node.ino, node.etag)
                            continue
                        raise cache_failure(exc, "opening", entry) from exc
                    break
                # the name moved to another inode while S3 was asked: this inode's pages are
                # its version's, so is what this handle reads
                self.cache.release(entry)
                exact = True
            h.entry = entry
            if info is not None and (info["etag"] != node.etag or info["size"] != node.size):
                # S3 is ahead of the listing: show what was read
                node = self.tree.object_changed(node, info["size"],
                                                int(info.get("mtime", 0) * 1e9) or node.mtime_ns,
                                                info["etag"], reader=h)
            if entry.etag == node.etag and not entry.dirty:
                self.tree.served(node.ino, entry.etag)
            return h.fd

    async def read(self, fh: int, off: int, size: int) -> bytes:
        h = self.handles.file(fh)
        waits = self.cache.waits  # changed by the time it is answered: a cache miss
        fd = h.fd if h.fd is not None else await self._ready(h, off, size)
        entry = h.entry
        end = min(off + size, entry.size)
        present = entry.present
        if present is not None and off < end:
            if not present.covers(off, min(end, entry.source_len)):
                try:
                    await self.cache.ensure(self.store, entry, off, end)
                except StoreError as exc:
                    if not entry.dirty:
                        self.tree.version_gone(h.node, entry.etag)
                    raise read_failed(exc, entry) from exc
            # nothing awaited since ``ensure`` made sure of the bytes: none was evicted
            self.cache.touch(entry, off, end)
            if not entry.dirty and not h.writer:
                self.readahead.after_read(h.stream, entry, off, end)
        if off < end:
            self.cache.served(end - off, self.cache.waits != waits)
        return os.pread(fd, size, off)

    async def release(self, fh: int) -> None:
        """A reading handle closed: its descriptor, its read-ahead and its hold end."""
        closed = self.handles.close_file(fh)
        if closed is None:
            return
        h, entry = closed
        self.readahead.stop(h.stream)
        if entry is not None:
            self.cache.release(entry)
