"""Edits of the directory tree: what the views show, changed without an await.

Tree edits (``_put``, ``_delete``, sweeps) never await, so an operation never sees a
half-applied change; a listing page or a batch of changes is applied in one go. Every
change that the kernel may have cached is sent to the ``notifier`` (invalidate an entry /
an inode); the adapter delivers those from a separate task, never from inside a request
handler.

Read your writes: after each local change the core applies it to every view of the
bucket at once (``_local_put`` / ``_local_delete``) and records it in the view's
``overlay`` (key -> :class:`Pending`). Changes from the handler (listing pages, deltas)
for an overlay key are ignored until they confirm it — a put with the uploaded ETag, a
delete — or until ``overlay_bound`` passes; a dirty file (``local``) always wins.

Layout by properties (``vs.by``): where a file goes depends on the object's property
values, not on its key alone. ``vs.values`` holds each key's values as last known (the
``properties`` the handler's listings and changes carry for such a view, or this mount's
own tags), ``vs.placed`` the directories its file is in now; ``_put`` moves a file whose
values changed to its new directory (same inode). What the write side
needs: ``_implied_tags`` (tags of a file created in a directory), ``_mkdir_property``,
``_retag_into`` (a file moved to another directory).
"""
from __future__ import annotations

import errno
import math
import time

import trio

from ..errors import FsError
from .inodes import ROOT_INODE, Dir, File, Node, dir_value, key_path, layout_values, value_dir
from .views import ViewState

OVERLAY_BOUND = 120.0  # seconds a local change outranks the handler's view of it (at most)


class Pending:
    """One local change of a view not yet confirmed by the handler (the overlay).
    ``local``: a dirty file (its local content wins until uploaded); ``put``: uploaded
    with ``etag`` (retired when a change with that ETag arrives); ``delete``: gone
    (retired when the handler reports the key gone). ``earlier``: the ETags of this
    mount's earlier uploads of the key whose changes have not arrived yet, oldest first —
    the change of an earlier upload of the same content must not retire a later one."""

    __slots__ = ("kind", "etag", "deadline", "earlier")

    def __init__(self, kind: str, etag: str | None, deadline: float, earlier: tuple = ()):
        self.kind = kind
        self.etag = etag
        self.deadline = deadline
        self.earlier = earlier[-EARLIER_KEPT:]

    def unconfirmed(self) -> tuple:
        """The ETags of this mount's uploads still to be confirmed, oldest first."""
        if self.kind == "put":
            return (*self.earlier, self.etag)
        return self.earlier if self.kind == "local" else ()


EARLIER_KEPT = 32  # an older upload forgotten: its change is ignored until the bound anyway


def local_pending(previous: Pending | None) -> Pending:
    """The overlay entry of a file being written (dirty) that was ``previous``."""
    return Pending("local", None, math.inf, previous.unconfirmed() if previous else ())


