"""Inode table and directory tree of a mount.

Nodes
-----
``Dir`` and ``File`` are ``__slots__`` classes (no per-entry dict): a listed file costs
one File, its interned name and one slot in its directory's ``children`` dict. A node
keeps its inode number for its whole life; numbers come from a counter and are never
reused while the process runs.

Lookup-count rules (the FUSE contract)
--------------------------------------
* ``nlookup`` counts the references the kernel holds. It grows by one for every
  successful ``lookup`` (incl. "." and ".."), for every readdirplus entry the kernel
  *accepted* (``reply`` returned True), and for create/mkdir (write side); it shrinks by
  ``n`` on ``forget(ino, n)``.
* The inode table (``InodeTable.nodes``, ino -> node) holds the root and exactly the
  nodes with ``nlookup > 0``; nodes the kernel does not know are reachable only through
  the tree, so a million listed-but-never-looked-up files cost no table slot.
* A node leaves the tree (``detach``: deleted object, pruned empty directory, relist
  sweep) independently of its lookup count. A detached node with ``nlookup > 0`` stays in
  the table (``gone`` = True) so the kernel can still getattr/read/forget it; it is
  dropped at its last ``forget``. A name that comes back later gets a *new* node and
  inode number.
* A node whose object changes in place (same key, new ETag) keeps its inode; the core
  asks the kernel to drop its cached attributes and pages (invalidate_inode). Under the
  kernel's writeback cache (eager mounts) a node the kernel holds is replaced by a new
  one instead (``Tree.object_changed``): the kernel keeps a held inode's size.

Readdir offsets
---------------
``opendir`` takes a snapshot of the directory: a tuple of its children in insertion
order. The directory caches that tuple until its next change, so many opendirs share
one. ``readdir(off)`` returns snapshot entries from index ``off``; the entry at index
``i`` carries ``next offset = i + 1``. Offsets therefore stay valid however the
directory changes: entries added after the snapshot appear after the next rewind
(``readdir`` at offset 0 takes a fresh snapshot), entries removed after it are skipped
(never returned twice, never shifting others). "." and ".." are not listed (the kernel
and libc supply them).

Names
-----
A key is shown under one name per view, or not at all. ``key_path`` decides which, and
``unshowable`` says why not; docs/SEMANTICS.md ("Which keys are shown") lists the rules.
A key with a NUL byte is shown in no layout (no file name holds one).

``tree`` layout: the key below the view's root is split at "/"; every segment but the
last is a (virtual) directory. Keys with an empty, "." or ".." segment, or a segment
longer than 255 bytes, are not shown (a tree name is the segment itself, unescaped, so a
cut one could be another key's segment). A key ending in "/" (a "folder marker") only
makes its directories. When both ``a`` and ``a/...`` exist, the directory wins and the
file ``a`` is hidden until the directory disappears.

``flat`` layout: every object is a file at the view's top, named by ``flat_name``:
the key below the root with ``%`` written ``%25`` and ``/`` written ``%2F`` (and a name
of exactly "." or ".." written ``%2E`` / ``%2E%2E``); a name that would be longer than
255 bytes is cut (``fit_name``, as long property values are). This is reversible
(``flat_key``), so two keys never share a name.

``layout: {by: [p1, p2, ...]}``: one directory level per named property, named by the
object's value of it (``value_dir``), ``_unset`` where the object lacks the property;
files below the last level are named as in ``flat``. A value is its directory's name
unless that could not be a name or would be ambiguous: ``%`` is written ``%25`` and
``/`` ``%2F``; the whole values "" / "." / ".." / "_unset" are written ``%`` / ``%2E`` /
``%2E%2E`` / ``%5Funset``. ``dir_value`` reverses it and refuses names that are not what
``value_dir`` writes. A value with a NUL byte makes its object unshown in the view.

Long names (``fit_name``): an escaped value or flat name longer than 255 bytes is cut to
200 bytes (whole characters) followed by ``%~`` and 16 hex digits of the sha256 of what it
names. No escaped name holds ``%~`` (``%`` is ``%25`` there), so such a name is always a
cut one; the mount maps it back through the names it has made (``ViewState.long_names``).
"""
from __future__ import annotations

import errno
import stat
import sys
from collections.abc import Mapping

from ..errors import FsError, read_only

ROOT_INODE = 1
NAME_MAX = 255

_intern = sys.intern


UNSET_DIR = "_unset"
_LONG_MARK = "%~"
_CUT_BYTES = 200


def is_cut(name: str) -> bool:
    """Whether ``name`` is a cut long name (``fit_name``): it stands for what the mount
    saw it made from."""
    return _LONG_MARK in name


