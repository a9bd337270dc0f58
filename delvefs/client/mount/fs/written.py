"""Written files: everything about a file being written, owned here and changed nowhere else —
its cache entry's write side, its journal record and ranges log, its writers, and its place
in the upload queue (waiting out the write-back delay, queued, being sent, failed and when
it is tried again). The upload itself (the requests to S3, the entry locks, the parts sent
while a file is written, conflict copies) is ``delvefs.client.mount.fs.uploads``, which
changes this state only through the methods here.

A file opened for writing is a *dirty* cache entry: a local file of its own
(``data/w-<id>``, independent of the key, so renames only re-key it and no download can
ever land on it; see ``DataCache.own_file``). Every dirty entry that holds a byte S3 does
not have has a journal record ``journal/w-<id>.json`` (bucket, key, and ``meta``: view,
``base`` — the ETag of the version it was based on, "" when the object did not exist —
existing, tags, untag, since, and ``conflict`` for a conflict copy). It is written with
tmp + rename before the first byte that differs from S3 is accepted (a write, a truncate)
and when the upload is left to the background (``persist``: an eager close; not fsync'd),
and removed when the upload succeeded: a mount that was SIGKILLed loses nothing it had
accepted (a kernel or machine crash may lose the last ones); the next mount of its cache
directory takes the records over (``restore``). Records of older versions have no ``base``: their upload checks with a HEAD.
``make_durable`` (an fsync(2) of an eager mount with ``fsync=journal``) makes one entry
survive a kernel crash or power loss too: its data file, ranges log and record fsync'd
with the directory entries of all three.

An entry's write-side state (``CacheEntry``):

``dirty``      its content is this mount's, not (yet) an object in S3; never evicted
``meta``       the journal record (None when clean); ``journaled``: it is on disk
``gen``        bumped by every write and truncate: an upload that read the file before
               a write leaves the entry dirty, to be uploaded again
``writers``    handles open for writing (the last one's close uploads)

Transitions: ``take`` (clean -> dirty, not journaled: a created, never written file is
journaled lazily), ``journal``, ``written`` / ``truncate``, ``uploaded`` (dirty ->
clean), ``rebased`` (uploaded, but written meanwhile: still dirty), ``redirty`` (written
again through a handle still open after an upload), ``update_record`` (tags set while
dirty, a rename's view), ``rekey`` (a rename), ``unsource`` (no longer based on the
source's bytes), ``discard`` (unlinked or replaced: gone).

Failed writes. A write (or truncate) into a written file that the cache disk refused
(ENOSPC, EDQUOT, EIO, ...) leaves the file partial — what happened to be written — so it
is never uploaded as if it were whole: ``write_failed`` marks it with the errno, in memory
and in its record (``write_error``; when the full disk cannot take the rewritten record,
the record is removed instead: the killed mount's next start must not upload it). Every
close and fsync of it answers that errno (``failed_write``), the uploader and ``upload``
pass it by, and its last writer's release drops its local changes (``drop_failed``: the
key shows what S3 has again); a record with the mark is dropped the same way at the next
start (``restore``). A new open with O_TRUNC empties it and starts a new file (``take``).

Close-to-open or eager (``eager``: the one place that decides it). A file's last close (and a
truncate(2) or rename of it nobody writes) either uploads it before it returns — the
default, close-to-open — or, *eager*, returns once its record is on disk and leaves the
upload to the background uploader, after the write-back delay: every file of an ``--eager``
mount, and in a default mount the files whose view's ``write: {eager: [...]}`` globs match
their key below the view's root (``View.writes_eagerly``, e.g. a workflow engine's
``.snakemake/*`` bookkeeping beside outputs that keep close-to-open).

Write-back delay (eager files, ``settings.write_back`` seconds, as rclone's
``--vfs-write-back`` or the kernel's dirty_expire): a closed file *waits* until it was left
unchanged that long — a close of a writer, a truncate or a rename starts its wait again —
before the uploader may pick it, so a file removed within the delay (a workflow engine's
marker files) costs no request at all: never uploaded, and no DELETE of a key S3 never had.
The waiting files are kept in the order of their last change (``_waiting``): the uploader
(``delvefs.client.mount.fs.uploads``) moves those whose delay is over to the queue
(``release_waiting``) and sleeps until the next one's ends (``wait_for_work``: a timer,
``trio.move_on_at``). Sooner: ``Uploads.sync_all``, fsync and ``Uploads.shutdown`` upload
whatever waits (an fsync that only makes the file durable locally, ``hurry``, ends its
wait); a directory rename (a publish) uploads its files; past a backlog bound
(``backlog_files`` files queued or waiting, ``backlog_bytes`` waiting — the bytes they hold
on the cache disk: a big file laid out by ftruncate or fallocate and written by a later
open, as fio does, holds little at its first close) every waiting file goes at once; and a
file dirty for ``backlog_age`` already is not held again when it is closed (a file
rewritten every second still reaches S3).

Sparse dirty files. An existing object opened for writing (without O_TRUNC) is not
downloaded: the entry's file is a sparse file of the object's size, ``present`` holds
what the clean entry had cached, ``source`` = (bucket, key, ETag) of the base version and
``source_len`` its size (the read side's fields: ``DataCache.ensure`` fetches missing
bytes from it). The write side adds ``changed``: the bytes that differ from the source
(writes; truncates shrink ``source_len``). An upload copies the unchanged ranges
server-side (``delvefs.client.mount.fs.rebuild``). ``changed`` must survive a SIGKILL without
rewriting the record per write: each entry with a source has an append-only *ranges log*
``data/w-<id>.ranges`` of 16-byte records (start, end) — a write that continues the last
record's range rewrites that record in place — created before the record names a source,
removed after it; the record holds ``source`` and ``source_len`` (rewritten by a
truncate, which is rare). Recovery reads the log: ``changed`` as written, ``present`` =
``changed`` (what was fetched is fetched again when needed). A record with a source whose
log is gone was removed after a completed upload (the log goes right after the record):
it is dropped.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time

import trio

from ..cache.cacheentry import CacheEntry
from ..cache.datacache import DataCache
from ..errors import FsError, StoreError, cache_file_error
from ..cache.journal import sync_path
from ..cache.ranges import RangeSet
from ..cache.rangeslog import RangesLog

log = logging.getLogger(__name__)

# files from this size on count by their allocated blocks in the backlog's bytes
SPARSE_FROM = 8 << 20
# the room a journal record or ranges log write asks for on a full cache disk
RECORD_ROOM = 64 << 10


def _held_bytes(entry: CacheEntry) -> int:
    """What a closed file holds on the cache disk: its size, or for a big one its blocks
    (a stat: never on the path of small files)."""
    if entry.size < SPARSE_FROM:
        return entry.size
    try:
        return min(entry.size, os.stat(entry.path).st_blocks * 512)
    except OSError:
        return entry.size


class WrittenFiles:
    """The write side's state of every written file (see the module's docstring)."""

    # Background uploads give way to the mount's requests (they compete for the loop and the
    # CPU; measured: even 1-2 uploads beside an untar cost as much as 16, and uploads that
    # began mid-untar once 1,024 files waited tripled its time on one CPU): all of
    # ``upload_concurrency`` run once no request came for ``upload_idle`` seconds or the
    # backlog passes a bound (bytes and age, as the kernel's dirty_background_bytes and
    # dirty_expire; the file count only bounds the journal a restart reads), else
    # ``upload_busy`` at a time. sync, fsync and unmount upload at once, whatever this says.
    upload_idle = 0.075
    upload_busy = 0
    backlog_files = 10_000
    backlog_bytes = 256 << 20
    backlog_age = 10.0
    backlog_check_every = 0.1  # seconds: how often a held-back uploader looks at the bounds
    # (the write-back delay itself is a setting, ``write_back``: eager mounts only)

    def __init__(self, cache: DataCache, settings, catalog):
        self.cache = cache
        self.catalog = catalog  # the views: which of their files are written back eagerly
        self.mount_eager = settings.eager  # every file (``--eager``)
        self._records = cache.journal  # the records of dirty files: this part writes them
        self.logs: dict[str, RangesLog] = {}  # file name -> ranges log of a sparse entry
        # the upload queue (eager closes, failed uploads, recovered records; see ``queue``)
        self.upload_concurrency = max(1, settings.upload_concurrency)
        self.write_back = max(0.0, settings.write_back)  # (eager files only)
        self.retry_initial = settings.retry_initial
        self.retry_max = settings.retry_max
        self._pending: dict[str, CacheEntry] = {}  # file -> entry the uploader picks (or retries)
        # closed files waiting out the write-back delay, in the order of their last change:
        # file -> (when the wait ends, on the trio clock; the entry; its size then)
        self._waiting: dict[str, tuple[float, CacheEntry, int]] = {}
        self._waiting_bytes = 0
        self._hurried: dict[str, int] = {}  # file -> its gen when an fsync asked for it
        self._retry: dict[str, tuple[float, float]] = {}  # file -> (next attempt, delay)
        self._failures: dict[str, str] = {}  # file -> why its last upload failed
        # file -> the errno of a write into it that failed (never uploaded; see the docstring)
        self._write_errors: dict[str, int] = {}
        self.failed_writes = 0   # writes and truncates into written files the cache disk refused
        self.dropped_files = 0   # files not uploaded, their changes dropped: a write had failed
        self._uploading: set[str] = set()    # files whose upload request runs now
        # file -> (gen, ETag) of a rebuild whose completion went unanswered
        self._unanswered: dict[str, tuple[int, str]] = {}
        self._kick = trio.Event()  # set: the uploader looks at the queue again
        self._wake_at = math.inf   # when the uploader looks again by itself (no kick needed before)
        self._holding_back = False  # the uploader waits for the mount to be idle
        self._last_request = -math.inf

    def eager(self, entry: CacheEntry) -> bool:
        """Whether the dirty file is written back eagerly — its last close (a truncate(2), a
        rename) returns once its record is on disk, the upload follows in the background
        after the write-back delay — or close-to-open: the close uploads it (see the
        module's docstring)."""
        vs = self.catalog.get((entry.meta or {}).get("view"))
        return self.eager_for(vs, entry.bucket, entry.key)

    def eager_for(self, vs, bucket: str, key: str) -> bool:
        """Whether a file of ``bucket/key`` in view ``vs`` is written back eagerly (also its
        removal: an unlink's DELETE is queued)."""
        return self.mount_eager or (vs is not None and vs.bucket == bucket
                                    and vs.view.writes_eagerly(key))

    def _log(self, entry: CacheEntry) -> RangesLog | None:
        return self.logs.get(os.path.basename(entry.path))

    def changed(self, entry: CacheEntry) -> RangeSet:
        """The bytes of a dirty entry that differ from its source."""
        lg = self._log(entry)
        return lg.changed if lg is not None else RangeSet([(0, entry.size)])

    def entries(self) -> list[CacheEntry]:
        return [e for e in self.cache.entries.values() if e.dirty]

    def _record(self, entry: CacheEntry, *, view: str, base: str) -> dict:
        return {"file": os.path.basename(entry.path), "view": view, "base": base,
                "existing": bool(base), "tags": {}, "untag": [], "since": time.time()}

    def take(self, bucket: str, key: str, *, view: str, base: str, truncate: bool,
             held: int = 0, size: int = 0) -> CacheEntry:
        """The dirty entry of ``bucket/key``: the one there is (emptied when ``truncate``),
        else a new file of its own: empty (``truncate``, or a new object), or a sparse
        file of the object's ``size`` based on version ``base`` (what the clean entry of
        that version had cached taken over, see ``DataCache.own_file``; ``held``: the
        caller's opens of the cached entry) — nothing is downloaded. Raises StoreError
        (ENOSPC, EIO) when the cache disk refuses."""
        entry = self.cache.get(bucket, key)
        if entry is not None and entry.dirty:
            if truncate and entry.size:
                self.truncate(entry, 0)
            for field, value in self._record(entry, view=view, base=base).items():
                entry.meta.setdefault(field, value)
            if truncate:  # emptied: a new file, whatever a failed write left in the old one
                self._clear_failure(entry)
            return entry
        if entry is not None and entry.writers:
            # uploaded (an fsync) while a descriptor still writes to it: it stays the key's
            # one file, which every descriptor open for writing writes and reads
            self.redirty(entry, view)
            if truncate and entry.size:
                self.truncate(entry, 0)
            if truncate:
                self._clear_failure(entry)
            return entry
        sparse = not truncate and bool(base) and size > 0
        clean = entry if sparse and entry is not None and entry.etag == base \
            and entry.size == size else None
        present = None if clean is None or clean.present is None else clean.present.copy()
        entry = self.cache.own_file(bucket, key, empty=clean is None, held=held)
        entry.dirty = True
        if sparse:
            if clean is None:
                present = RangeSet()
                try:
                    os.truncate(entry.path, size)
                except OSError as exc:
                    self.cache.drop(entry)
                    raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc
                self.cache.resize(entry, size)
            entry.present = present
            entry.source, entry.source_len = (bucket, key, base), size
            self.logs[os.path.basename(entry.path)] = RangesLog(entry.path + ".ranges")
        self.cache.resize(entry, entry.size)  # counted as dirty: by its size
        entry.meta = self._record(entry, view=view, base=base)
        return entry

    def journal(self, entry: CacheEntry) -> None:
        """Make sure the dirty entry's record is on disk: before the first byte that differs
        from S3 is accepted (a write, a truncate) and when an upload failed."""
        if not entry.journaled and entry.meta is not None:
            self._write(entry)

    def _write(self, entry: CacheEntry, *, unless_same: bool = False) -> None:
        r = entry.meta
        r["bucket"], r["key"] = entry.bucket, entry.key
        lg = self._log(entry)
        if lg is not None and entry.source is not None:
            try:  # before the record names its source (see the module's docstring)
                self.cache.with_room(lg.open, RECORD_ROOM)
            except OSError as exc:
                raise cache_file_error(exc, f"ranges log of {entry.bucket}/{entry.key}") from exc
            r["source"], r["source_len"] = list(entry.source), entry.source_len
        else:
            r.pop("source", None)
            r.pop("source_len", None)
        self.cache.with_room(lambda: self._records.write(r, unless_same=unless_same), RECORD_ROOM)
        entry.journaled = True  # only once it is on disk: a failed write is tried again

    def persist(self, entry: CacheEntry) -> None:
        """Eager close: the record on disk before close returns — written here, on the loop,
        only when it is not there yet (every change of a journaled record rewrites it). Not
        fsync'd: the page cache outlives a killed process; only a kernel or machine crash
        can lose the last eager closes (``fsync(2)`` waits for the upload, or with
        ``fsync=journal`` for ``make_durable``). Raises StoreError."""
        if entry.dirty and entry.meta is not None:
            self.journal(entry)

    async def make_durable(self, entry: CacheEntry) -> None:
        """fsync(2) of an eager mount with ``fsync=journal``: the dirty entry survives a
        kernel crash or power loss, not only a killed process. Its record is made current
        here, on the loop (written when it is not on disk or what is there differs from the
        entry's: ``take`` may have completed an old record in memory); then, in a worker
        thread, the data file is fdatasync'd, its ranges log (a sparse entry's ``changed``:
        a stale log would rebuild the object wrongly) and the data directory (their names)
        fsync'd, and the record with its directory (``Journal.make_durable``). An entry
        discarded or uploaded meanwhile needs nothing. Raises StoreError."""
        if not entry.dirty or entry.meta is None:
            return
        self._write(entry, unless_same=True)
        record, data = entry.meta, entry.path
        lg = self._log(entry)
        ranges = lg.path if lg is not None and lg.fd is not None else None

        def sync() -> None:
            for path, data_only in ((data, True), (ranges, False)):
                if path is not None:
                    try:
                        sync_path(path, data_only=data_only)
                    except FileNotFoundError:
                        pass  # discarded (unlinked) or its log removed (unsourced) meanwhile
            sync_path(self.cache.dir)
            self._records.make_durable(record)
        try:
            await trio.to_thread.run_sync(sync)
        except OSError as exc:
            raise cache_file_error(
                exc, f"cache file or journal of {entry.bucket}/{entry.key}") from exc

    def _unjournal(self, entry: CacheEntry) -> None:
        if entry.meta is not None:
            if entry.journaled:
                self._records.remove(entry.meta)
            entry.meta = None
            entry.journaled = False
        lg = self.logs.pop(os.path.basename(entry.path), None)
        if lg is not None:
            lg.close(remove=True)  # after the record: a log without one is never needed

    async def run_removals(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: the records of uploaded files removed in batches (``Journal``)."""
        await self._records.run_removals(task_status=task_status)

    def settle_removals(self) -> None:
        """Blocking: the records left to the background removed now."""
        self._records.remove_doomed()

    def add_writer(self, entry: CacheEntry) -> None:
        """A handle opened for writing (it holds the entry open too)."""
        self.cache.hold(entry)
        entry.writers += 1

    def drop_writer(self, entry: CacheEntry) -> None:
        """A writing handle gave its entry up for another (its ``cache.release`` follows)."""
        entry.writers -= 1

    def release_writer(self, entry: CacheEntry, *, named: bool) -> None:
        """A writing handle closed (after its flush): one writer less; a file still dirty
        when its last writer is gone — its flush could not upload it — is queued (retried),
        unless it lost its name (``named`` False: its bytes go nowhere)."""
        entry.writers -= 1
        if entry.dirty and entry.writers == 0 and named:
            self.queue(entry)
        self.cache.release(entry)

    # ------------------------------------------------------------ failed writes

    def write_failed(self, entry: CacheEntry, err: int) -> None:
        """A write (or truncate) into the written file failed with ``err``: what it holds is
        partial, never to be uploaded (see the module's docstring); the first failure's
        errno stays. Its record says so — or, when the cache disk refuses the rewritten
        record too, is removed: a killed mount's next start must not upload the file."""
        self.failed_writes += 1
        name = os.path.basename(entry.path)
        if name in self._write_errors:
            return
        self._write_errors[name] = err
        code = errno.errorcode.get(err, str(err))
        log.warning("%s/%s: a write failed (%s): not uploaded; every close and fsync of it "
                    "fails with %s, its last close drops its changes", entry.bucket, entry.key,
                    code, code)
        self.unqueue(entry)
        if entry.meta is None:
            return
        entry.meta["write_error"] = code
        if entry.journaled:
            try:
                self._write(entry)
            except StoreError as exc:
                log.warning("journal of %s/%s: %s: its record removed instead", entry.bucket,
                            entry.key, exc)
                self._records.remove(entry.meta, at_once=True)
                entry.journaled = False  # (written again, with the mark, by a later write)

    def failed_write(self, entry: CacheEntry) -> FsError | None:
        """The error every close, fsync and upload of the file answers since a write into it
        failed; None when none did."""
        err = self._write_errors.get(os.path.basename(entry.path))
        if err is None:
            return None
        return FsError(err, f"{entry.bucket}/{entry.key}: not uploaded: a write failed "
                       f"({errno.errorcode.get(err, err)})", logged=True)

    def _clear_failure(self, entry: CacheEntry) -> None:
        """The file was emptied by a new open (O_TRUNC): no failed write is in it any more."""
        if self._write_errors.pop(os.path.basename(entry.path), None) is None:
            return
        if entry.meta is not None and entry.meta.pop("write_error", None) is not None \
                and entry.journaled:
            self._write(entry)

    def drop_failed(self, entry: CacheEntry) -> None:
        """The last writer of a file a write into failed is gone: its local changes are
        dropped, never uploaded (descriptors still reading it keep their bytes); the caller
        shows what S3 has at its key."""
        err = self._write_errors.get(os.path.basename(entry.path), errno.EIO)
        log.warning("%s/%s: not uploaded: a write failed (%s): its local changes are dropped, "
                    "the name shows what S3 has", entry.bucket, entry.key,
                    errno.errorcode.get(err, err))
        self.dropped_files += 1
        self.unqueue(entry)
        self.orphan(entry)

    def written(self, entry: CacheEntry, start: int, end: int) -> None:
        """Bytes [start, end) were written to the entry's file (journaled before). Raises
        StoreError when the ranges log cannot take them."""
        if end > entry.size:
            self.cache.resize(entry, end)
        entry.gen += 1
        if entry.present is not None:
            entry.present.add(start, end)
        if entry.source is not None and start < entry.source_len:
            lg = self._log(entry)
            if lg is not None:
                try:
                    self.cache.with_room(lambda: lg.add(start, end), RECORD_ROOM)
                except OSError as exc:
                    raise cache_file_error(exc, f"ranges log of {entry.bucket}/{entry.key}") from exc

    def truncate(self, entry: CacheEntry, size: int) -> None:
        if entry.source is not None and size < entry.source_len:
            entry.source_len = size  # bytes from here on are local (zeros once extended)
            if size == 0:
                self.unsource(entry)
            elif entry.journaled:
                self._write(entry)
        self.journal(entry)
        try:
            os.truncate(entry.path, size)
        except OSError as exc:
            raise cache_file_error(exc, f"cache file for {entry.bucket}/{entry.key}") from exc
        self.cache.resize(entry, size)
        if entry.present is not None:
            entry.present.truncate(size)
        entry.gen += 1

    def unsource(self, entry: CacheEntry) -> None:
        """The entry no longer takes bytes from its source (all of them fetched, or the
        source is gone and what is missing stays zeros): an ordinary local file."""
        entry.source, entry.present = None, None
        lg = self.logs.pop(os.path.basename(entry.path), None)
        if entry.meta is not None and entry.journaled:
            self._write(entry)  # first the record without its source, then the log goes
        if lg is not None:
            lg.close(remove=True)

    def sparse(self, entry: CacheEntry) -> bool:
        """Some byte of the entry's file is not present locally yet."""
        return entry.present is not None and not entry.present.covers(
            0, min(entry.size, entry.source_len))

    def redirty(self, entry: CacheEntry, view: str) -> None:
        """An entry cleaned by an upload is written again through a handle still open: based
        on the version it uploaded."""
        entry.dirty = True
        entry.meta = self._record(entry, view=view, base=entry.etag or "")
        err = self._write_errors.get(os.path.basename(entry.path))
        if err is not None:  # a write into it failed meanwhile: still never uploaded
            entry.meta["write_error"] = errno.errorcode.get(err, str(err))
        self._write(entry)

    def update_record(self, entry: CacheEntry, **changes) -> None:
        """Change the record (``view``, ``base``, ``existing``, ``tags``, ``untag``,
        ``conflict``) of a dirty entry; a new ``base`` alone implies ``existing``."""
        if "base" in changes and "existing" not in changes:
            changes["existing"] = bool(changes["base"])
        entry.meta.update(changes)
        if entry.journaled:
            self._write(entry)

    def uploaded(self, entry: CacheEntry, etag: str) -> None:
        """The entry's content is now object ``etag`` in S3: no longer dirty (its missing
        bytes, if any, come from that version now)."""
        entry.dirty = False
        self._unjournal(entry)
        if entry.present is not None:
            entry.source, entry.source_len = (entry.bucket, entry.key, etag), entry.size
        self.cache.validated(entry, etag)

    def rebased(self, entry: CacheEntry, etag: str, size: int, *, batch: bool = True) -> None:
        """Uploaded as version ``etag`` of ``size`` bytes but written meanwhile: still
        dirty, based on that version — also for the bytes it lacks (it holds the source's
        bytes where nothing was changed; ``changed`` still covers what differs).
        ``batch=False``: no longer part of the publish batch it was uploaded in (what was
        written since is no part of it)."""
        if entry.meta is not None:
            entry.meta["base"], entry.meta["existing"] = etag, True
            if not batch:
                entry.meta.pop("batch", None)
        if entry.source is not None:
            lg = self._log(entry)
            if lg is not None and size > entry.source_len:
                # bytes that were local only may have been written after they were sent
                try:
                    lg.add(entry.source_len, size)
                except OSError as exc:
                    log.warning("ranges log of %s/%s: %s", entry.bucket, entry.key, exc)
            entry.source, entry.source_len = (entry.bucket, entry.key, etag), min(size, entry.size)
        if entry.meta is not None and entry.journaled:
            self._write(entry)

    def rekey(self, entry: CacheEntry, bucket: str, key: str) -> None:
        """The entry (dirty or clean) now belongs to ``bucket/key`` (a rename); an entry
        there is dropped (a dirty one too: replaced by the rename, its data is no longer
        wanted)."""
        old = self.cache.get(bucket, key)
        if old is not None and old is not entry and old.dirty:
            self.discard(old)
        self.cache.rekey(entry, bucket, key)
        if entry.meta is not None and entry.journaled:
            self._write(entry)

    def discard(self, entry: CacheEntry) -> None:
        """Drop an entry whatever its state (its file was unlinked / replaced)."""
        self._write_errors.pop(os.path.basename(entry.path), None)
        entry.dirty = False
        self._unjournal(entry)
        self.cache.drop(entry)

    def orphan(self, entry: CacheEntry) -> None:
        """The entry's file is no key's any more (removed or replaced while descriptors
        hold it): theirs alone, never uploaded; one that holds all of its bytes reads
        without S3 from now on (its version may be gone)."""
        self.discard(entry)
        if not self.sparse(entry):
            entry.present, entry.source = None, None

    def orphan_resized(self, entry: CacheEntry, size: int) -> None:
        """An orphaned entry (``orphan``) was written or truncated through a descriptor:
        its size (it is no longer the cache's to count)."""
        entry.size = size

    # ------------------------------------------------------------ the upload queue

    def queue(self, entry: CacheEntry, *, failed: bool = False, wait: bool = True) -> None:
        """Leave a dirty file to the background uploader. ``wait``: it has just changed (a
        close, a truncate, a rename): an eager file waits out the write-back delay first
        (its wait starts again). ``failed``: its upload failed: tried again after a backoff."""
        name = os.path.basename(entry.path)
        if name in self._write_errors:  # partial: never uploaded (``write_failed``)
            return
        if not entry.journaled:  # left to the background: must survive a crash now
            try:
                self.journal(entry)
            except StoreError as exc:
                log.warning("journal of %s/%s: %s", entry.bucket, entry.key, exc)
        self._unwait(name)
        if wait and not failed and self.write_back > 0 and not self._dirty_long(entry) \
                and self._hurried.get(name) != entry.gen and self.eager(entry):
            self._pending.pop(name, None)
            due = trio.current_time() + self.write_back
            held = _held_bytes(entry)
            self._waiting[name] = (due, entry, held)  # at the end: the last changed
            self._waiting_bytes += held
            # the uploader sleeps until the first wait ends, which is before this one's
            if due < self._wake_at or self._over_bounds():
                self._kick.set()
            return
        self._pending[name] = entry
        if failed:
            _, delay = self._retry.get(name, (0.0, 0.0))
            delay = min(self.retry_max, max(self.retry_initial, delay * 2))
            self._retry[name] = (trio.current_time() + delay, delay)
        if not self._holding_back or len(self._pending) >= self.backlog_files:
            self._kick.set()

    def unqueue(self, entry: CacheEntry) -> None:
        """The file is uploaded, removed, renamed or a conflict copy: out of the queue."""
        name = os.path.basename(entry.path)
        self._pending.pop(name, None)
        self._unwait(name)
        self._hurried.pop(name, None)
        self._retry.pop(name, None)
        self._failures.pop(name, None)

    def _unwait(self, name: str) -> None:
        waiting = self._waiting.pop(name, None)
        if waiting is not None:
            self._waiting_bytes -= waiting[2]

    def _dirty_long(self, entry: CacheEntry) -> bool:
        """The file has been dirty for ``backlog_age`` already (it keeps changing): not
        held back again."""
        since = (entry.meta or {}).get("since")
        return since is not None and time.time() - since >= self.backlog_age

    def _over_bounds(self) -> bool:
        """The backlog passes a bound: waiting files go without waiting out their delay."""
        return len(self._pending) + len(self._waiting) >= self.backlog_files \
            or self._waiting_bytes >= self.backlog_bytes

    def hurry(self, entry: CacheEntry) -> None:
        """Something needs the file in S3 soon (an fsync that does not upload itself, as
        with ``fsync=journal``): queued without the write-back delay — also at its next
        close, unless it is written again before."""
        self._hurried[os.path.basename(entry.path)] = entry.gen
        self.queue(entry, wait=False)

    def upload_failed(self, entry: CacheEntry, reason: str) -> None:
        self._failures[os.path.basename(entry.path)] = reason
        self.queue(entry, failed=True)

    def request_seen(self) -> None:
        """A create/write/close came (cheap: called for every write)."""
        self._last_request = trio.current_time()

    def ready(self, now: float):
        """The queued files in the order they were queued, each with when it may go (its
        retry's time; ``now`` when it may go now); clean, gone and still written ones leave
        the queue (the last close of a written one uploads it). Lazy: the uploader stops at
        its limit — which is why it walks the queue itself, not a copy (a copy per look is
        quadratic in a backlog of thousands): the caller must not queue or unqueue between
        two items (it starts tasks, which run later); those leaving go once it stops."""
        leaving = []
        try:
            for name, entry in self._pending.items():
                if not entry.dirty or entry.meta is None or entry.writers \
                        or name in self._write_errors:
                    leaving.append(name)
                    continue
                yield name, entry, self._retry.get(name, (now, 0.0))[0]
        finally:
            for name in leaving:
                self._pending.pop(name, None)

    def release_waiting(self, now: float) -> float:
        """Move the files whose write-back delay is over — every waiting one when the
        backlog passes a bound — to the queue; returns when the next wait ends (inf: none
        waits)."""
        over = self._over_bounds()
        while self._waiting:
            name = next(iter(self._waiting))
            due, entry, _ = self._waiting[name]
            if due > now and not over:
                return due
            self._unwait(name)
            self._pending[name] = entry
        return math.inf

    def idle_at(self) -> float:
        """When the mount counts as idle if no request comes before (trio clock)."""
        return self._last_request + self.upload_idle

    def upload_limit(self, now: float) -> int:
        """How many background uploads may run now."""
        if now - self._last_request >= self.upload_idle or len(self._pending) >= self.backlog_files:
            return self.upload_concurrency
        oldest = next(iter(self._pending.values()), None)
        if oldest is not None and oldest.meta is not None \
                and time.time() - oldest.meta.get("since", time.time()) >= self.backlog_age:
            return self.upload_concurrency
        if sum(e.size for e in self._pending.values()) >= self.backlog_bytes:
            return self.upload_concurrency
        return min(self.upload_busy, self.upload_concurrency)  # 0: none until idle

    async def wait_for_work(self, next_at: float, *, holding_back: bool) -> None:
        """The uploader sleeps until a kick or ``next_at``. Holding back, it looks again by
        itself: the closes meanwhile need not wake it (but for the file bound), nor sum the
        backlog's bytes each time."""
        self._holding_back = holding_back
        self._wake_at = next_at
        with trio.move_on_at(next_at):
            await self._kick.wait()
        self._kick = trio.Event()
        self._holding_back = False
        self._wake_at = math.inf  # (awake: a kick costs nothing)

    def kick(self) -> None:
        """The uploader looks at the queue again (an upload ended)."""
        self._kick.set()

    @contextlib.contextmanager
    def sending(self, entry: CacheEntry):
        """The file's upload request runs (its state says ``uploading``)."""
        name = os.path.basename(entry.path)
        self._uploading.add(name)
        try:
            yield
        finally:
            self._uploading.discard(name)

    def unanswered(self, entry: CacheEntry, etag: str) -> None:
        """A rebuild's completion of the file's current ``gen`` went unanswered: S3 may
        have made it version ``etag`` already."""
        self._unanswered[os.path.basename(entry.path)] = (entry.gen, etag)

    def take_unanswered(self, entry: CacheEntry) -> str | None:
        """The ETag of an unanswered completion of this very ``gen``, if there was one."""
        prior = self._unanswered.pop(os.path.basename(entry.path), None)
        return prior[1] if prior is not None and prior[0] == entry.gen else None

    def upload_state(self, entry: CacheEntry) -> tuple[str, str | None]:
        """(state, reason) of a dirty entry: waiting (the write-back delay), pending,
        uploading, failed or conflict."""
        name = os.path.basename(entry.path)
        conflict = (entry.meta or {}).get("conflict")
        if conflict:
            return "conflict", f"S3 has another version of {conflict.get('key')}: {conflict.get('reason')}"
        if name in self._uploading:
            return "uploading", None
        if name in self._write_errors:
            return "failed", (f"a write failed ({errno.errorcode.get(self._write_errors[name])}): "
                              "not uploaded, its changes are dropped at its last close")
        if name in self._failures:
            return "failed", self._failures[name]
        if name in self._waiting:
            return "waiting", None
        return "pending", None

    def queued(self) -> bool:
        """Some file waits or is queued for the uploader."""
        return bool(self._pending or self._waiting)

    # ------------------------------------------------------------ recovery

    def restore(self) -> list[CacheEntry]:
        """The dirty entries an earlier mount of this cache directory journaled (the
        records ``DataCache`` found at its start): in the cache again, to be uploaded."""
        records = self.cache.take_recovered()
        restored = []
        for r in records:
            if r.get("write_error"):  # partial (``write_failed``): dropped, as at its last close
                log.warning("journal record of %s/%s: not uploaded: a write failed (%s) before "
                            "the mount ended: its local changes are dropped", r["bucket"], r["key"],
                            r["write_error"])
                self.dropped_files += 1
                self._records.remove(r)
                for path in (self.cache.dir / r["file"], self.cache.dir / (r["file"] + ".ranges")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                continue
            entry = CacheEntry(r["bucket"], r["key"], str(self.cache.dir / r["file"]))
            entry.etag = ""
            entry.size = os.stat(entry.path).st_size
            if r.get("source"):
                changed = RangesLog.read(entry.path + ".ranges")
                if changed is None:
                    log.info("journal record of %s/%s: uploaded before the mount ended (its "
                             "ranges log was removed): dropped", r["bucket"], r["key"])
                    self._records.remove(r)
                    try:
                        os.unlink(entry.path)
                    except FileNotFoundError:
                        pass
                    continue
                entry.source, entry.source_len = tuple(r["source"]), int(r["source_len"])
                entry.present = changed.copy()  # what was fetched is fetched again
                lg = self.logs[r["file"]] = RangesLog(entry.path + ".ranges", changed)
                try:
                    lg.open()
                except OSError as exc:
                    log.warning("ranges log of %s/%s: %s", r["bucket"], r["key"], exc)
            entry.dirty = True
            entry.meta = r
            entry.journaled = True
            old = self.cache.get(entry.bucket, entry.key)
            if old is not None and old.dirty:  # two records for one key: the later one wins
                self.discard(old)
            self.cache.add(entry)
            restored.append(entry)
        return [e for e in restored if e.dirty]