class Tree:
    """The tree edits of :class:`delvefs.client.fs.core.FileSystem` (never await)."""

    # the kernel's writeback cache is on (set by the FUSE adapter: eager mode); see
    # ``_object_changed``
    writeback_cache = False

    def _known(self, d: Dir) -> bool:
        return d.nlookup > 0 or d.ino == ROOT_INODE

    def _path(self, vs: ViewState, key: str) -> tuple[list[str], str] | None:
        """(directory segments, file name) of ``key`` in ``vs``, None when not shown (in a
        layout by properties: also while the key's values are unknown)."""
        rel = key_path(vs.root, vs.flat, key)
        if rel is None:
            return None
        if vs.by is not None:
            values = vs.values.get(key)
            if values is None:
                return None
            return [self._value_dir(vs, v) for v in values], rel
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
            if obj is None:
                return True
            etag = str(obj.get("etag", ""))
            if etag in p.earlier:  # an earlier upload's (the ones before it are not coming)
                p.earlier = p.earlier[p.earlier.index(etag) + 1:]
                return True
            if etag == p.etag:
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
        moved = None
        if vs.by is not None:
            if not self._layout_known(vs, obj):
                return None
            moved = self._unplace(vs, obj["key"])
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
        if vs.by is not None:
            vs.placed[obj["key"]] = tuple(dirs)
            if moved is not None and existing is None:  # to its new directory, same inode
                moved.parent, moved.gone = parent, False
                parent.children[name] = moved
                parent.changed()
                if notify and self._known(parent):
                    self.notifier.entry(parent.ino, name)
                existing = moved
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
            if not written:
                return self._object_changed(existing, size, mtime_ns, etag)
            existing.size, existing.mtime_ns, existing.etag = size, mtime_ns, etag
            self._served.pop(existing.ino, None)  # the next open drops the kernel's pages
        return existing

    def _object_changed(self, node: File, size: int, mtime_ns: int, etag: str) -> File:
        """``node``'s object is another version now (not one the kernel wrote through it):
        the kernel must drop what it cached. With the writeback cache the kernel keeps the
        size and mtime of an inode it holds whatever the mount answers, so a held file of
        another size gets a new inode in its place (as if replaced by a rename: open
        descriptors keep the old one; the kernel's name for it is dropped, asynchronously)
        — unless a handle writes to it (its writes must land in its file). The same size
        (a copy, a rewrite): the same inode, its pages dropped; only its mtime stays the
        kernel's. Returns the file now in the tree."""
        if self.writeback_cache and size != node.size and node.nlookup and not node.gone \
                and not any(h.writer and h.node is node for h in self.files.values()):
            parent, name = node.parent, node.name
            self.table.detach(node)  # stays in the table until the kernel forgets it
            self._served.pop(node.ino, None)
            f = self.table.new_file(parent, name, size, mtime_ns, etag)
            self.notifier.entry(parent.ino, name)
            return f
        node.size, node.mtime_ns, node.etag = size, mtime_ns, etag
        self._served.pop(node.ino, None)  # the next open drops the kernel's pages
        if node.nlookup:
            self.notifier.inode(node.ino)
        return node

    # ------------------------------------------------------- layout by properties

    def _value_dir(self, vs: ViewState, value: str | None) -> str:
        name = value_dir(value)
        if "%~" in name:  # a cut long value (never in an escaped one): remember what it stands for
            vs.long_names[name] = value
        return name

    def _layout_known(self, vs: ViewState, obj: dict) -> bool:
        """Whether ``obj``'s place in ``vs`` (a layout by properties) is known: from its
        ``properties`` (the handler's listings and changes of such a view carry them, as do
        this mount's own changes), else from before."""
        key = obj["key"]
        props = obj.get("properties")
        if props is not None:
            vs.values[key] = layout_values(vs.by, props)
            return True
        return key in vs.values

    def _unplace(self, vs: ViewState, key: str) -> File | None:
        """The file of ``key``, taken out of its directory when its values now belong in
        another one (the caller puts it there: it keeps its inode)."""
        dirs = vs.placed.get(key)
        values = vs.values.get(key)
        if dirs is None or values is None or list(dirs) == [self._value_dir(vs, v) for v in values]:
            return None
        node = self._find(vs, key)
        del vs.placed[key]
        if node is None or node.is_dir:
            return None
        parent = node.parent
        del parent.children[node.name]
        parent.changed()
        if self._known(parent):
            self.notifier.entry(parent.ino, node.name)
        self._served.pop(node.ino, None)
        self._prune(parent)
        return node

    def _dir_values(self, d: Dir) -> list[str | None] | None:
        """The property values the directories from a layout-by view's top down to ``d``
        stand for (None when ``d`` is not in such a view)."""
        vs = d.view
        if vs is None or vs.by is None:
            return None
        names = []
        while d is not vs.top:
            names.append(d.name)
            d = d.parent
        return [dir_value(n, vs.long_names) for n in reversed(names)]

    def _layout_dir_tags(self, d: Dir) -> dict | None:
        """What a file in ``d``, a directory of a layout by properties, has as tags:
        ``{"values", "tags", "untag"}`` (``_unset``: the tag removed); None in other layouts.
        EPERM above the last level."""
        values = self._dir_values(d)
        if values is None:
            return None
        vs = d.view
        if len(values) != len(vs.by):
            raise FsError(errno.EPERM, f"view {vs.name}: files live {len(vs.by)} directory levels "
                          f"down, one per property ({', '.join(vs.layout_by)})")
        return {"values": tuple(values),
                "tags": {name: v for name, v in zip(vs.layout_by, values) if v is not None},
                "untag": sorted(name for name, v in zip(vs.layout_by, values) if v is None)}

    async def _retag_into(self, node: File, d: Dir, implied: dict) -> None:
        """A file moved (renamed) into ``d`` of a layout by properties takes its values as
        tags (an object's tags: PutObjectTagging; a dirty file's: at its upload)."""
        vs = d.view
        if node.gone or node.parent.view is not vs:
            return
        key = node.key
        if vs.values.get(key) == implied["values"]:
            return
        tags, _ = await self._properties(node)
        untag = tuple(t for t in tags if t.lower() in implied["untag"])
        if node.parent is not d:
            self._keep_dir(node.parent)  # as after any rename out of it: stays until rmdir
        await self._retag(node, implied["tags"], untag)
        if not node.gone and vs.values.get(key) != implied["values"]:
            # a dirty file (tagged at its upload), or a value that is user metadata
            vs.values[key] = implied["values"]
            self._put(vs, {"key": key, "size": node.size, "mtime": node.mtime_ns / 1e9,
                           "etag": node.etag}, notify=True, remote=False, written=True)

    def _implied_tags(self, parent: Dir, key: str) -> dict | None:
        """A file created in ``parent``, a directory of a layout by properties, gets its
        directories' values as tags: ``{"tags", "untag"}`` for its dirty record; None in
        other layouts. EPERM above the last level; EEXIST when the key is in another one."""
        implied = self._layout_dir_tags(parent)
        if implied is None:
            return None
        vs = parent.view
        values = implied.pop("values")
        where = vs.placed.get(key)
        if where is not None and list(where) != [self._value_dir(vs, v) for v in values]:
            raise FsError(errno.EEXIST, f"{key} is in {vs.name}/{'/'.join(where)} (a name is one "
                          "object in every directory of a layout by properties)")
        vs.values[key] = values
        return implied

    def _mkdir_property(self, parent: Dir, name: str) -> Dir:
        """mkdir in a layout by properties: a directory for a property value (EINVAL for a
        name no value has; EPERM below the last level). It exists in this mount only until a
        file lands in it, like any mkdir'ed directory."""
        vs = parent.view
        depth = len(self._dir_values(parent))
        if depth >= len(vs.by):
            raise FsError(errno.EPERM, f"view {vs.name}: {len(vs.by)} directory levels, one per "
                          f"property ({', '.join(vs.layout_by)}); files below the last")
        try:
            dir_value(name, vs.long_names)
        except ValueError as exc:
            raise FsError(errno.EINVAL, str(exc)) from None
        if name in parent.children:
            raise FsError(errno.EEXIST)
        d = self.table.new_dir(parent, name, vs, parent.prefix, time.time_ns())
        self.local_dirs.add(d.ino)
        self.table.ref(d)
        return d

    def _delete(self, vs: ViewState, key: str, *, remote: bool = True, notify: bool = True) -> None:
        if remote and vs.overlay and self._stale(vs, key, None):
            return
        if vs.by is not None:
            node = self._find(vs, key)
            vs.values.pop(key, None)
            vs.placed.pop(key, None)
            if node is not None and not node.is_dir:
                self._remove(node, notify)
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
        vs = parent.view
        if vs is not None and vs.by is not None:
            key = node.key
            if vs.placed.get(key) is not None and self._find(vs, key) is node:
                del vs.placed[key]
                vs.values.pop(key, None)
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
        if vs.by is not None:
            for known in (vs.values, vs.placed):
                for key in [k for k in known if k not in seen]:
                    del known[key]

    def _find(self, vs: ViewState, key: str) -> Node | None:
        if vs.by is not None:  # where its file is (its values may have changed meanwhile)
            dirs = vs.placed.get(key)
            rel = key_path(vs.root, True, key)
            path = None if dirs is None or rel is None else (dirs, rel)
        else:
            path = self._path(vs, key)
        if path is None:
            return None
        d = vs.top
        for seg in path[0]:
            d = d.children.get(seg)
            if d is None or not d.is_dir:
                return None
        return d.children.get(path[1]) if path[1] else d

    def _local_put(self, bucket: str, key: str, obj: dict, tags: dict, *,
                   keep_local: bool = False, quiet: ViewState | None = None) -> None:
        """Show an object this mount just wrote/copied/retagged in every view of ``bucket``
        it matches (and remove it from those it no longer matches), at once."""
        now = trio.current_time()
        deadline = now + self.overlay_bound
        for vs in self.views:
            if vs.bucket != bucket:
                continue
            p = vs.overlay.get(key)
            if keep_local and p is not None and p.kind == "local":
                if p.earlier[-1:] != (obj["etag"],):
                    p.earlier = (*p.earlier, obj["etag"])[-EARLIER_KEPT:]
                continue
            if self.can_match(vs, key, obj["size"], tags):
                earlier = p.unconfirmed() if p is not None and p.deadline > now else ()
                if earlier[-1:] == (obj["etag"],):  # the same version again (a retag): one change
                    earlier = earlier[:-1]
                vs.overlay[key] = Pending("put", obj["etag"], deadline, earlier)
                if vs.by is not None:  # placed by the tags it has now (metadata: as listed)
                    obj = {**obj, "properties": {**(obj.get("metadata") or {}), **tags}}
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