def fit_name(escaped: str, text: str) -> str:
    """``escaped`` (the escaped name of ``text``, a key suffix or a property value) as it
    is when it fits in NAME_MAX bytes, else cut: its first 200 bytes, ``%~`` and 16 hex
    digits of the sha256 of ``text``."""
    if len(escaped) <= NAME_MAX // 4 or len(escaped.encode("utf-8", "surrogateescape")) <= NAME_MAX:
        return escaped
    import hashlib
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    cut = escaped.encode("utf-8", "surrogateescape")[:_CUT_BYTES].decode("utf-8", "ignore")
    return cut + _LONG_MARK + digest


def uncut(name: str, known: Mapping[str, str] | None, what: str) -> str:
    """What the cut name ``name`` was made from, found in ``known`` (the names the mount
    made); ValueError when it is not there (``what``: "key" or "value", for the message)."""
    if known is not None and name in known:
        return known[name]
    raise ValueError(f"{name!r} stands for a long {what} this mount has not seen")


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("/", "%2F")


def flat_name(rel: str) -> str:
    """The flat-layout file name of key suffix ``rel`` (reversible: see flat_key)."""
    if rel == ".":
        return "%2E"
    if rel == "..":
        return "%2E%2E"
    return fit_name(_escape(rel), rel)


def flat_key(name: str, known: Mapping[str, str] | None = None) -> str:
    """Inverse of flat_name. A cut long name is found in ``known`` (name -> key suffix);
    ValueError when it is not there."""
    if _LONG_MARK in name:
        return uncut(name, known, "key")
    out = []
    i = 0
    while i < len(name):
        c = name[i]
        if c == "%" and name[i + 1:i + 3] in ("25", "2F", "2E"):
            out.append({"25": "%", "2F": "/", "2E": "."}[name[i + 1:i + 3]])
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def value_dir(value: str | None) -> str:
    """The directory name of a property value in a layout by properties (None: unset)."""
    if value is None:
        return UNSET_DIR
    special = {"": "%", ".": "%2E", "..": "%2E%2E", UNSET_DIR: "%5F" + UNSET_DIR[1:]}.get(value)
    if special is not None:
        return special
    return fit_name(_escape(value), value)


def dir_value(name: str, known: Mapping[str, str] | None = None) -> str | None:
    """The property value a directory name of a layout by properties stands for (None for
    ``_unset``). A cut long value is found in ``known`` (name -> value). ValueError when
    ``name`` is not a name ``value_dir`` writes."""
    if name == UNSET_DIR:
        return None
    if _LONG_MARK in name:
        return uncut(name, known, "value")
    value = {"%": "", "%2E": ".", "%2E%2E": "..", "%5F" + UNSET_DIR[1:]: UNSET_DIR}.get(name)
    if value is None:
        value = flat_key(name.replace("%2E", "%252E"))  # only %25 and %2F inside a value
    if value_dir(value) != name:
        raise ValueError(f"{name!r} is not a property directory name (write % as %25, / as "
                         f"%2F, an empty value as %, an unset one as {UNSET_DIR})")
    return value


def layout_values(by: tuple[str, ...], tags: Mapping[str, str] | None,
                  metadata: Mapping[str, str] | None = None) -> tuple[str | None, ...]:
    """An object's values of the properties ``by`` (lowercase names) in a layout by
    properties: its tag of that name (compared case-insensitively), else its user metadata
    of that name, else None (unset)."""
    found: dict[str, str] = {}
    for source in (metadata or {}), (tags or {}):  # tags last: a tag wins
        for name, value in source.items():
            name = name.lower()
            if name in by:
                found[name] = value
    return tuple(found.get(name) for name in by)


def relative_path(view, key: str) -> str | None:
    """The path of ``key`` below the directory of ``view``, or None when the key is not
    shown there. ``view`` is anything with ``root`` and ``layout`` — a rulesets View, the
    core's ViewState, or the mapping ``user.delvefs.view`` answers. tree: the key minus the
    root ("sub/b.txt"; a folder marker "sub/" keeps its trailing "/"); flat: the flat name
    (``flat_name``); by properties: the flat name below the property directories where the
    mount's view (a ViewState) has placed it, else (they need the object's values) the
    flat name alone. Pure: ``delvefs watch`` uses it, the core uses it for every key."""
    if isinstance(view, Mapping):
        by = view.get("layout_by")
        return key_path(view.get("root") or "", view.get("layout") == "flat" or bool(by), key)
    by = getattr(view, "layout_by", None)
    rel = key_path(view.root or "", view.layout == "flat" or bool(by), key)
    places = getattr(view, "places", None)  # the mount's view: the directories the file is in
    dirs = places.placed.get(key) if places is not None and rel is not None else None
    if dirs is not None:
        return "/".join([*dirs, rel])
    return rel


