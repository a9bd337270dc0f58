"""Open files and directories: the handles the kernel holds, by number.

A file handle keeps its own descriptor and cache entry, so it reads the version it opened
however the cache changes meanwhile; a writing handle's entry is the dirty local copy. A
directory handle keeps the snapshot of the children it lists (readdir offsets index it:
``delvefs.client.mount.fs.inodes``).
"""
from __future__ import annotations

import errno
import itertools
import os

import trio

from ..errors import FsError
from .inodes import Dir, File
from .readahead import Stream


class FileHandle:
    """An open file: its node, its own descriptor and cache entry (once open). Of two
    kinds: :class:`ReadHandle` (the reads part's) and :class:`WriteHandle` (the writes
    part's); ``writer`` tells which."""
    __slots__ = ("node", "entry", "fd", "lock")
    writer = False

    def __init__(self, node: File):
        self.node = node
        self.entry = None     # its CacheEntry once open
        self.fd: int | None = None
        self.lock = trio.Lock()


class ReadHandle(FileHandle):
    """Opened for reading only: its entry is opened on its first read (or at open, from a
    cached copy), and its sequential reads are fetched ahead (``stream``)."""
    __slots__ = ("stream",)

    def __init__(self, node: File):
        super().__init__(node)
        self.stream = Stream()  # its read-ahead's state (the read-ahead part's alone)


class WriteHandle(FileHandle):
    """Opened for writing: ``entry`` is the dirty local copy, open from the start."""
    __slots__ = ("copied",)
    writer = True

    def __init__(self, node: File, fd: int, entry):
        super().__init__(node)
        self.fd, self.entry = fd, entry
        self.copied = None    # (source handle number, the version written) after a server-side copy


class DirHandle:
    __slots__ = ("node", "snapshot")

    def __init__(self, node: Dir, snapshot: tuple):
        self.node = node
        self.snapshot = snapshot


class Handles:
    """The open file and directory handles (one numbering for both)."""

    def __init__(self):
        self._numbers = itertools.count(1)
        self.files: dict[int, FileHandle] = {}
        self.dirs: dict[int, DirHandle] = {}

    def add_file(self, h: FileHandle) -> int:
        fh = next(self._numbers)
        self.files[fh] = h
        return fh

    def add_dir(self, h: DirHandle) -> int:
        fh = next(self._numbers)
        self.dirs[fh] = h
        return fh

    def close_file(self, fh: int) -> tuple[FileHandle, object] | None:
        """Release file handle ``fh``: forgotten, its descriptor closed, its cache entry let
        go of; (the handle, that entry or None) for the caller to release in the cache, or
        None when ``fh`` was not open."""
        h = self.files.pop(fh, None)
        if h is None:
            return None
        if h.fd is not None:
            os.close(h.fd)
            h.fd = None
        entry, h.entry = h.entry, None
        return h, entry

    def drop_dir(self, fh: int) -> None:
        self.dirs.pop(fh, None)

    def file(self, fh: int) -> FileHandle:
        h = self.files.get(fh)
        if h is None:
            raise FsError(errno.EBADF)
        return h

    def writing(self, node: File) -> bool:
        """Whether a handle writes to ``node``."""
        return any(h.writer and h.node is node for h in self.files.values())

    def reading(self, node: File, besides: FileHandle | None = None) -> bool:
        """Whether a handle open for reading only (other than ``besides``) holds ``node``."""
        return any(not h.writer and h.node is node and h is not besides
                   for h in self.files.values())

    def reader_of_version(self, node: File) -> FileHandle | None:
        """A reading handle of ``node`` whose entry is the node's version (clean), if any."""
        for h in self.files.values():
            if not h.writer and h.node is node and h.fd is not None and h.entry is not None \
                    and not h.entry.dirty and h.entry.etag == node.etag:
                return h
        return None

    def close_all(self) -> None:
        for fh in list(self.files):
            h = self.files.pop(fh)
            if h.fd is not None:
                os.close(h.fd)
