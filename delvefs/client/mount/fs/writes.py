"""The write path's foreground: create, write, flush, fsync, truncate of dirty files.

A file opened for writing is a dirty cache entry: a local file of its own, journaled
before its first byte (``delvefs.client.mount.fs.written``) with the version it is based on (the
ETag it was opened from, "" for a new file). Strict mode (the default): the last writing
handle's ``flush`` (close(2) returns its error), ``fsync`` and a truncate(2) without an
open handle upload the whole object (``delvefs.client.mount.fs.uploads``); a release that leaves
it dirty hands it to the background uploads. Eager files (an ``--eager`` mount's, or those
a view's ``write: {eager: [...]}`` names: ``WrittenFiles.eager`` decides): ``flush`` returns
once the file's journal record is written (not fsync'd: a killed mount loses nothing, a
machine crash may lose the last closes); ``fsync`` waits for the file's upload — or, with
``fsync=journal``, only until the file and its record are durable on the local disk
(``WrittenFiles.make_durable``); the upload follows the last close in the background.

Writes are not locked: a write during an upload bumps the entry's ``gen``, so the entry
stays dirty and is uploaded again (the uploads' rules: ``delvefs.client.mount.fs.uploads``).
"""
from __future__ import annotations

import errno
import logging
import os
import time

from ..cache.cacheentry import CacheEntry
from ..errors import FsError, StoreError, cache_failure, read_only, store_failure
from .handles import FileHandle, Handles, WriteHandle
from .inodes import File, InodeTable, Node, key_for, looked_up_again, writable_dir
from .layout import PropertyLayout
from .properties import final_tags
from .subsystems import Shape
from .tree import Tree
from .uploads import Uploads
from .listings import Listings

log = logging.getLogger(__name__)

# fallocate(2) modes (linux/falloc.h)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
ZEROS_AT_ONCE = 1 << 20  # a punched hole or zeroed range is written in pieces this big
# the most the kernel asks copy_file_range for at once (a FUSE reply counts 32 bits): the
# largest multiple of the page size below 4 GiB
COPY_PIECE = 0xFFFFFFFF & ~0xFFF