def key_path(root: str, flat: bool, key: str) -> str | None:
    """relative_path with the view's ``root`` and layout spelled out (the hot path): None
    for a key outside ``root``, the root's own folder marker, a folder marker in a flat
    layout (it stands for directories, which a flat view has none of) and an unshowable
    key (``unshowable``)."""
    if not key.startswith(root):
        return None
    rel = key[len(root):]
    if not rel or flat and rel.endswith("/") or unshowable(rel, flat) is not None:
        return None
    return flat_name(rel) if flat else rel


# why a key has no name (a few shared texts: a view may hold many such keys)
NUL_BYTE = "a NUL byte (no file name holds one)"
EMPTY_SEGMENT = "an empty segment (// or a leading /)"
DOT_SEGMENT = {".": "a '.' segment", "..": "a '..' segment"}
LONG_SEGMENT = f"a segment longer than {NAME_MAX} bytes"
NUL_VALUE = "a NUL byte in a property value (no directory name holds one)"


def unshowable(rel: str, flat: bool) -> str | None:
    """Why the key whose part below its view's root is ``rel`` has no name in that view
    (tree or flat names), or None when it has one. One rule for every layout: no name
    holds a NUL byte. A tree name is a key segment as it is: an empty, "." or ".." segment
    or one longer than 255 bytes has none. (A flat name escapes "/" and whole "." / "..",
    and a long one is cut: every other key has one.)"""
    if "\0" in rel:
        return NUL_BYTE
    if flat:
        return None
    parts = rel.split("/")
    if len(parts) > 1 and parts[-1] == "":  # a folder marker: its directories
        parts.pop()
    for seg in parts:
        if seg == "":
            return EMPTY_SEGMENT
        if seg in DOT_SEGMENT:
            return DOT_SEGMENT[seg]
        if not valid_segment(seg):
            return LONG_SEGMENT
    return None


def unshowable_values(values) -> str | None:
    """Why an object whose property values (a layout by properties) are ``values`` has no
    directory there, or None: a value's name is escaped and cut, but holds no NUL byte."""
    if any(v is not None and "\0" in v for v in values):
        return NUL_VALUE
    return None


