"""Names: unlink, mkdir, rmdir, rename, and which key a name in a view has.

unlink = DeleteObject; rename = server-side copy + delete (a dirty file is only re-keyed).
A directory moves object by object, and is *published* as one batch (``publish``): the
handler shows subscribers all of its files in one change, once the last is in S3. A
directory made by mkdir exists in this mount only (the tree's ``local_dirs``) until an
object lies below it; a directory whose last entry goes away through this mount stays, as
if mkdir'ed, until rmdir.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import logging

import trio

from delvefs.shared.manifests import BATCH_FIELD

from ..errors import FsError, StoreError, store_failure
from .catalog import ViewCatalog, ViewState
from .deletes import DeleteQueue
from .inodes import (Dir, File, InodeTable, Node, check_key, check_name, key_for, unshowable,
                     valid_segment, writable_dir)
from .layout import PropertyLayout
from .properties import Properties
from .publisher import Publisher
from .reads import Reads
from .subsystems import Shape, Writing
from .tree import Tree
from .uploads import Uploads
from .listings import Listings

# an rmdir's check of S3 below its directory is trusted by the rmdir of a parent this long
# (``rm -r`` removes bottom-up: each level is listed once); the newest ones are kept
CHECKED_FOR, CHECKED_KEPT = 60.0, 10_000
log = logging.getLogger(__name__)


class Namespace:
    """unlink, mkdir, rmdir and rename."""

    def __init__(self, shape: Shape, listings: Listings, writing: Writing, reads: Reads, cache,
                 store, settings):
        self.table: InodeTable = shape.table
        self.catalog: ViewCatalog = shape.catalog
        self.tree: Tree = shape.tree
        self.layout: PropertyLayout = shape.layout
        self.listings = listings
        self.uploads: Uploads = writing.uploads
        self.deletes: DeleteQueue = writing.deletes
        self.properties: Properties = writing.properties
        self.publisher: Publisher = writing.publisher
        self.reads = reads
        self.written = writing.written
        self.cache = cache
        self.store = store
        self.eager = settings.eager
        # (bucket, prefix) -> when an rmdir found nothing showable below it in S3
        self._checked: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    async def unlink(self, parent_ino: int, name: str) -> None:
        parent, vs = writable_dir(self.table, parent_ino)
        await self.listings.fresh(vs)
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
        lock = self.uploads.entry_lock(entry) if entry is not None and entry.dirty else contextlib.nullcontext()
        async with lock:
            if node.gone:
                raise FsError(errno.ENOENT)
            vs = node.parent.view
            bucket, key = vs.bucket, node.key
            entry = self.cache.get(bucket, key)
            local_only = entry is not None and entry.dirty and not entry.meta.get("existing") \
                and not node.etag
            with self.tree.moving(node), self.tree.leaving(vs, key):
                # (a local-only file's leaving mark is its "local" one)
                if self._written(entry) and entry.opens:  # still read through a handle
                    await self.uploads.keep_source(entry, "removing (fetching what it lacks)")
                # descriptors opened for reading and not read yet take the file's bytes now:
                # a local-only file's are nowhere else afterwards
                await self.reads.keep_for_readers(node)
                if not local_only:
                    if self.written.eager_for(vs, bucket, key):  # in a DeleteObjects batch (deletes.py)
                        self.deletes.queue(bucket, key)
                    else:
                        try:
                            await self.store.delete(bucket, key)
                        except StoreError as exc:
                            raise store_failure(exc, "deleting", bucket, key) from exc
                entry = self.cache.get(bucket, key)
                if entry is not None:
                    self.uploads.unschedule(entry)
                    self.written.orphan(entry)
                self.tree.keep_dir(node.parent)
                if local_only:
                    self.tree.drop_local(bucket, key, vs)
                else:
                    self.tree.local_delete(bucket, key, also=vs, quiet=True)
                    self.tree.unshadow(bucket, key)
                if not node.gone:  # not shown by the view's rules (scratch): remove it here
                    self.tree.remove(node, notify=False)

    async def mkdir(self, parent_ino: int, name: str) -> Dir:
        parent, vs = writable_dir(self.table, parent_ino)
        if vs.by is not None:  # layout by properties: a directory for a property value (tree.py)
            await self.listings.fresh(vs)
            self.layout.check_mkdir(parent, name)
            return self.tree.mkdir_local(parent, name, parent.prefix)
        if vs.flat:
            raise FsError(errno.EPERM, f"view {vs.name} is flat: no directories")
        check_name(name)
        if not valid_segment(name):
            raise FsError(errno.EINVAL)
        check_key(parent.prefix + name + "/")
        await self.listings.fresh(vs)
        if name in parent.children:
            raise FsError(errno.EEXIST)
        return self.tree.mkdir_local(parent, name, parent.prefix + name + "/")

    async def rmdir(self, parent_ino: int, name: str) -> None:
        parent, vs = writable_dir(self.table, parent_ino)
        await self.listings.fresh(vs)
        d = parent.children.get(name)
        if d is None:
            raise FsError(errno.ENOENT)
        if not d.is_dir:
            raise FsError(errno.ENOTDIR)
        if d.children:
            raise FsError(errno.ENOTEMPTY)
        if vs.by is None:
            await self._nothing_more_in_s3(vs, d)
            if d.gone:
                return
            if d.children:
                raise FsError(errno.ENOTEMPTY)
        if not self.tree.is_local_dir(d) and vs.by is None:  # an empty virtual directory: a folder marker
            if self.eager:
                self.deletes.queue(vs.bucket, d.prefix)
            else:
                try:
                    await self.store.delete(vs.bucket, d.prefix)
                except StoreError as exc:
                    raise store_failure(exc, "deleting folder marker", vs.bucket, d.prefix) from exc
            self.tree.local_delete(vs.bucket, d.prefix, also=vs)
        if d.gone or d.children:
            return
        self.tree.remove_dir(d)

    async def _nothing_more_in_s3(self, vs: ViewState, d: Dir) -> None:
        """Before an rmdir succeeds: S3 holds no object below ``d`` that the view would show
        after a refresh (the listing may be stale: another mount's files not listed yet).
        ListObjectsV2 of its prefix one level at a time (delimiter ``/``); a subdirectory
        this mount's rmdir checked a moment ago (``rm -r`` goes bottom-up) is not listed
        again, other ones are; the keys this mount removed (DELETE queued, or not confirmed
        yet) do not count. Finding one refreshes the view and fails with ENOTEMPTY: ``rm -r``
        never reports success while S3 keeps what a refresh would show."""
        found = await self._showable_below(vs, d, d.prefix)
        if found is not None:
            log.info("rmdir %s: S3 still holds %s/%s, not listed here yet: refreshing the view",
                     d.prefix, vs.bucket, found)
            await self.listings.refresh_now(vs)
            raise FsError(errno.ENOTEMPTY, f"S3 still holds {found} (listed now)")
        self._checked[(vs.bucket, d.prefix)] = trio.current_time()
        while len(self._checked) > CHECKED_KEPT:
            self._checked.popitem(last=False)

    async def _showable_below(self, vs: ViewState, d: Dir, prefix: str) -> str | None:
        """The key of an object below ``prefix`` that the view would show, or None."""
        continuation = None
        while True:
            try:
                page = await self.store.list_level(vs.bucket, prefix, continuation)
            except StoreError as exc:
                if not self.eager:
                    raise store_failure(exc, "listing (rmdir)", vs.bucket, prefix) from exc
                # eager mode defers S3 through an outage (its DELETEs are queued): the
                # directory goes as the listing shows it, unchecked
                log.warning("rmdir %s: S3 could not be listed (%s): removed as listed here, "
                            "unchecked", prefix, exc)
                return None
            for obj in page["objects"]:
                if await self._would_show(vs, d, obj):
                    return obj["key"]
            now = trio.current_time()
            for sub in page["prefixes"]:
                checked = self._checked.get((vs.bucket, sub))
                if checked is not None and now - checked < CHECKED_FOR:
                    continue
                found = await self._showable_below(vs, d, sub)
                if found is not None:
                    return found
            continuation = page["next"]
            if continuation is None:
                return None

    async def _would_show(self, vs: ViewState, d: Dir, obj: dict) -> bool:
        key = obj["key"]
        if key == d.prefix or (vs.bucket, key) in self.deletes.queued \
                or unshowable(key[len(vs.root):], vs.flat) is not None:
            return False
        p = vs.overlay.get(key)
        if p is not None and p.kind in ("delete", "leaving"):
            return False
        tags = metadata = {}
        if vs.view.reads_tags or vs.view.reads_metadata:
            try:
                tags = await self.store.tags(vs.bucket, key) if vs.view.reads_tags else {}
                metadata = (await self.store.head(vs.bucket, key))["metadata"] if vs.view.reads_metadata else {}
            except StoreError as exc:
                if exc.errno == errno.ENOENT:
                    return False  # gone meanwhile
                raise store_failure(exc, "reading tags (rmdir)", vs.bucket, key) from exc
        return self.catalog.can_match(vs, key, obj["size"], tags, metadata)

    async def rename(self, old_parent_ino: int, old_name: str, new_parent_ino: int,
                     new_name: str, flags: int = 0) -> None:
        src_parent, src_vs = writable_dir(self.table, old_parent_ino)
        dst_parent, dst_vs = writable_dir(self.table, new_parent_ino)
        if flags & 2:  # RENAME_EXCHANGE
            raise FsError(errno.EINVAL, "RENAME_EXCHANGE is not supported")
        await self.listings.fresh(src_vs)
        if dst_vs is not src_vs:
            await self.listings.fresh(dst_vs)
        node = src_parent.children.get(old_name)
        if node is None:
            raise FsError(errno.ENOENT)
        key_for(dst_parent, dst_vs, new_name)  # a valid name there
        target = dst_parent.children.get(new_name)
        if target is node:
            return
        if target is not None and flags & 1:  # RENAME_NOREPLACE
            raise FsError(errno.EEXIST)
        if node.is_dir:
            if dst_vs is not src_vs or dst_vs.by is not None:  # (by properties: mv retags file by file)
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
            retag = self.layout.dir_tags(dst_parent)  # layout by properties: its directories' values
            if retag is not None and dst_vs is src_vs:  # retagged first: it moves there, same name
                await self._retag_into(node, dst_parent, retag)
                if node.parent is dst_parent and node.name == new_name:
                    return
            await self._rename_file(node, dst_parent, new_name, target)
            if retag is not None:
                await self._retag_into(node, dst_parent, retag)

    async def _retag_into(self, node: File, d: Dir, implied: dict) -> None:
        """A file moved (renamed) into ``d`` of a layout by properties takes its values as
        tags (an object's tags: PutObjectTagging; a dirty file's: at its upload)."""
        vs = d.view
        if node.gone or node.parent.view is not vs:
            return
        if self.layout.values_of(vs, node.key) == implied["values"]:
            return
        tags, _ = await self.properties.of(node)
        untag = tuple(t for t in tags if t.lower() in implied["untag"])
        if node.parent is not d:
            self.tree.keep_dir(node.parent)  # as after any rename out of it: stays until rmdir
        await self.properties.retag(node, implied["tags"], untag)
        self.tree.place(node, implied["values"])

    async def _relocate(self, node: File, dst_vs: ViewState, dk: str, target: Node | None,
                        result: dict, batch: str | None = None) -> None:
        """Move one file's object (server-side copy + delete) or its dirty local copy
        (re-keyed) to ``dst_vs``/``dk``; the tree is changed by the caller. ``result``
        gets ``obj``, ``tags``, ``dirty`` (the entry, when local content moved). ``batch``:
        the new object is part of that publish batch (a copy or upload with its metadata;
        a file still open for writing is not)."""
        src_vs = node.parent.view
        sb, sk, db = src_vs.bucket, node.key, dst_vs.bucket
        entry = self.cache.get(sb, sk)
        if entry is not None and entry.dirty:
            # a dirty file it replaces may be uploading: that upload ends first
            async with self.uploads.entry_locks(entry, self._dirty_at(db, dk)):
                if entry.dirty and (entry.bucket, entry.key) == (sb, sk):
                    await self.uploads.keep_source(entry, "renaming (fetching what it lacks)")
                    replaced = self._written_at(db, dk)
                    if replaced is not None and replaced.opens:  # its descriptors read on
                        await self.uploads.keep_source(replaced, "replacing (fetching what it lacks)")
                    await self._keep_for_readers(node, target)
                    # a file S3 never had leaves alone an object of its key (another
                    # writer's, which other views may show)
                    result["local_only"] = not (entry.meta.get("existing") or node.etag)
                    if not result["local_only"]:
                        try:
                            await self.store.delete(sb, sk)
                        except StoreError as exc:
                            raise store_failure(exc, "deleting (rename)", sb, sk) from exc
                    self.uploads.unschedule(entry)
                    # based on what S3 holds at the new key as far as this mount knows: what
                    # a dirty file it replaces was based on (uploaded while open, its node
                    # may not show that version yet), else the target's version, else
                    # nothing; a conflict copy renamed is an ordinary file again
                    base, existing = self._known_version(db, dk, target)
                    self._discard_written(db, dk, entry, dst_vs)
                    self.written.rekey(entry, db, dk)
                    self.written.update_record(entry, view=dst_vs.name, base=base, conflict=None,
                                             existing=existing,
                                             batch=batch if entry.writers == 0 else None)
                    self.tree.shown_as(node, etag="")
                    result["dirty"] = entry
                    return
        tags = {}
        if self.catalog.needs_tags(db) or self.catalog.needs_tags(sb):
            tags = await self.properties.object_tags(sb, sk, "renaming")
        if not self.catalog.can_match(dst_vs, dk, node.size, tags):
            raise FsError(errno.EXDEV, f"{dk} cannot be in view {dst_vs.name} (mv copies, then "
                          "removes: the copy is a scratch file of this mount)")
        replaced = self._written_at(db, dk)
        # a clean copy written through open handles (uploaded by an fsync, say) follows the
        # rename, or their writes would land in a file no key has any more: the copy is
        # made of exactly its version (a multipart copy's ETag is another than its source's)
        ce = self.cache.get(sb, sk)
        held = ce is not None and not ce.dirty and ce.writers > 0 and ce.etag == node.etag
        async with self.uploads.entry_locks(replaced):  # its upload, if one runs, ends first
            if replaced is not None and replaced.opens:  # read through a handle
                await self.uploads.keep_source(replaced, "replacing (fetching what it lacks)")
            await self._keep_for_readers(node, target)
            try:
                await self.deletes.settle(db, dk)  # eager: a queued DELETE of dk must go first
                info = await self.store.copy(
                    db, dk, sb, sk, src_etag=ce.etag if held else None,
                    metadata=None if batch is None else {BATCH_FIELD: batch})
            except StoreError as exc:
                raise store_failure(exc, "copying (rename)", sb, sk) from exc
            opened = self.cache.get(sb, sk)
            if opened is not None and opened.dirty and opened is not ce:
                # opened for writing while it was copied: what it lacks is in the object
                # about to be deleted
                await self.uploads.keep_source(opened, "renaming (fetching what it lacks)")
            try:
                await self.store.delete(sb, sk)
            except StoreError as exc:
                raise store_failure(exc, "deleting (rename; the copy exists)", sb, sk) from exc
            self._discard_written(db, dk, None, dst_vs)  # replaced: the target's local copy is void
        now = self.cache.get(sb, sk)
        if held and ce is now:
            self.written.rekey(ce, db, dk)  # the handles' file follows, its version the copy
            if ce.dirty:  # written while it was copied: based on the copy (the same bytes)
                self.written.rebased(ce, info["etag"], info["size"])
                result["dirty"] = ce
            else:
                self.cache.validated(ce, info["etag"])
        elif now is not None and now.dirty:
            # opened for writing while it was copied: its writes follow the file (based on
            # the version it was opened on; a copy with another ETag is a conflict at upload)
            self.written.rekey(now, db, dk)
            self.written.update_record(now, view=dst_vs.name)
            result["dirty"] = now
        elif now is not None and now.etag == info["etag"]:
            self.written.rekey(now, db, dk)  # the very version copied: still valid
        else:
            self.cache.forget(sb, sk)
            old = self.cache.get(db, dk)
            if old is not None and not old.dirty:
                self.cache.forget(db, dk)
        result["obj"] = {"key": dk, "size": info["size"], "mtime": info["mtime"], "etag": info["etag"]}
        result["tags"] = tags

    async def _keep_for_readers(self, node: File, target: Node | None) -> None:
        """Descriptors reading the file a rename moves (its old key goes) or the one it
        replaces read on (``Reads.keep_for_readers``)."""
        await self.reads.keep_for_readers(node)
        if target is not None and not target.is_dir:
            await self.reads.keep_for_readers(target)

    def _known_version(self, bucket: str, key: str, target: Node | None) -> tuple[str | None, bool]:
        """The version of ``bucket/key`` S3 holds as far as this mount knows, and whether
        there is one: what a dirty local copy of it is based on (None: unknown, asked at
        the upload), else the target node's ETag, else "" (nothing)."""
        replaced = self._dirty_at(bucket, key)
        if replaced is not None and replaced.meta is not None and not replaced.meta.get("conflict"):
            return replaced.meta.get("base"), bool(replaced.meta.get("existing"))
        etag = target.etag if target is not None and not target.is_dir else ""
        return etag, bool(etag)

    def _dirty_at(self, bucket: str, key: str):
        """The dirty entry of ``bucket/key``, if there is one."""
        entry = self.cache.get(bucket, key)
        return entry if entry is not None and entry.dirty else None

    @staticmethod
    def _written(entry) -> bool:
        """Whether ``entry`` is a local copy written through descriptors: dirty, or
        uploaded (an fsync) while descriptors still write to it."""
        return entry is not None and (entry.dirty or entry.writers > 0)

    def _written_at(self, bucket: str, key: str):
        """The entry of ``bucket/key`` written through descriptors, if there is one."""
        entry = self.cache.get(bucket, key)
        return entry if self._written(entry) else None

    def _discard_written(self, bucket: str, key: str, keep, dst_vs: ViewState) -> None:
        """A rename into ``dst_vs`` replaces ``bucket/key``: a local copy there written
        through descriptors (other than ``keep``) is no longer the key's — its descriptors
        keep it to themselves (``Writes._orphaned``), nothing of it is uploaded — and the
        nodes of a dirty one in other views go with it."""
        old = self._written_at(bucket, key)
        if old is None or old is keep:
            return
        dirty = old.dirty
        self.uploads.unschedule(old)
        self.written.orphan(old)
        if dirty:
            self.tree.drop_local(bucket, key, None, skip=dst_vs)

    async def _rename_file(self, node: File, dst: Dir, name: str, target: Node | None) -> None:
        src_vs, dst_vs = node.parent.view, dst.view
        sb, sk = src_vs.bucket, node.key
        dk = key_for(dst, dst_vs, name)
        if (sb, sk) == (dst_vs.bucket, dk):
            if dst_vs.by is not None and dst is not node.parent:
                return  # the same object in another directory of a layout by properties: a retag
            # two views of one bucket showing the same key: the object stays where it is
            raise FsError(errno.EXDEV, f"{sk} is already the object {dst_vs.name}/{name} shows")
        result: dict = {}
        replaced = (target,) if target is not None and not target.is_dir else ()
        # the handler's news of either key (the operation's own copy and DELETE among it)
        # waits for the outcome: applied meanwhile, it would change the files being moved
        with self.tree.moving(node, *replaced), self.tree.leaving(src_vs, sk), \
                self.tree.leaving(dst_vs, dk):
            await self._relocate(node, dst_vs, dk, target, result)
            if node.gone or node.key != sk:
                if result.get("dirty") is None:  # (no local content at dk to win over S3)
                    self.tree.drop_local_pending(dst_vs.bucket, dk)
                return  # changed meanwhile: the next refresh shows what is there
            self.tree.move(node, dst, name)
            self._moved_away(src_vs, sk, result)
        entry = result.get("dirty")
        if entry is not None:
            self.tree.dirtied(dst_vs, node, entry)
            if entry.writers == 0:
                if self.written.eager(entry):
                    self.written.queue(entry)
                else:
                    await self.uploads.upload(entry)  # a tmp file renamed to its final name: uploaded now
            return
        obj = result["obj"]
        self.tree.shown_as(node, etag=obj["etag"], size=obj["size"])
        self.tree.local_put(dst_vs.bucket, dk, obj, result["tags"])

    def _moved_away(self, vs: ViewState, key: str, result: dict) -> None:
        """A file of ``vs`` moved away from ``key``: gone from every view, or, when S3
        never had it, only its local nodes (an object of that key stays shown)."""
        if result.get("local_only"):
            self.tree.drop_local(vs.bucket, key, vs)
        else:
            self.tree.local_delete(vs.bucket, key, also=vs)

    async def _rename_dir(self, d: Dir, dst: Dir, name: str) -> None:
        """Every object below ``d`` is moved (copy + delete, 16 at a time) as one publish
        batch (``publish``): subscribers see the directory's files all at once when the
        manifest is written, after the last of them. On success the directory node moves
        with its subtree; after a partial failure the moved files show at their new place
        (published together), the others stay, and the error is returned."""
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
                    files.append((c, check_key(new_prefix + c.key[len(d.prefix):])))
        record = await self.publisher.begin(vs.bucket, vs.name, dst.prefix,
                                            [(f.key, dk) for f, dk in files]) if files else None
        batch = record["batch"] if record is not None else None
        results: list[tuple[File, str, str, dict]] = []
        errors: list[FsError] = []
        limiter = trio.CapacityLimiter(16)

        async def one(f: File, dk: str):
            r: dict = {}
            sk = f.key
            async with limiter:
                try:
                    await self._relocate(f, vs, dk, None, r, batch)
                except FsError as exc:
                    errors.append(exc)
                    return
            results.append((f, sk, dk, r))
        # opens of these files wait until the tree shows where they went (Tree.moving)
        with self.tree.moving(*(f for f, _dk in files)):
            async with trio.open_nursery() as nursery:
                for f, dk in files:
                    nursery.start_soon(one, f, dk)
            if not errors and not d.gone:
                self.tree.move(d, dst, name)
                for f, sk, dk, r in results:
                    self._moved_away(vs, sk, r)
                    if r.get("dirty") is not None:
                        self.tree.dirtied(vs, f, r["dirty"])
                    else:
                        self.tree.shown_as(f, etag=r["obj"]["etag"], size=r["obj"]["size"])
                        self.tree.local_put(vs.bucket, dk, r["obj"], r["tags"])
            else:
                for f, sk, dk, r in results:
                    self._moved_away(vs, sk, r)
                    if r.get("dirty") is not None:
                        e = r["dirty"]
                        n = self.tree.show_dirty(vs, e, notify=True)
                        if n is None:
                            log.warning("rename: %s moved to %s, not shown here", sk, dk)
                    else:
                        self.tree.local_put(vs.bucket, dk, r["obj"], r["tags"])
        published = [(dk, r["obj"]["etag"]) for _f, _sk, dk, r in results if "obj" in r]

        async def upload(e, dk: str) -> None:
            async with limiter:
                try:
                    if await self.uploads.upload(e) and e.meta is None and batch is not None:
                        published.append((dk, e.etag))
                except FsError as exc:
                    errors.append(exc)
        async with trio.open_nursery() as nursery:
            for f, sk, dk, r in results:
                e = r.get("dirty")
                if e is not None and e.writers == 0:
                    nursery.start_soon(upload, e, dk)
        if record is not None:
            moved = [(sk, dk) for _f, sk, dk, _r in results]
            try:
                await self.publisher.publish(record, moved, published)
            except StoreError as exc:
                errors.append(store_failure(exc, "publishing (writing the manifest)", vs.bucket,
                                            record["manifest"]))
        if errors:
            raise FsError(errors[0].errno, f"renaming {d.prefix} -> {new_prefix}: "
                          f"{len(errors)} of {len(files)} files failed: {errors[0]}", logged=True)