class Writes:
    """create, write, flush, fsync and truncate of dirty files."""

    def __init__(self, shape: Shape, handles: Handles, listings: Listings, uploads: Uploads, written,
                 cache, store, settings):
        self.table: InodeTable = shape.table
        self.catalog = shape.catalog
        self.handles = handles
        self.tree: Tree = shape.tree
        self.layout: PropertyLayout = shape.layout
        self.listings = listings
        self.uploads = uploads
        self.written = written
        self.cache = cache
        self.store = store
        # fsync(2) returns once the file is durable locally (eager mounts only)
        self.fsync_local = settings.eager and settings.fsync == "journal"
        self.stream_parts = settings.upload_while_writing and not settings.eager

    async def _make_writable(self, node: File, *, truncate: bool) -> CacheEntry:
        """The dirty local copy of ``node``: nothing is downloaded — an existing object
        opened without truncating is a sparse file based on the listed version, whose
        missing bytes are fetched when read or uploaded (``delvefs.client.mount.fs.written``).
        A move or removal of the file under way ends first (``Tree.moving``)."""
        while (moved := self.tree.move_of(node)) is not None:
            await moved.wait()
        if node.gone:
            raise looked_up_again(node)
        vs = node.parent.view
        bucket, key = vs.bucket, node.key
        base, size = node.etag, node.size
        self._orphan_others(bucket, key)
        entry = self.cache.get(bucket, key)
        if not base and size > 0 and not truncate and not (entry is not None and entry.dirty):
            try:  # a size without a version: ask S3 which version it is
                info = await self.store.head(bucket, key)
            except StoreError as exc:
                raise store_failure(exc, "opening for writing", bucket, key) from exc
            base, size = info["etag"], info["size"]
            if node.gone:
                raise looked_up_again(node)
        try:
            entry = self.written.take(bucket, key, view=vs.name, base=base or "",
                                    truncate=truncate, size=size)
        except StoreError as exc:
            raise store_failure(exc, "writing", bucket, key) from exc
        self.tree.dirtied(vs, node, entry)
        return entry

    def _orphan_others(self, bucket: str, key: str) -> None:
        """An entry of the key uploaded while descriptors still write it, all of them of a
        file replaced or removed since, is theirs alone: never the base of the key's next
        file."""
        entry = self.cache.get(bucket, key)
        if entry is None or entry.dirty or not entry.writers:
            return
        writers = [h for h in self.handles.files.values() if h.writer and h.entry is entry]
        if writers and all(h.node.gone for h in writers):
            self.written.orphan(entry)

    def _writer(self, node: File, entry: CacheEntry, what: str) -> int:
        """A handle writing to ``node`` through its dirty ``entry``."""
        try:
            fd = os.open(entry.path, os.O_RDWR)
        except OSError as exc:
            raise cache_failure(exc, what, entry) from exc
        h = WriteHandle(node, fd, entry)
        self.written.add_writer(entry)
        return self.handles.add_file(h)

    async def open_writer(self, node: File, *, truncate: bool, removed_first: bool = True) -> int:
        """A handle writing to ``node``. An open of a file this mount removed or replaced
        since the kernel looked its name up (another process's unlink or rename won the
        race to the name) with ``O_TRUNC`` opens first: an empty file of its own, read and
        written through its descriptor and dropped at its close, as a local file system's
        file unlinked while open. Otherwise a file that left its name is ESTALE: the kernel
        looks the name up again and opens what it holds now (always without
        ``removed_first``)."""
        while (moved := self.tree.move_of(node)) is not None:
            await moved.wait()
        if node.gone:
            if truncate and removed_first and self._removed_unheld(node):
                return self._removed_file_writer(node)
            raise looked_up_again(node)
        entry = await self._make_writable(node, truncate=truncate)
        return self._writer(node, entry, "opening")

    def _removed_unheld(self, node: File) -> bool:
        """``node`` was removed by this mount's unlink or rename and no descriptor holds it
        (else what it is now is theirs to share)."""
        return self.tree.removed_here(node) and not any(
            h.node is node for h in self.handles.files.values())

    def _removed_file_writer(self, node: File) -> int:
        """A writing handle of an empty file no key has (see ``open_writer``)."""
        vs = node.parent.view
        try:
            entry, fd = self.cache.scratch_file(vs.bucket, node.key)
        except StoreError as exc:
            raise store_failure(exc, "opening", vs.bucket, node.key) from exc
        h = WriteHandle(node, fd, entry)
        self.written.add_writer(entry)
        self.tree.shown_as(node, size=0, mtime_ns=time.time_ns())
        return self.handles.add_file(h)

    async def create(self, parent_ino: int, name: str, flags: int) -> tuple[int, File]:
        """Create (or, without O_EXCL, open for writing) the file ``name``: a handle and
        the node (its lookup count + 1)."""
        self.written.request_seen()
        parent, vs = writable_dir(self.table, parent_ino)
        key = key_for(parent, vs, name)
        await self.listings.fresh(vs)
        # the file the name holds, opened; a rename or unlink of it under way ends first,
        # then the name is looked at again (it may hold another file, or none)
        while (existing := parent.children.get(name)) is not None:
            if existing.is_dir:
                raise FsError(errno.EISDIR)
            if flags & os.O_EXCL:
                raise FsError(errno.EEXIST)
            if (moved := self.tree.move_of(existing)) is not None:
                await moved.wait()
                continue
            try:
                fh = await self.open_writer(existing, truncate=bool(flags & os.O_TRUNC),
                                            removed_first=False)
            except FsError as exc:
                if exc.errno == errno.ESTALE and parent.children.get(name) is not existing:
                    continue  # it left the name meanwhile
                raise
            self.table.ref(existing)
            return fh, existing
        implied = self.layout.implied_tags(parent, key)  # layout by properties: tags from its directories
        self._orphan_others(vs.bucket, key)
        try:
            entry = self.written.take(vs.bucket, key, view=vs.name, base="", truncate=True)
            if implied is not None:
                self.written.update_record(entry, **implied)
        except StoreError as exc:
            raise store_failure(exc, "creating", vs.bucket, key) from exc
        node = self.tree.put(vs, {"key": key, "size": 0, "mtime": time.time(), "etag": ""},
                         notify=False, remote=False)
        if node is None or node.is_dir:  # cannot happen: the name was checked
            self.written.discard(entry)
            raise FsError(errno.EINVAL, f"{key}: cannot be created")
        self.tree.dirtied(vs, node, entry)
        fh = self._writer(node, entry, "creating")
        self.table.ref(node)
        return fh, node

    async def write(self, fh: int, off: int, data: bytes) -> int:
        self.written.request_seen()
        h = self.handles.files.get(fh)
        if h is None or not h.writer:
            raise FsError(errno.EBADF)
        entry, node = h.entry, h.node
        if self._orphaned(h):
            return self._write_orphan(h, off, data)
        try:
            if not entry.dirty:  # uploaded by an fsync/flush, written again through this handle
                vs = node.parent.view
                self.written.redirty(entry, vs.name)
                self.tree.dirtied(vs, node, entry)
            self.written.journal(entry)
        except StoreError as exc:
            raise self._write_failed(
                entry, store_failure(exc, "writing", entry.bucket, entry.key)) from exc
        try:
            n = self.cache.pwrite(h.fd, data, off)  # (a full disk: clean blocks make room)
        except OSError as exc:
            raise self._write_failed(entry, cache_failure(exc, "writing", entry)) from exc
        grew = off + n > entry.size
        try:
            self.written.written(entry, off, off + n)
        except StoreError as exc:
            raise self._write_failed(
                entry, store_failure(exc, "writing", entry.bucket, entry.key)) from exc
        self.tree.shown_as(node, size=entry.size, mtime_ns=time.time_ns())
        if grew:
            self.tree.sizes(entry)
        if self.stream_parts:
            self.uploads.stream(entry, off, off + n)
        return n

    def _write_failed(self, entry: CacheEntry, failure: FsError) -> FsError:
        """A write (truncate, fallocate) into the written file failed with ``failure``: the
        file is partial now, never uploaded; every close and fsync of it answers that errno
        and its last close drops its changes (``WrittenFiles.write_failed``). Returns
        ``failure``, for the caller to raise."""
        self.written.write_failed(entry, failure.errno)
        return failure

    def written_by_kernel(self, h: FileHandle, size: int, mtime_ns: int) -> None:
        """FUSE passthrough (delvefs.client.mount.passthrough): the kernel wrote the handle's
        file itself — it is ``size`` bytes now, changed at ``mtime_ns``. The entry counts it
        as written (re-dirtied if an upload cleaned it meanwhile; its gen bumped, so that an
        upload under way leaves it dirty), and the node shows that size and mtime. Only for
        files without a ranges log (nothing to record but that everything changed)."""
        entry, node = h.entry, h.node
        if self._orphaned(h):
            self._orphan_size(h, size)
            return
        try:
            if not entry.dirty:
                vs = node.parent.view
                self.written.redirty(entry, vs.name)
                self.tree.dirtied(vs, node, entry)
            self.written.journal(entry)
            self.written.written(entry, 0, size)
        except StoreError as exc:
            raise store_failure(exc, "writing", entry.bucket, entry.key) from exc
        self.tree.shown_as(node, size=entry.size)
        self.tree.sizes(entry)
        self.tree.shown_as(node, mtime_ns=mtime_ns)

    async def fallocate(self, ino: int, fh: int, mode: int, offset: int, length: int) -> None:
        """fallocate(2) through a descriptor open for writing: mode 0 extends the file with
        zeros to ``offset + length`` (S3 has no preallocation: nothing else to do);
        ``KEEP_SIZE`` alone changes nothing; ``PUNCH_HOLE | KEEP_SIZE`` and ``ZERO_RANGE``
        (with or without ``KEEP_SIZE``) make the range zeros, uploaded as zeros. Other modes
        (collapse, insert, unshare) are EOPNOTSUPP."""
        h = self.handles.files.get(fh)
        if h is None or not h.writer:
            raise FsError(errno.EBADF)
        if offset < 0 or length <= 0:
            raise FsError(errno.EINVAL)
        keep = bool(mode & FALLOC_FL_KEEP_SIZE)
        zeroing = mode & ~FALLOC_FL_KEEP_SIZE
        if zeroing not in (0, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE) or (
                zeroing == FALLOC_FL_PUNCH_HOLE and not keep):
            raise FsError(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not supported")
        end, size = offset + length, h.entry.size
        if not zeroing:
            if not keep and end > size:
                await self.setattr(ino, size=end, fh=fh)
            return
        stop = min(end, size) if keep else end
        for at in range(offset, stop, ZEROS_AT_ONCE):
            n = min(ZEROS_AT_ONCE, stop - at)
            await self.write(fh, at, bytes(n))

    async def copy_file_range(self, fh_in: int, off_in: int, fh_out: int, off_out: int,
                              length: int, flags: int) -> int:
        """copy_file_range(2) (``cp``): a whole object copied to offset 0 of a new, empty
        file is a server-side copy (the destination's tags as a new file of its view gets),
        and the descriptor writes that object from then on; anything else is EOPNOTSUPP,
        and the kernel copies by read and write. The bytes copied.

        The kernel asks for at most ``COPY_PIECE`` bytes at a time: a first piece that long
        copies the whole object (and answers its length); the pieces that follow, at the
        same offsets in both files, find their bytes there already."""
        h_in, h_out = self.handles.files.get(fh_in), self.handles.files.get(fh_out)
        if h_in is None or h_out is None or not h_out.writer:
            raise FsError(errno.EBADF)
        src, dst, out = h_in.node, h_out.node, h_out.entry
        if h_out.copied is not None and h_out.copied == (fh_in, out.etag, src.etag) \
                and off_in == off_out and not flags and not out.dirty and not dst.gone:
            return max(0, min(length, out.size - off_in))  # a later piece: copied already
        vs_in, vs_out = src.parent.view, dst.parent.view
        source = self.cache.get(vs_in.bucket, src.key)
        if not (off_in == 0 and off_out == 0 and not flags and length >= min(src.size, COPY_PIECE)
                and src.size > 0
                and src.etag and not src.gone and not dst.gone and out.dirty and out.size == 0
                and out.meta.get("base") == "" and self.cache.get(out.bucket, out.key) is out
                and not (source is not None and source.dirty)):
            raise FsError(errno.EOPNOTSUPP, "not a whole object into a new file")
        tags = final_tags(out, vs_out, None)
        if not self.catalog.can_match(vs_out, out.key, src.size, tags):
            raise FsError(errno.EOPNOTSUPP, "a scratch file: copied locally")
        started = time.time()
        async with self.uploads.entry_lock(out):
            if not out.dirty or out.size or self.cache.get(out.bucket, out.key) is not out:
                raise FsError(errno.EOPNOTSUPP, "written meanwhile")
            info = await self.uploads.copy_into(out, vs_in.bucket, src.key, tags)
            self.uploads.unschedule(out)
            self.written.discard(out)  # its empty local file is void
            try:  # the descriptor writes the copied object now: nothing of it is local yet
                entry = self.written.take(out.bucket, out.key, view=vs_out.name,
                                        base=info["etag"], truncate=False, size=info["size"])
                self.written.uploaded(entry, info["etag"])
                fd = os.open(entry.path, os.O_RDWR)
            except (StoreError, OSError) as exc:
                raise FsError(errno.EIO, f"{out.bucket}/{out.key}: copied, but its cache "
                              f"file: {exc}") from exc
            os.close(h_out.fd)
            self.written.drop_writer(out)
            self.cache.release(out)
            self.written.add_writer(entry)
            h_out.fd, h_out.entry = fd, entry
            h_out.copied = (fh_in, info["etag"], src.etag)
        log.info("copied %s/%s to %s/%s server-side: %d bytes", vs_in.bucket, src.key,
                 out.bucket, out.key, info["size"])
        self.tree.shown_as(dst, size=info["size"], etag=info["etag"], mtime_ns=time.time_ns())
        self.tree.unserve(dst.ino)
        self.tree.local_put(out.bucket, out.key, {"key": out.key, "size": info["size"],
                                                  "mtime": info["mtime"], "etag": info["etag"]},
                            tags, quiet=vs_out, since=started)
        return min(info["size"], length)

    def _write_orphan(self, h: FileHandle, off: int, data: bytes) -> int:
        """A write to a file unlinked (or replaced by a rename) while open: the file lives
        on in its descriptors, read and written through them, its size as written, until the
        last one closes; then its bytes go nowhere (as on any file system)."""
        try:
            n = self.cache.pwrite(h.fd, data, off)
        except OSError as exc:
            raise cache_failure(exc, "writing", h.entry) from exc
        self._orphan_size(h, max(h.entry.size, off + n))
        return n

    def _orphan_size(self, h: FileHandle, size: int) -> None:
        self.written.orphan_resized(h.entry, size)
        if h.node.gone:
            self.tree.shown_as(h.node, size=size, mtime_ns=time.time_ns())

    def _orphaned(self, h: FileHandle) -> bool:
        """The handle's file was unlinked (or replaced by a rename) while open."""
        e = h.entry
        return h.node.gone or self.cache.get(e.bucket, e.key) is not e

    def _live(self, h: FileHandle) -> bool:
        """The handle's entry is still the file of a key (not unlinked, not replaced)."""
        e = h.entry
        return e.dirty and self.cache.get(e.bucket, e.key) is e

    async def flush(self, fh: int) -> None:
        """close(2) of a descriptor: the last writing handle uploads (errors returned); of an
        eager file (``WrittenFiles.eager``: an eager mount, or a view's ``write: {eager:
        ...}``) it only makes the file safe in the journal and queues the upload. Every
        close of a file a write into failed answers that write's errno, and nothing is
        uploaded or queued (as NFS reports a failed write back at close)."""
        self.written.request_seen()
        h = self.handles.files.get(fh)
        if h is None or not h.writer:
            return
        entry = h.entry
        failed = self.written.failed_write(entry)
        if failed is not None:
            raise failed
        if entry.writers <= 1 and self._live(h):
            if self.written.eager(entry):
                self._persist(entry)
                self.written.queue(entry)
            else:
                await self.uploads.upload(entry)

    def _persist(self, entry: CacheEntry) -> None:
        """Eager close: the record on disk (written on the loop when it is not there yet; not
        fsync'd, see ``WrittenFiles.persist``) before close returns."""
        try:
            self.written.persist(entry)
        except StoreError as exc:
            raise store_failure(exc, "journaling", entry.bucket, entry.key) from exc

    async def release(self, fh: int) -> None:
        """A writing handle closed (after its flush): its descriptor closed, one writer less;
        a file its flush could not upload is left to the background uploader (retried); the
        last close of a file a write into failed drops its changes (``_drop_failed``)."""
        closed = self.handles.close_file(fh)
        if closed is None:
            return
        h, entry = closed
        if entry is not None:
            self.written.release_writer(entry, named=not h.node.gone)
            if entry.writers == 0 and self.written.failed_write(entry) is not None:
                await self._drop_failed(entry)

    async def _drop_failed(self, entry: CacheEntry) -> None:
        """Nobody writes a file a write into failed any more: its local changes are dropped,
        never uploaded, and its key shows what S3 has — the version it was based on, or
        nothing for a new file (``Uploads.show_remote``)."""
        async with self.uploads.entry_lock(entry):  # an upload under way ends first
            if entry.writers or self.written.failed_write(entry) is None:
                return  # opened for writing again meanwhile (still failed), or emptied (O_TRUNC)
            bucket, key = entry.bucket, entry.key
            base = (entry.meta or {}).get("base", entry.etag)
            self.uploads.unschedule(entry)
            self.written.drop_failed(entry)
        await self.uploads.show_remote(bucket, key, existing=base != "")

    async def fsync(self, fh: int) -> None:
        """fsync(2) and fdatasync(2) alike: the file uploaded (its error returned); with
        ``fsync=journal`` (eager) durable on the local disk, uploaded in the background
        after its last close as any eager file."""
        h = self.handles.files.get(fh)
        if h is None or not h.writer:
            return
        failed = self.written.failed_write(h.entry)
        if failed is not None:  # a write into it failed: its errno, nothing uploaded
            raise failed
        if not self._live(h):
            return
        if self.fsync_local:
            entry = h.entry
            try:
                await self.written.make_durable(entry)
            except StoreError as exc:
                raise store_failure(exc, "fsync", entry.bucket, entry.key) from exc
            if self._live(h):  # (not uploaded or removed meanwhile)
                self.written.hurry(entry)  # no write-back delay after an fsync
            return
        if not await self.uploads.upload(h.entry):
            log.info("fsync of scratch file %s/%s: kept local (its name cannot match view %s)",
                     h.entry.bucket, h.entry.key, h.entry.meta.get("view"))

    async def setattr(self, ino: int, *, size: int | None = None, fh: int | None = None) -> Node:
        """chmod/chown/utimens are accepted and not stored; a size truncates the local
        copy (uploaded at once when no handle writes to it: truncate(2))."""
        node = self.table.require(ino)
        vs = node.view if node.is_dir else node.parent.view
        if vs is not None and not vs.writable:
            raise read_only(vs.name)
        if size is None:
            return node
        if node.is_dir:
            raise FsError(errno.EISDIR)
        h = self.handles.files.get(fh) if fh is not None else None
        if h is not None and h.writer and h.node is node and self._orphaned(h):
            try:  # ftruncate(2) of a file unlinked while open
                os.ftruncate(h.fd, size)
            except OSError as exc:
                raise cache_failure(exc, "truncating", h.entry) from exc
            self._orphan_size(h, size)
            return node
        if node.gone:
            if h is None and self._removed_unheld(node):
                # truncate(2) of a file this mount removed (or replaced) since the kernel
                # looked its name up: it takes effect first, and the removal leaves nothing
                # of it (as on a local file system where the truncate wins the race)
                self.tree.shown_as(node, size=size)
                return node
            raise looked_up_again(node)  # left by a change in S3: the kernel looks again
        if h is not None and h.writer and h.node is node:
            entry = h.entry
            if not entry.dirty:
                try:
                    self.written.redirty(entry, vs.name)
                except StoreError as exc:
                    raise self._write_failed(
                        entry, store_failure(exc, "truncating", entry.bucket, entry.key)) from exc
        else:
            entry = await self._make_writable(node, truncate=size == 0)
        try:
            self.written.truncate(entry, size)
        except StoreError as exc:
            failure = self._write_failed(
                entry, store_failure(exc, "truncating", entry.bucket, entry.key))
            if entry.writers == 0:  # truncate(2): nobody closes it later
                await self._drop_failed(entry)
            raise failure from exc
        self.uploads.truncated(entry, size)
        self.tree.dirtied(node.parent.view, node, entry)
        self.tree.sizes(entry)
        if entry.writers == 0:
            if self.written.eager(entry):
                self._persist(entry)
                self.written.queue(entry)
            else:
                await self.uploads.upload(entry)
        return node