def valid_segment(seg: str) -> bool:
    return seg not in ("", ".", "..") and (
        len(seg) <= NAME_MAX // 4 or len(seg.encode("utf-8", "surrogateescape")) <= NAME_MAX)


class Node:
    __slots__ = ("ino", "name", "parent", "nlookup", "gone")

    is_dir = False

    def __init__(self, ino: int, name: str, parent: "Dir | None"):
        self.ino = ino
        self.name = name
        self.parent = parent
        self.nlookup = 0
        self.gone = False


class File(Node):
    """A file for one object. ``mtime_ns`` from the object's Last-Modified."""

    __slots__ = ("size", "mtime_ns", "etag")

    def __init__(self, ino: int, name: str, parent: "Dir", size: int, mtime_ns: int, etag: str):
        super().__init__(ino, name, parent)
        self.size = size
        self.mtime_ns = mtime_ns
        self.etag = etag

    @property
    def key(self) -> str:
        d = self.parent
        if d.view is not None and d.view.flat:
            return d.view.root + flat_key(self.name, d.view.long_names)
        return d.prefix + self.name

    @property
    def view(self):
        return self.parent.view


class Dir(Node):
    """A directory: the mount root (view None), a view's top, or a virtual directory.
    ``prefix`` is the S3 key prefix its children's keys start with."""

    __slots__ = ("view", "prefix", "children", "_snapshot", "mtime_ns", "shadow")

    is_dir = True

    def __init__(self, ino: int, name: str, parent: "Dir | None", view, prefix: str, mtime_ns: int):
        super().__init__(ino, name, parent)
        self.view = view
        self.prefix = prefix
        self.children: dict[str, Node] = {}
        self._snapshot: tuple | None = None
        self.mtime_ns = mtime_ns
        self.shadow: File | None = None  # a file of the same name hidden by this directory

    def snapshot(self) -> tuple:
        """The children as a tuple, shared until the next change (readdir offsets)."""
        snap = self._snapshot
        if snap is None:
            snap = self._snapshot = tuple(self.children.values())
        return snap

    def changed(self) -> None:
        self._snapshot = None


def mode_of(node: Node, writable: bool) -> int:
    if node.is_dir:
        return stat.S_IFDIR | (0o755 if writable else 0o555)
    return stat.S_IFREG | (0o644 if writable else 0o444)


# S3's longest key (bytes of UTF-8)
MAX_KEY_BYTES = 1024


def check_name(name: str) -> None:
    """ENAMETOOLONG for a name longer than NAME_MAX bytes (as every file system answers,
    whatever the operation)."""
    if len(name) > NAME_MAX // 4 and len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise FsError(errno.ENAMETOOLONG, f"a name has at most {NAME_MAX} bytes")


def check_key(key: str) -> str:
    """``key``, or ENAMETOOLONG when S3 could not store it (more than 1,024 bytes): refused
    up front, never at the upload."""
    if len(key) > MAX_KEY_BYTES // 4 and \
            len(key.encode("utf-8", "surrogateescape")) > MAX_KEY_BYTES:
        raise FsError(errno.ENAMETOOLONG, f"an S3 key has at most {MAX_KEY_BYTES} bytes")
    return key


def key_for(parent: Dir, vs, name: str) -> str:
    """The key a file ``name`` in ``parent`` of view ``vs`` has (EINVAL when no key maps
    to it, ENAMETOOLONG when the name or the key is too long)."""
    check_name(name)
    if vs.flat:
        try:
            rel = flat_key(name, vs.long_names)
        except ValueError as exc:
            raise FsError(errno.EINVAL, str(exc)) from None
        if not rel or flat_name(rel) != name:
            raise FsError(errno.EINVAL, f"{name!r} is not a flat name (write % as %25, / as %2F)")
        return check_key(vs.root + rel)
    if not valid_segment(name):
        raise FsError(errno.EINVAL, f"{name!r} cannot be a key segment")
    return check_key(parent.prefix + name)


def looked_up_again(node: Node) -> FsError:
    """The error of an open of ``node`` removed or replaced since the kernel looked its name
    up: ESTALE, on which the kernel looks the name up once more and opens what is there
    (ENOENT, or the file's new inode); applications never see it."""
    return FsError(errno.ESTALE, f"{node.name}: removed or replaced meanwhile: looked up again")


def writable_dir(table: "InodeTable", ino: int) -> tuple[Dir, object]:
    """(directory, view) of ``ino``, a directory of a writable view (else the errno)."""
    d = table.require(ino)
    if not d.is_dir:
        raise FsError(errno.ENOTDIR)
    vs = d.view
    if vs is None:
        raise FsError(errno.EACCES, "the mount's root holds the views only")
    if not vs.writable:
        raise read_only(vs.name)
    return d, vs


class InodeTable:
    """ino -> node for the root and every node the kernel holds (nlookup > 0)."""

    def __init__(self, mtime_ns: int):
        self._next = ROOT_INODE + 1
        self.root = Dir(ROOT_INODE, "", None, None, "", mtime_ns)
        self.nodes: dict[int, Node] = {ROOT_INODE: self.root}

    def new_ino(self) -> int:
        ino = self._next
        self._next += 1
        return ino

    def get(self, ino: int) -> Node | None:
        return self.nodes.get(ino)

    def require(self, ino: int) -> Node:
        """The node of ``ino`` (ENOENT when the kernel names one it forgot)."""
        node = self.nodes.get(ino)
        if node is None:
            raise FsError(errno.ENOENT, f"inode {ino} unknown")
        return node

    def ref(self, node: Node, n: int = 1) -> None:
        """The kernel took ``n`` more references to ``node``."""
        node.nlookup += n
        if node.nlookup == n:
            self.nodes[node.ino] = node

    def forget(self, ino: int, n: int) -> None:
        node = self.nodes.get(ino)
        if node is None or ino == ROOT_INODE:
            return
        node.nlookup = max(0, node.nlookup - n)
        if node.nlookup == 0:
            del self.nodes[ino]

    def __len__(self) -> int:
        return len(self.nodes)

    # --- tree edits (synchronous: atomic with respect to other trio tasks) ---

    def new_dir(self, parent: Dir, name: str, view, prefix: str, mtime_ns: int) -> Dir:
        d = Dir(self.new_ino(), _intern(name), parent, view, prefix, mtime_ns)
        parent.children[d.name] = d
        parent.changed()
        return d

    def new_file(self, parent: Dir, name: str, size: int, mtime_ns: int, etag: str) -> File:
        f = File(self.new_ino(), name, parent, size, mtime_ns, etag)
        parent.children[name] = f
        parent.changed()
        return f

    def detach(self, node: Node) -> None:
        """Take ``node`` (and, for a directory, its subtree) out of the tree."""
        parent = node.parent
        if parent is not None and parent.children.get(node.name) is node:
            del parent.children[node.name]
            parent.changed()
        stack = [node]
        while stack:
            n = stack.pop()
            n.gone = True
            if n.is_dir:
                stack.extend(n.children.values())
