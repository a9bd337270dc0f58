"""The file system core: protocol-free operations on views, nodes and cached data.

``FileSystem`` answers what the FUSE adapter asks (lookup, getattr, forget, opendir /
readdir, open / read / write / flush / fsync / release, create, setattr, unlink, mkdir,
rmdir, rename, getxattr / listxattr / setxattr / removexattr, statfs) with names as
``str`` and errors as :class:`delvefs.client.errors.FsError` (an errno). Tests drive it
directly with a fake handler and a fake store; the mount drives it through
``delvefs.client.fuse_adapter``.

It is one object; its operations live in one module per concern, and the state they
share is made here:

``views``       the views, their listings and delta refreshes (each a task of its own),
                their staleness while the handler does not answer, which view an object is in
``tree``        edits of the directory tree (never awaiting), the overlay of local changes
``attributes``  lookup, getattr, access, forget, opendir / readdir, statfs
``reads``       open, read, release
``writes``      create, write, flush, fsync, truncate
``uploads``     conditional uploads and conflicts, eager uploads and batched deletes,
                retries, recovery, sync, shutdown
``dirty``       the state of dirty files and their journal (:class:`DirtyFiles`)
``namespace``   unlink, mkdir, rmdir, rename
``xattrs``      tags, metadata and facts as extended attributes; a view's info and sync

Concurrency (trio)
------------------
Everything runs in one trio thread; code between two ``await`` s is atomic. Await points
are: waiting for a view refresh, handler HTTP calls, S3 calls (worker threads via
``delvefs.client.s3async``), and waiting for another task's download of the same object.
After each await, operations re-read the node/handle state instead of trusting what they
saw before. Each module states its own rules: tree edits never await (``tree``), cache
file I/O runs on the loop (``reads``), one dirty file's uploads, renames and unlinks take
turns (``uploads``).
"""
from __future__ import annotations

import collections
import itertools
import os
import time

import trio

from ..datacache import CacheEntry, DataCache
from .attributes import Attributes, DirHandle
from .dirty import DirtyFiles
from .inodes import InodeTable
from .namespace import Namespace
from .reads import FileHandle, Reads
from .tree import OVERLAY_BOUND, Tree
from .views import STALE_AFTER, ViewState, Views, scan_wait
from .uploads import Uploads
from .writes import Writes
from .xattrs import Xattrs


class NullNotifier:
    """Where the core reports what the kernel must forget (the adapter's is real)."""

    def entry(self, parent_ino: int, name: str) -> None:
        pass

    def inode(self, ino: int) -> None:
        pass


class FileSystem(Attributes, Reads, Writes, Uploads, Namespace, Xattrs, Views, Tree):
    def __init__(self, views, handler, store, cache: DataCache, settings=None, *, notifier=None,
                 reregister=None, uid: int | None = None, gid: int | None = None,
                 page_size: int = 20000, eager: bool = False, upload_concurrency: int = 16):
        # TEMPORARY: the new signature onto the old attributes (the lead's core replaces it)
        if settings is not None:
            uid, gid, page_size = settings.uid, settings.gid, settings.page_size
            eager, upload_concurrency = settings.eager, settings.upload_concurrency
        now_ns = time.time_ns()
        self.table = InodeTable(now_ns)
        self.handler = handler
        self.store = store
        self.cache = cache
        self.notifier = notifier or NullNotifier()
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.page_size = page_size
        self.views: list[ViewState] = []
        root = self.table.root
        for i, view in enumerate(views):
            vs = ViewState(view, 0)
            vs.index = i
            vs.top = self.table.new_dir(root, view.name, vs, vs.root, now_ns)
            self.views.append(vs)
        self.by_name = {vs.name: vs for vs in self.views}
        # handler outages (views): how long an operation on a listed view waits for a
        # refresh, and one on a view never listed for its bucket's first scan
        self.stale_after = STALE_AFTER
        self.scan_wait = scan_wait()
        self.reregister = None  # async (): register the views again (set by the mount)
        self.registration: tuple[str, dict] | None = None  # (client, proofs) of the last one
        self.registrations = 0
        self._matcher_obj = None
        self._fh = itertools.count(1)
        self.dirs: dict[int, DirHandle] = {}
        self.files: dict[int, FileHandle] = {}
        self._served: dict[int, str] = {}       # ino -> ETag whose bytes the kernel may cache
        self._props: dict[int, tuple] = {}      # ino -> (time, tags, metadata, etag)
        # write side
        self.dirty = DirtyFiles(cache)
        self.local_dirs: set[int] = set()       # inos of mkdir'ed dirs no object lies below yet
        self.overlay_bound = OVERLAY_BOUND
        self._locks: dict[str, trio.Lock] = {}  # journal file name -> upload lock
        self._pending: dict[str, CacheEntry] = {}   # dirty entries the uploader retries
        self._retry: dict[str, tuple[float, float]] = {}  # file -> (next attempt, delay)
        self._kick = trio.Event()
        self.retry_initial = 1.0
        self.retry_max = 60.0
        self.uploads = 0  # statistics (tests, logs)
        # eager mode: close returns once the file is journaled; uploads and DELETEs follow
        self.eager = eager
        self.upload_concurrency = max(1, upload_concurrency)
        self._uploading: set[str] = set()        # files whose upload request runs now
        self._failures: dict[str, str] = {}      # file -> why its last upload failed
        self.conflicts: list[dict] = []          # conflict copies made by this mount
        self._deletes: dict[tuple[str, str], dict] = {}  # queued DELETEs (eager unlinks)
        self._delete_kick = trio.Event()
        self._deletes_sent = trio.Event()        # set (and replaced) after each batch round
        self._delete_now = False                 # an upload waits: send without gathering
        self.delete_gather = 0.02                # seconds without an unlink before sending
        self._streams: dict = {}                 # file -> PartStream (parts sent while written)
        self._bg: trio.Nursery | None = None     # the uploader's nursery (background sends)
        self.stream_parts = False                # strict mode: send parts while written
        # (bucket, key) -> (ETag, tags) of this mount's last uploads (parts sent while written)
        self._own_tags: collections.OrderedDict = collections.OrderedDict()
        self.reregister = reregister
        if settings is not None:
            self.stream_parts = settings.upload_while_writing
            self.file_mode, self.dir_mode, self.umask = settings.file_mode, settings.dir_mode, settings.umask
            self.stale_after, self.scan_wait = settings.stale_after, settings.scan_wait
            self.retry_initial, self.retry_max = settings.retry_initial, settings.retry_max
            self.delete_gather, self.overlay_bound = settings.delete_gather, settings.overlay_bound

    def close(self) -> None:
        for fh in list(self.files):
            h = self.files.pop(fh)
            if h.fd is not None:
                os.close(h.fd)
