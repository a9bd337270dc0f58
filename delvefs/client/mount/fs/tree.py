"""The tree: what the views show, changed without an await (:class:`Tree`).

The tree part owns the inode table's shape, the views' overlays and layout maps, the
directories made by mkdir that no object lies below yet (``local_dirs``) and which ETag's
pages the kernel may keep for an inode (``served``). Other parts change the tree through
its methods only.

Tree edits (``put``, ``delete``, sweeps) never await, so an operation never sees a
half-applied change; a listing page or a batch of changes is applied in one go. Every
change that the kernel may have cached is sent to the ``notifier`` (invalidate an entry /
an inode); the adapter delivers those from a separate task, never from inside a request
handler.

Read your writes: after each local change the core applies it to every view of the
bucket at once (``local_put`` / ``local_delete``) and records it in the view's
``overlay`` (key -> :class:`Pending`). Changes from the handler (listing pages, deltas)
for an overlay key are ignored until they confirm it — a put with the uploaded ETag, a
delete reported after every upload of the key this mount made before its removal (the
handler reports a key's states in order, a removal without a time: an older removal's news
must not retire a newer one, or the upload between them would show the name again) — or
until ``overlay_bound`` passes; a dirty file (``local``) always wins.

Where files go in a view laid out by property values: ``delvefs.client.mount.fs.layout``.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import time

import trio

from .catalog import EARLIER_KEPT, Pending, ViewCatalog, ViewState, local_pending
from .handles import Handles
from .inodes import ROOT_INODE, Dir, File, InodeTable, Node, is_cut, key_path, unshowable
from .layout import PropertyLayout

log = logging.getLogger(__name__)

# how many of the files this mount removed are remembered as such (inode numbers are never
# reused; the kernel's requests for one come within moments of its removal)
REMOVED_HERE_KEPT = 4096

# keys not shown that are logged per view (each once); the rest are counted only
UNSHOWN_LOGGED = 1000


class Tree:
    """The directory tree of the views (never awaits); where files go in a layout by
    properties, ``layout`` says."""

    def __init__(self, table: InodeTable, catalog: ViewCatalog, handles: Handles,
                 layout: PropertyLayout, cache, notifier, settings):
        self.table = table
        self.layout = layout
        self.catalog = catalog
        self.handles = handles
        self.cache = cache
        self.notifier = notifier
        self.overlay_bound = settings.overlay_bound
        # the kernel's writeback cache is on (eager mode); see ``object_changed``
        self.writeback_cache = settings.writeback_cache
        self.local_dirs: set[int] = set()  # inos of mkdir'ed dirs no object lies below yet
        self._served: dict[int, str] = {}  # ino -> ETag whose bytes the kernel may cache
        # files this mount is moving or removing: ino -> [operations, Event set at the end]
        self._moving: dict[int, list] = {}
        # inos of the files such an operation removed (or replaced), the newest first
        self._removed_here: collections.OrderedDict[int, None] = collections.OrderedDict()
        now_ns = time.time_ns()
        for vs in catalog:
            vs.top = table.new_dir(table.root, vs.name, vs, vs.root, now_ns)

    # ------------------------------------------------------------ the kernel's pages

    def serves(self, ino: int, etag: str) -> bool:
        """Whether the kernel may keep the pages it cached of ``ino`` (an open)."""
        return self._served.get(ino) == etag

    def served(self, ino: int, etag: str) -> None:
        self._served[ino] = etag

    def unserve(self, ino: int) -> None:
        self._served.pop(ino, None)

    def version_gone(self, node: File, etag: str) -> None:
        """S3 no longer has version ``etag`` of ``node``: the pages the kernel keeps of it
        must not be served to the next open."""
        if self._served.get(node.ino) == etag:
            del self._served[node.ino]
            if node.nlookup:
                self.notifier.inode(node.ino)

    def _known(self, d: Dir) -> bool:
        return d.nlookup > 0 or d.ino == ROOT_INODE

    # ------------------------------------------------------------ paths and overlay

    def _path(self, vs: ViewState, key: str) -> tuple[list[str], str] | None:
        """(directory segments, file name) of ``key`` in ``vs``, None when not shown (in a
        layout by properties: also while the key's values are unknown)."""
        rel = key_path(vs.root, vs.flat, key)
        if rel is None:
            return None
        if vs.flat and is_cut(rel):  # a cut long name: remember the key it stands for
            vs.remember_cut(rel, key[len(vs.root):])
        if vs.by is not None:
            dirs = self.layout.dirs_of(vs, key)
            return None if dirs is None else (dirs, rel)
        if vs.flat:
            return [], rel
        parts = rel.split("/")
        name = parts.pop()
        return parts, name

    def _unshown(self, vs: ViewState, key: str) -> None:
        """``key``, put in ``vs``, got no name there: when it has none by the rules
        (``unshowable``; in a layout by properties also a value with a NUL byte) it is
        counted in ``vs.unshown`` (``delvefs status``) and logged, once per key."""
        if key in vs.unshown or not key.startswith(vs.root):
            return
        reason = unshowable(key[len(vs.root):], vs.flat)
        if reason is None and vs.by is not None:
            reason = self.layout.unshowable(vs, key)
        if reason is None:  # outside the root, a folder marker, values not known yet
            return
        vs.unshown[key] = reason
        if len(vs.unshown) <= UNSHOWN_LOGGED:
            log.warning("view %s: key %r not shown: %s", vs.name, key, reason)
            if len(vs.unshown) == UNSHOWN_LOGGED:
                log.warning("view %s: %d keys not shown; further ones are counted by `delvefs "
                            "status` but not logged", vs.name, UNSHOWN_LOGGED)

    def _stale(self, vs: ViewState, key: str, obj: dict | None) -> bool:
        """True when the handler's change (``obj`` for a put, None for a delete) of ``key``
        must not undo a local change in the overlay; retires the overlay entry when the
        change confirms it (same ETag / gone: once the news of this mount's uploads before
        the removal has come) or when it is older than the bound."""
        p = vs.overlay.get(key)
        if p is None:
            return False
        etag = None if obj is None else str(obj.get("etag", ""))
        if p.kind in ("local", "leaving"):
            if etag is not None:
                p.reported(etag)  # (an earlier upload's: the local content still wins)
            return True
        if p.deadline <= trio.current_time():
            del vs.overlay[key]
            return False
        if p.kind == "put":
            if obj is None:
                return True
            if etag == p.etag and etag in p.earlier:
                # the same bytes were uploaded before too: the time tells which upload it is
                if not self._newer(obj, p):
                    p.reported(etag)
                    return True
            elif p.reported(etag):  # an earlier upload's (the ones before it are not coming)
                return True
            if etag != p.etag and not self._newer(obj, p):
                return True  # a version from before this mount's change: not news
            if p.retag and etag == p.etag and self.layout.placed_elsewhere(vs, obj):
                return True  # that version with its tags before this mount's retag
        elif obj is None:
            if p.earlier:
                return True  # an older removal: the news of an upload before this one is to come
        elif p.reported(etag) or not self._newer(obj, p):
            return True  # the object this mount deleted (or one before it)
        del vs.overlay[key]  # confirmed, or replaced by another writer since
        return False

    @staticmethod
    def _newer(obj: dict, p: Pending) -> bool:
        """Whether ``obj`` was written after this mount's change ``p`` was made."""
        return float(obj.get("mtime") or 0) > p.since

    @contextlib.contextmanager
    def leaving(self, vs: ViewState, key: str):
        """Around this mount's delete or move of ``key`` of ``vs``: no change the handler
        reports of the key applies meanwhile (the confirmation of the operation's own
        DELETE would take the node from under it, and an emptied directory with it); the
        operation's outcome replaces the mark, a failure restores what was there."""
        before = vs.overlay.get(key)
        if before is not None and before.kind == "local":  # stale-proof already
            yield
            return
        # the uploads of the key still to be reported stay known: the outcome (a delete)
        # must not take an older removal's news for its own
        earlier = before.unconfirmed() if before is not None and before.deadline > trio.current_time() else ()
        mark = vs.overlay[key] = Pending("leaving", None, math.inf, earlier)
        try:
            yield
        finally:
            if vs.overlay.get(key) is mark:
                if before is None:
                    del vs.overlay[key]
                else:
                    vs.overlay[key] = before

    @contextlib.contextmanager
    def moving(self, *nodes: File):
        """Around this mount's move (rename) or removal of ``nodes``, until the tree shows
        its outcome: an open of one of them waits for it (``move_of``), as the bytes it
        lacks would come from the key it opened, which the operation deletes (the
        operation fetched them for the descriptors open when it began)."""
        for n in nodes:
            m = self._moving.get(n.ino)
            if m is None:
                self._moving[n.ino] = [1, trio.Event()]
            else:
                m[0] += 1
        try:
            yield
        finally:
            for n in nodes:
                m = self._moving[n.ino]
                m[0] -= 1
                if m[0] == 0:
                    del self._moving[n.ino]
                    m[1].set()
                if n.gone:
                    self._removed_here[n.ino] = None
                    if len(self._removed_here) > REMOVED_HERE_KEPT:
                        self._removed_here.popitem(last=False)

    def move_of(self, node: File) -> trio.Event | None:
        """The end of a move or removal of ``node`` under way (``moving``), if one is."""
        m = self._moving.get(node.ino)
        return None if m is None else m[1]

    def removed_here(self, node: File) -> bool:
        """Whether ``node`` left the tree by this mount's unlink or rename (not by a change
        seen in S3): a request the kernel sends for it after that, from a lookup made
        before, may take effect before the removal (see ``Writes``)."""
        return node.gone and node.ino in self._removed_here

    def drop_local_pending(self, bucket: str, key: str) -> None:
        """No view of ``bucket`` shows local content at ``key`` any more."""
        for vs in self.catalog.of_bucket(bucket):
            p = vs.overlay.get(key)
            if p is not None and p.kind == "local":
                del vs.overlay[key]

    def pending_keys(self, vs: ViewState) -> set[str]:
        """Keys this mount put in ``vs`` that the handler has not confirmed yet."""
        now = trio.current_time()
        return {k for k, p in vs.overlay.items() if p.kind != "delete" and p.deadline > now}

    # ------------------------------------------------------------ showing objects

    def put(self, vs: ViewState, obj: dict, *, notify: bool, remote: bool = True,
            written: bool = False) -> File | None:
        """Show ``obj`` in ``vs`` (``notify``: tell the kernel of a new name; ``written``: the
        kernel holds this very content, written through the file: no inode invalidation)."""
        if remote and vs.overlay and self._stale(vs, obj["key"], obj):
            return None
        moved = None
        if vs.by is not None:
            if not self.layout.known(vs, obj):
                return None
            moved = self._take_out_moved(vs, obj["key"])
        path = self._path(vs, obj["key"])
        if path is None:
            if moved is not None:  # its new values have no directory name: gone here
                self.table.detach(moved)
                self.cache.forget(vs.bucket, obj["key"])
            self._unshown(vs, obj["key"])
            return None
        if vs.unshown:  # shown now (a layout by properties: its values changed)
            vs.unshown.pop(obj["key"], None)
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
            self.layout.placed(vs, obj["key"], dirs)
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
                return self.object_changed(existing, size, mtime_ns, etag)
            existing.size, existing.mtime_ns, existing.etag = size, mtime_ns, etag
            self._served.pop(existing.ino, None)  # the next open drops the kernel's pages
        return existing

    def show_dirty(self, vs: ViewState, entry, *, notify: bool) -> File | None:
        """Show a dirty file (recovered, a conflict copy, moved into a changed view) in
        ``vs``: its local content wins over the handler's view of the key."""
        node = self.put(vs, {"key": entry.key, "size": entry.size, "mtime": time.time(),
                             "etag": ""}, notify=notify, remote=False)
        if node is not None and not node.is_dir:
            vs.overlay[entry.key] = Pending("local", None, math.inf)
        return node

    def object_changed(self, node: File, size: int, mtime_ns: int, etag: str, *,
                       reader=None) -> File:
        """``node``'s object is another version now (not one the kernel wrote through it):
        the kernel must drop what it cached. A file with descriptors open for reading gets a
        new inode in its place (as if replaced by a rename): the kernel's page cache is the
        inode's, so pages the new version's readers bring in would otherwise be read
        through the old descriptors, which keep their version. With the writeback cache the
        kernel keeps the size and mtime of an inode it holds whatever the mount answers, so
        a held file of another size gets a new inode too. Never while a handle writes to it
        (its writes must land in its file). Otherwise (the same size, or no writeback
        cache): the same inode, its pages dropped. The kernel's name for a replaced inode
        is dropped, asynchronously (``reader``: the handle that found the new version, which
        reads it). Returns the file now in the tree. A file already out of the tree (its
        name moved to another inode while the caller waited for S3) is left as it is and
        returned: its inode is the old version's, for the descriptors that read it."""
        if node.gone:
            return node
        if node.nlookup and not self.handles.writing(node) and (
                self.handles.reading(node, besides=reader) or self.writeback_cache and size != node.size):
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

    def dirtied(self, vs: ViewState, node: File, entry) -> None:
        """``node`` of ``vs`` is written through its dirty ``entry`` now."""
        vs.overlay[entry.key] = local_pending(vs.overlay.get(entry.key))
        self._served.pop(node.ino, None)
        node.size = entry.size
        node.mtime_ns = time.time_ns()
        self.sizes(entry)

    def shown_as(self, node: File, *, size: int | None = None, etag: str | None = None,
                 mtime_ns: int | None = None) -> None:
        """What ``node`` shows from now on (a write, a truncate, an upload or copy this mount
        made; ``None``: unchanged)."""
        if size is not None:
            node.size = size
        if etag is not None:
            node.etag = etag
        if mtime_ns is not None:
            node.mtime_ns = mtime_ns

    def sizes(self, entry) -> None:
        """The entry's size on the nodes of its key in every view that shows the local
        content (a file opened through several views)."""
        now = time.time_ns()
        for vs in self.catalog.of_bucket(entry.bucket):
            p = vs.overlay.get(entry.key)
            if p is not None and p.kind == "local":
                node = self.find(vs, entry.key)
                if node is not None and not node.is_dir:
                    node.size, node.mtime_ns = entry.size, now

    def _take_out_moved(self, vs: ViewState, key: str) -> File | None:
        """The file of ``key``, taken out of its directory when its values now belong in
        another one (a layout by properties; the caller puts it there: it keeps its inode)."""
        if not self.layout.moving(vs, key):
            return None
        node = self.find(vs, key)
        self.layout.unplace(vs, key)
        if node is None or node.is_dir:
            return None
        parent = node.parent
        del parent.children[node.name]
        parent.changed()
        if self._known(parent):
            self.notifier.entry(parent.ino, node.name)
        self._served.pop(node.ino, None)
        self.prune(parent)
        return node

    def place(self, node: File, values: tuple) -> None:
        """A file of a layout by properties goes where ``values`` say (a dirty file retagged:
        tagged at its upload; a value that is user metadata)."""
        vs = node.parent.view
        if not node.gone and self.layout.set_values(vs, node.key, values):
            self.put(vs, {"key": node.key, "size": node.size, "mtime": node.mtime_ns / 1e9,
                          "etag": node.etag}, notify=True, remote=False, written=True)

    # ------------------------------------------------------------ removing

    def delete(self, vs: ViewState, key: str, *, remote: bool = True, notify: bool = True) -> None:
        if remote and vs.overlay and self._stale(vs, key, None):
            return
        if vs.unshown:
            vs.unshown.pop(key, None)
        if vs.by is not None:
            node = self.find(vs, key)
            self.layout.forget(vs, key)
            if node is not None and not node.is_dir:
                self.remove(node, notify)
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
        self.remove(node, notify)

    def remove(self, node: File, notify: bool = True) -> None:
        parent = node.parent
        vs = parent.view
        if vs is not None and vs.by is not None:
            key = node.key
            if self.layout.placed_at(vs, key) is not None and self.find(vs, key) is node:
                self.layout.forget(vs, key)
        self.table.detach(node)
        if notify and self._known(parent):
            self.notifier.entry(parent.ino, node.name)
        self.cache.forget(parent.view.bucket, node.key)
        self.prune(parent)

    def prune(self, d: Dir) -> None:
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

    def sweep(self, vs: ViewState, seen: set[str]) -> None:
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
                self.remove(f)
        for key in [k for k in vs.unshown if k not in seen]:
            del vs.unshown[key]
        if vs.by is not None:
            self.layout.sweep(vs, seen)

    def find(self, vs: ViewState, key: str) -> Node | None:
        if vs.by is not None:  # where its file is (its values may have changed meanwhile)
            dirs = self.layout.placed_at(vs, key)
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

    # ------------------------------------------------------------ this mount's changes

    def local_put(self, bucket: str, key: str, obj: dict, tags: dict, *,
                  keep_local: bool = False, quiet: ViewState | None = None,
                  since: float | None = None, retag: bool = False) -> None:
        """Show an object this mount just wrote/copied/retagged (``retag``: the same
        version, other tags) in every view of ``bucket`` it matches (and remove it from
        those it no longer matches), at once (``since``: the wall-clock time its request
        started; default now)."""
        now = trio.current_time()
        deadline = now + self.overlay_bound
        since = time.time() if since is None else since
        for vs in self.catalog.of_bucket(bucket):
            p = vs.overlay.get(key)
            if keep_local and p is not None and p.kind == "local":
                if p.earlier[-1:] != (obj["etag"],):
                    p.earlier = (*p.earlier, obj["etag"])[-EARLIER_KEPT:]
                continue
            earlier = p.unconfirmed() if p is not None and p.deadline > now else ()
            if self.catalog.can_match(vs, key, obj["size"], tags):
                # the same version again (a retag): one change. (An upload of the same bytes
                # is a change of its own: the handler reports both.)
                if retag and earlier[-1:] == (obj["etag"],):
                    earlier = earlier[:-1]
                vs.overlay[key] = Pending("put", obj["etag"], deadline, earlier, since, retag=retag)
                if vs.by is not None:  # placed by the tags it has now (metadata: as listed)
                    obj = {**obj, "properties": {**(obj.get("metadata") or {}), **tags}}
                # ``quiet``: the view written through; the kernel knows that file already
                self.put(vs, obj, notify=vs is not quiet, remote=False, written=vs is quiet)
            else:
                present = self.find(vs, key) is not None
                vs.overlay.pop(key, None)
                self.delete(vs, key, remote=False)
                if present or p is not None:
                    vs.overlay[key] = Pending("delete", None, deadline, earlier, since=since)

    def local_delete(self, bucket: str, key: str, also: ViewState | None = None,
                     quiet: bool = False) -> None:
        """This mount deleted (or moved away) ``key``: gone from every view at once
        (``quiet``: the kernel removed the entry of ``also`` itself)."""
        now = trio.current_time()
        deadline = now + self.overlay_bound
        since = time.time()
        for vs in self.catalog.of_bucket(bucket):
            p = vs.overlay.pop(key, None)
            node = self.find(vs, key)
            if node is not None and not node.is_dir:
                self.delete(vs, key, remote=False, notify=not (quiet and vs is also))
            if node is not None or p is not None or vs is also:
                # this mount's uploads of the key not reported yet: the news of a removal
                # before them is not this one's (``_stale``)
                earlier = p.unconfirmed() if p is not None and p.deadline > now else ()
                vs.overlay[key] = Pending("delete", None, deadline, earlier, since=since)

    def drop_local(self, bucket: str, key: str, also: ViewState | None, *,
                   skip: ViewState | None = None) -> None:
        """A file S3 never had is gone: its local nodes go, and nothing else — an object of
        that key (another writer's) stays shown wherever it is (``also``: the kernel
        removed that view's entry itself; ``skip``: that view's node and overlay entry stay,
        a rename's destination: its outcome takes the entry's place at once, and with it
        the uploads of the key whose news is still to come)."""
        now = trio.current_time()
        for vs in self.catalog.of_bucket(bucket):
            p = vs.overlay.get(key)
            if p is not None and p.kind == "local" and vs is not skip:
                if p.before is not None and p.before.deadline > now:
                    vs.overlay[key] = p.before  # this mount's delete of the key before it holds
                else:
                    del vs.overlay[key]
            node = self.find(vs, key) if vs is not skip else None
            if node is not None and not node.is_dir and not node.etag:
                self.delete(vs, key, remote=False, notify=vs is not also)

    def unshadow(self, bucket: str, key: str) -> None:
        """The object ``key`` is gone: a directory of its name in any view no longer hides
        it (it must not show again when the directory goes)."""
        for vs in self.catalog.of_bucket(bucket):
            if vs.by is None:
                d = self.find(vs, key)
                if d is not None and d.is_dir and d.shadow is not None and d.shadow.key == key:
                    d.shadow = None

    # ------------------------------------------------------------ directories

    def mkdir_local(self, parent: Dir, name: str, prefix: str) -> Dir:
        """A directory made by mkdir: in this mount only until an object lies below it
        (its lookup count + 1)."""
        d = self.table.new_dir(parent, name, parent.view, prefix, time.time_ns())
        self.local_dirs.add(d.ino)
        self.table.ref(d)
        return d

    def is_local_dir(self, d: Dir) -> bool:
        return d.ino in self.local_dirs

    def keep_dir(self, d: Dir) -> None:
        """``d`` is about to lose its last entry through this mount (unlink, rename): it
        stays, as if mkdir'ed, until rmdir (rm -r removes a file, then its directory)."""
        if len(d.children) == 1 and d.view is not None and d is not d.view.top:
            self.local_dirs.add(d.ino)

    def remove_dir(self, d: Dir) -> None:
        """rmdir of the empty directory ``d`` (a file it hid shows again)."""
        parent = d.parent
        self.keep_dir(parent)
        self.local_dirs.discard(d.ino)
        self.table.detach(d)
        if d.shadow is not None:
            d.shadow.gone = False
            parent.children[d.name] = d.shadow
            parent.changed()
        self.prune(parent)

    def move(self, node: Node, dst: Dir, name: str) -> None:
        """Move ``node`` (keeping its inode) to ``dst``/``name``, replacing what is there."""
        self.keep_dir(node.parent)
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
        self.prune(old)

    # ------------------------------------------------------------ views come and go

    def retire_view(self, vs: ViewState) -> None:
        """A reload dropped or replaced ``vs``: its directory (and what was mkdir'ed below
        it) leaves the tree; open files keep working."""
        stack = [vs.top]
        while stack:
            d = stack.pop()
            self.local_dirs.discard(d.ino)
            stack.extend(c for c in d.children.values() if c.is_dir)
        self.table.detach(vs.top)
        self.notifier.entry(ROOT_INODE, vs.name)

    def add_view(self, vs: ViewState) -> None:
        """A reload added ``vs``: its (empty) directory under the root."""
        vs.top = self.table.new_dir(self.table.root, vs.name, vs, vs.root, time.time_ns())
        self.notifier.entry(ROOT_INODE, vs.name)
