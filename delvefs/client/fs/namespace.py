"""Names: unlink, mkdir, rmdir, rename, and which key a name in a view has.

unlink = DeleteObject; rename = server-side copy + delete (a dirty file is only re-keyed;
a directory moves object by object, not atomically). A directory made by mkdir exists in
this mount only (``local_dirs``) until an object lies below it; a directory whose last
entry goes away through this mount stays, as if mkdir'ed, until rmdir.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import math
import time

import trio

from ..errors import FsError, StoreError, read_only, refused, store_failure
from .inodes import Dir, File, Node, flat_key, flat_name, valid_segment
from .tree import Pending
from .views import ViewState

log = logging.getLogger(__name__)


class Namespace:
    """The name operations of :class:`delvefs.client.fs.core.FileSystem`."""

    def _writable_dir(self, ino: int) -> tuple[Dir, ViewState]:
        d = self._node(ino)
        if not d.is_dir:
            raise FsError(errno.ENOTDIR)
        vs = d.view
        if vs is None:
            raise FsError(errno.EACCES, "the mount's root holds the views only")
        if not vs.writable:
            raise read_only(vs.name)
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

    def refuse(self, what: str) -> None:
        raise refused(what)

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
            if entry is not None and entry.dirty and entry.opens:  # still read through a handle
                await self._keep_source(entry, "removing (fetching what it lacks)")
            if not local_only:
                if self.eager:  # sent in a DeleteObjects batch (run_deletes)
                    self._queue_delete(bucket, key)
                else:
                    try:
                        await self.store.delete(bucket, key)
                    except StoreError as exc:
                        raise store_failure(exc, "deleting", bucket, key) from exc
            entry = self.cache.get(bucket, key)
            if entry is not None:
                self._unschedule(entry)
                self.dirty.discard(entry)
            vs.overlay.pop(key, None)
            self._keep_dir(node.parent)
            if local_only:
                self._drop_local(bucket, key, vs)
            else:
                self._local_delete(bucket, key, also=vs, quiet=True)
                self._unshadow(bucket, key)
            if not node.gone:  # not shown by the view's rules (scratch): remove it here
                self._remove(node, notify=False)

    def _unshadow(self, bucket: str, key: str) -> None:
        """The object ``key`` is gone: a directory of its name in any view no longer hides
        it (it must not show again when the directory goes)."""
        for vs in self.views:
            if vs.bucket == bucket and vs.by is None:
                d = self._find(vs, key)
                if d is not None and d.is_dir and d.shadow is not None and d.shadow.key == key:
                    d.shadow = None

    def _drop_local(self, bucket: str, key: str, also: ViewState) -> None:
        """A file S3 never had is gone: its local nodes go, and nothing else — an object of
        that key (another writer's) stays shown wherever it is."""
        for vs in self.views:
            if vs.bucket != bucket:
                continue
            p = vs.overlay.get(key)
            if p is not None and p.kind == "local":
                del vs.overlay[key]
            node = self._find(vs, key)
            if node is not None and not node.is_dir and not node.etag:
                self._delete(vs, key, remote=False, notify=vs is not also)

    async def mkdir(self, parent_ino: int, name: str) -> Dir:
        parent, vs = self._writable_dir(parent_ino)
        if vs.by is not None:  # layout by properties: a directory for a property value (tree.py)
            await self._fresh(vs)
            return self._mkdir_property(parent, name)
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
        if d.ino not in self.local_dirs and vs.by is None:  # an empty virtual directory: a folder marker
            if self.eager:
                self._queue_delete(vs.bucket, d.prefix)
            else:
                try:
                    await self.store.delete(vs.bucket, d.prefix)
                except StoreError as exc:
                    raise store_failure(exc, "deleting folder marker", vs.bucket, d.prefix) from exc
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
        shadow = node.shadow if node.is_dir else None  # a file it hid stays where it is
        if old.children.get(node.name) is node:
            del old.children[node.name]
            old.changed()
            if shadow is not None:
                node.shadow = None
                shadow.gone = False
                old.children[node.name] = shadow
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
            retag = self._layout_dir_tags(dst_parent)  # layout by properties: its directories' values
            if retag is not None and dst_vs is src_vs:  # retagged first: it moves there, same name
                await self._retag_into(node, dst_parent, retag)
                if node.parent is dst_parent and node.name == new_name:
                    return
            await self._rename_file(node, dst_parent, new_name, target)
            if retag is not None:
                await self._retag_into(node, dst_parent, retag)

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
                    await self._keep_source(entry, "renaming (fetching what it lacks)")
                    if entry.meta.get("existing") or node.etag:
                        try:
                            await self.store.delete(sb, sk)
                        except StoreError as exc:
                            raise store_failure(exc, "deleting (rename)", sb, sk) from exc
                    self._unschedule(entry)
                    self._discard_dirty(db, dk, entry, dst_vs)
                    self.dirty.rekey(entry, db, dk)
                    # based on what it replaces now: the target's version, or nothing; a
                    # conflict copy renamed is an ordinary file again
                    base = target.etag if target is not None and not target.is_dir else ""
                    self.dirty.update_record(entry, view=dst_vs.name, base=base, conflict=None)
                    node.etag = ""
                    result["dirty"] = entry
                    return
        tags = {}
        if self._needs_tags(db) or self._needs_tags(sb):
            tags = await self._object_tags(sb, sk, "renaming")
        if not self.can_match(dst_vs, dk, node.size, tags):
            raise FsError(errno.EXDEV, f"{dk} cannot be in view {dst_vs.name} (mv copies, then "
                          "removes: the copy is a scratch file of this mount)")
        replaced = self.cache.get(db, dk)
        if replaced is not None and replaced.dirty and replaced.opens:  # read through a handle
            await self._keep_source(replaced, "replacing (fetching what it lacks)")
        try:
            await self._settle_delete(db, dk)  # eager: a queued DELETE of dk must go first
            info = await self.store.copy(db, dk, sb, sk)
        except StoreError as exc:
            raise store_failure(exc, "copying (rename)", sb, sk) from exc
        try:
            await self.store.delete(sb, sk)
        except StoreError as exc:
            raise store_failure(exc, "deleting (rename; the copy exists)", sb, sk) from exc
        self._discard_dirty(db, dk, None, dst_vs)  # replaced: a local copy of the target is void
        ce = self.cache.get(sb, sk)
        if ce is not None and not ce.dirty and ce.etag == info["etag"]:
            self.dirty.rekey(ce, db, dk)  # the very version copied: still valid
        else:
            self.cache.forget(sb, sk)
            old = self.cache.get(db, dk)
            if old is not None and not old.dirty:
                self.cache.forget(db, dk)
        result["obj"] = {"key": dk, "size": info["size"], "mtime": info["mtime"], "etag": info["etag"]}
        result["tags"] = tags

    def _discard_dirty(self, bucket: str, key: str, keep, dst_vs: ViewState) -> None:
        """A rename into ``dst_vs`` replaces ``bucket/key``: a dirty local copy there (other
        than ``keep``) is no longer wanted, and its nodes in other views go with it."""
        old = self.cache.get(bucket, key)
        if old is None or old is keep or not old.dirty:
            return
        self._unschedule(old)
        self.dirty.discard(old)
        for vs in self.views:
            if vs.bucket == bucket:
                p = vs.overlay.get(key)
                if p is not None and p.kind == "local":
                    del vs.overlay[key]
                node = self._find(vs, key) if vs is not dst_vs else None
                if node is not None and not node.is_dir and not node.etag:
                    self._delete(vs, key, remote=False)

    async def _rename_file(self, node: File, dst: Dir, name: str, target: Node | None) -> None:
        src_vs, dst_vs = node.parent.view, dst.view
        sb, sk = src_vs.bucket, node.key
        dk = self._key_for(dst, dst_vs, name)
        if (sb, sk) == (dst_vs.bucket, dk):
            if dst_vs.by is not None and dst is not node.parent:
                return  # the same object in another directory of a layout by properties: a retag
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
                if self.eager:
                    self._schedule(entry)
                else:
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
