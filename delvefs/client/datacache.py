"""The local data cache of a mount: one file per object under ``<cache-dir>/data``.

* ``fetch`` makes an object's bytes available locally: the first time by downloading it
  (parallel ranged GETs, every GET pinned to one ETag with IfMatch), later
  from the cache; an entry older than ``ttl`` is revalidated with a HEAD and downloaded
  again only when the ETag changed.
* A download goes to a temporary file that is renamed onto the entry's path, so a reader
  sees either the old or the new version, never a mix. Open handles keep their own file
  descriptor: a replaced version stays readable through handles opened before.
* Clean entries are evicted least-recently-used while the cached bytes exceed ``limit`` or
  the cache's file system has less free space than its floor (``free_floor_*``);
  an entry that is open (``opens > 0``), dirty (write side) or being fetched never is.
* One fetch per object at a time: concurrent fetches wait for the running one.
* Large objects (>= ``stream_threshold``) stream: once a nursery is attached, ``fetch``
  returns as soon as the download has started, and ``read`` waits only until the bytes it
  needs have arrived (the download's threads write the parts into a :class:`Download`,
  which tracks the complete prefix and wakes waiting readers). The object's ETag is
  checked with a HEAD first and every ranged GET is pinned to it; if S3 changes the object
  mid-way, the download fails (412) and readers of that version get EIO instead of mixed
  bytes.

Write side: the cache stores the files of *dirty* entries too (``dirty`` = True: being
written, or written and not uploaded yet), each under a path of its own (``data/w-<id>``,
``own_file``), with its journal record (``journal/w-<id>.json``, ``write_record``). Their
state changes are made by ``delvefs.client.fs.dirty`` alone; the cache never evicts a dirty
entry and serves it to readers as it is.

The cache's *clean* part lives for one mount session: when ``DataCache`` starts it
removes every file except the dirty ones its journal names; those journal records are
``recovered``, for the core to take over and upload (a mount that was SIGKILLed loses
nothing it had accepted). Time is ``trio.current_time()`` (tests use trio's MockClock).
"""
from __future__ import annotations

import errno
import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import threading
import time
from collections import OrderedDict
from pathlib import Path

import trio

from .errors import Changed, StoreError, cache_file_error
from .s3async import pwrite_all

log = logging.getLogger(__name__)


class Download:
    """A download in progress, readable while it runs. The download's worker threads hand it
    the bytes with ``write_at`` (s3transfer's IO thread: ``seek``/``write``, a seekable file
    object); trio tasks ``await wait_for(end)``."""

    def __init__(self, path: str, size: int):
        self.path = path
        self.size = size
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.done = 0                      # bytes [0, done) are complete
        self.error: BaseException | None = None
        self.finished = False
        self._ranges: dict[int, int] = {}  # completed ranges beyond the prefix: start -> end
        self._pos = 0
        self._lock = threading.Lock()
        self._event = trio.Event()
        self._token = trio.lowlevel.current_trio_token()

    # --- the file object s3transfer writes to (its IO thread) ---
    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos + offset if whence == 1 else self.size + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, data) -> int:
        n = self.write_at(self._pos, data)
        self._pos += n
        return n

    def write_at(self, offset: int, data) -> int:
        """Store ``data`` at ``offset`` (any thread)."""
        pwrite_all(self.fd, offset, data)
        n = len(data)
        start, end = offset, offset + n
        with self._lock:
            if start <= self.done:
                self.done = max(self.done, end)
                while self.done in self._ranges:
                    self.done = max(self.done, self._ranges.pop(self.done))
            else:
                self._ranges[start] = max(self._ranges.get(start, 0), end)
        self._wake_soon()
        return n

    # --- trio side ---
    def _wake_soon(self) -> None:
        try:
            self._token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass

    def _wake(self) -> None:
        ev, self._event = self._event, trio.Event()
        ev.set()

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.finished = True
        self._wake()

    async def wait_finished(self) -> None:
        while not self.finished:
            await self._event.wait()

    async def wait_for(self, end: int) -> None:
        end = min(end, self.size)
        while self.done < end:
            if self.error is not None:
                if isinstance(self.error, StoreError):
                    raise self.error
                raise StoreError(errno.EIO, f"download failed: {self.error}")
            if self.finished:
                raise StoreError(errno.EIO, f"download ended at {self.done} of {self.size} bytes")
            await self._event.wait()


class CacheEntry:
    """One object's bytes in the cache. ``dirty``, ``gen``, ``meta``, ``writers`` and
    ``journaled`` are the write side's state (changed by ``delvefs.client.fs.dirty``)."""
    __slots__ = ("bucket", "key", "path", "etag", "size", "validated", "opens", "dirty", "download",
                 "gen", "meta", "writers", "journaled")

    def __init__(self, bucket: str, key: str, path: str):
        self.bucket = bucket
        self.key = key
        self.path = path
        self.etag: str | None = None
        self.size = 0
        self.validated = float("-inf")
        self.opens = 0
        self.dirty = False
        self.download: Download | None = None  # set while a streaming download runs
        self.gen = 0            # write generation: bumped by every write/truncate
        self.meta: dict | None = None  # dirty entries: the journal record (view, tags, ...)
        self.writers = 0        # open handles writing to it
        self.journaled = False  # its journal record is on disk


class DataCache:
    def __init__(self, directory: str | os.PathLike, limit: int | None = None,
                 stream_threshold: int = 8 * 1024 * 1024):
        self.dir = Path(directory) / "data"
        self.tmp = Path(directory) / "tmp"
        self.journal = Path(directory) / "journal"
        self.entries: OrderedDict[tuple[str, str], CacheEntry] = OrderedDict()
        self.bytes = 0
        records = self._read_journal()
        keep = {r["file"] for r in records}
        for d in (self.dir, self.tmp, self.journal):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.dir, self.tmp):
            for p in d.iterdir():
                if d is self.tmp or p.name not in keep:
                    if p.is_dir():
                        shutil.rmtree(p)
                    else:
                        p.unlink()
        self.recovered = records  # journal records of dirty files, for the write side
        self.limit = limit
        self.stream_threshold = stream_threshold
        self.nursery: trio.Nursery | None = None  # attach one to stream large objects
        self._busy: dict[tuple[str, str], trio.Event] = {}
        self._seq = itertools.count()
        # journal records of uploaded files, removed by a worker thread (``run_removals``)
        self._doomed: set[str] = set()
        self._doomed_lock = threading.Lock()
        self._doomed_kick: trio.Event | None = None  # set while ``run_removals`` runs
        self._removing = False
        self.downloads = 0  # statistics, for tests and logs
        self.streaming = 0  # streaming downloads running now
        self.heads = 0
        self.evictions = 0

    def _path(self, bucket: str, key: str) -> str:
        digest = hashlib.sha256(f"{bucket}\0{key}".encode("utf-8", "surrogateescape")).hexdigest()
        return str(self.dir / digest)

    def get(self, bucket: str, key: str) -> CacheEntry | None:
        return self.entries.get((bucket, key))

    async def fetch(self, store, bucket: str, key: str, *, etag: str, size: int,
                    ttl: float) -> tuple[CacheEntry, dict | None]:
        """The cache entry of ``bucket/key`` with valid content, opened (``opens`` + 1:
        the caller must ``release`` it) and the object's HEAD answer when one was made
        (the caller updates its metadata from it). ``etag``/``size`` are what the listing
        says. Raises StoreError (ENOENT when the object is gone)."""
        k = (bucket, key)
        while (ev := self._busy.get(k)) is not None:
            await ev.wait()
        entry = self.entries.get(k)
        now = trio.current_time()
        if entry is not None and entry.download is not None and entry.download.error is None:
            self.hold(entry)  # join the running download of the current version
            return entry, None
        # within ttl a copy is trusted — unless the listing names another version than it
        if entry is not None and entry.etag is not None and (
                entry.dirty or (now - entry.validated < ttl and (not etag or etag == entry.etag))):
            self.hold(entry)
            return entry, None
        ev = self._busy[k] = trio.Event()
        try:
            info = None
            if entry is not None and entry.etag is not None:
                info = await store.head(bucket, key)
                self.heads += 1
                if info["etag"] == entry.etag:
                    entry.validated = trio.current_time()
                    self.hold(entry)
                    return entry, info
                etag, size = info["etag"], info["size"]
            if self.nursery is not None and size >= self.stream_threshold:
                if info is None:
                    info = await store.head(bucket, key)
                    self.heads += 1
                entry = self._stream(store, bucket, key, info["etag"], info["size"])
                self.hold(entry)
                return entry, info
            for attempt in range(5):
                try:
                    entry = await self._download(store, bucket, key, etag, size)
                    break
                except StoreError as exc:
                    # the listing (or the HEAD) was behind S3: ask S3 what is there now
                    if not (isinstance(exc, Changed) or exc.errno == errno.ENOENT) or attempt == 4:
                        raise
                    info = await store.head(bucket, key)
                    self.heads += 1
                    etag, size = info["etag"], info["size"]
            self.hold(entry)
            return entry, info
        finally:
            del self._busy[k]
            ev.set()
            self.evict()

    async def _download(self, store, bucket: str, key: str, etag: str, size: int) -> CacheEntry:
        k = (bucket, key)
        path = self._path(bucket, key)
        tmp = str(self.tmp / f"{os.path.basename(path)}.{next(self._seq)}")
        try:
            if size == 0:
                open(tmp, "wb").close()
            else:
                await store.download(bucket, key, tmp, etag=etag, size=size)
                self.downloads += 1
            got = os.stat(tmp).st_size
            if got != size:
                raise Changed(f"GET {bucket}/{key}: {got} bytes, expected {size}")
            os.replace(tmp, path)  # atomic: readers see the old or the new file
        except OSError as exc:
            raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        entry = self.entries.get(k)
        if entry is None:
            entry = self.entries[k] = CacheEntry(bucket, key, path)
        else:
            self.bytes -= entry.size
            if entry.path != path and entry.download is None:
                _unlink(entry.path)  # an earlier (written) version had its own file
            entry.path = path
        entry.etag, entry.size = etag, size
        entry.validated = trio.current_time()
        self.bytes += size
        return entry

    def _stream(self, store, bucket: str, key: str, etag: str, size: int) -> CacheEntry:
        """Start a streaming download (in the attached nursery); the entry is readable
        through ``entry.download`` at once and renamed into place when complete."""
        k = (bucket, key)
        final = self._path(bucket, key)
        tmp = str(self.tmp / f"{os.path.basename(final)}.{next(self._seq)}")
        dl = Download(tmp, size)
        entry = self.entries.get(k)
        if entry is None:
            entry = self.entries[k] = CacheEntry(bucket, key, tmp)
        else:
            self.bytes -= entry.size
        entry.path, entry.etag, entry.size, entry.download = tmp, etag, size, dl
        entry.validated = trio.current_time()
        self.bytes += size

        async def run():
            error = None
            self.streaming += 1
            try:
                await store.download(bucket, key, dl, etag=etag, size=size)
                self.downloads += 1
                if dl.done != size:
                    raise Changed(f"GET {bucket}/{key}: {dl.done} bytes, expected {size}")
                os.replace(tmp, final)
                if entry.download is dl:
                    entry.path = final
            except BaseException as exc:
                error = exc if isinstance(exc, Exception) else StoreError(errno.EIO, "mount stopping")
                log.warning("download of %s/%s failed: %s", bucket, key, exc)
                if entry.download is dl:  # forget this version: the next open fetches again
                    entry.etag = None
                    entry.validated = float("-inf")
                if not isinstance(exc, Exception):
                    raise
            finally:
                self.streaming -= 1
                dl.finish(error)
                os.close(dl.fd)
                if entry.download is dl:
                    entry.download = None
                if error is not None and os.path.exists(tmp):
                    os.unlink(tmp)
                self.evict()
        self.nursery.start_soon(run)
        return entry

    def hold(self, entry: CacheEntry) -> None:
        """An open handle uses the entry (never evicted until ``release``)."""
        entry.opens += 1
        self.entries.move_to_end((entry.bucket, entry.key))

    def release(self, entry: CacheEntry) -> None:
        entry.opens -= 1
        if entry.opens == 0:
            self.evict()

    def forget(self, bucket: str, key: str) -> None:
        """The object is gone: drop its entry unless it is open or dirty."""
        entry = self.entries.get((bucket, key))
        if entry is not None and entry.opens == 0 and not entry.dirty and entry.download is None \
                and (bucket, key) not in self._busy:
            self.drop(entry)

    def drop(self, entry: CacheEntry) -> None:
        """Out of the cache, its file deleted (a dirty entry's record is the write side's)."""
        if self.entries.get((entry.bucket, entry.key)) is entry:
            del self.entries[(entry.bucket, entry.key)]
        self.bytes -= entry.size
        _unlink(entry.path)

    # ------------------------------------------------------------ write side's files

    def _read_journal(self) -> list[dict]:
        records = []
        if not self.journal.is_dir():
            return records
        for p in sorted(self.journal.iterdir(), key=lambda p: p.stat().st_mtime_ns):
            if not p.name.endswith(".json"):
                p.unlink()  # a record being written when the mount died
                continue
            try:
                r = json.loads(p.read_text())
                if not (self.dir / r["file"]).is_file():
                    raise ValueError("data file missing")
                records.append(r)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("journal record %s unusable (%s): dropped", p.name, exc)
                p.unlink()
        return records

    def write_record(self, record: dict) -> None:
        """Put a dirty file's journal record on disk (tmp + rename: never half a record; not
        fsync'd: it outlives the process, not a kernel crash). Raises StoreError."""
        final = self.journal / (record["file"] + ".json")
        if self._doomed:  # (only the loop adds to it) written again before its removal
            with self._doomed_lock:
                self._doomed.discard(final.name)
        tmp = self.journal / f"{record['file']}.json.{next(self._seq)}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, final)
        except OSError as exc:
            _unlink(str(tmp))
            raise cache_file_error(exc, f"journal of {record['bucket']}/{record['key']}") from exc

    def remove_record(self, record: dict) -> None:
        """Drop a record: at once, or (``run_removals`` running) soon, by a worker thread."""
        name = record["file"] + ".json"
        if self._doomed_kick is None:
            _unlink(str(self.journal / name))
            return
        with self._doomed_lock:
            self._doomed.add(name)
        self._doomed_kick.set()

    def remove_doomed(self) -> None:
        """Blocking: unlink the records ``remove_record`` left to the background. One at a
        time under the lock: a record written again meanwhile (``write_record``) is spared."""
        while True:
            with self._doomed_lock:
                if not self._doomed:
                    return
                _unlink(str(self.journal / self._doomed.pop()))

    def removals_pending(self) -> bool:
        return bool(self._doomed) or self._removing

    async def run_removals(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Background: remove the records of uploaded files in a worker thread, in batches
        (whatever gathered while the last batch ran); the rest inline when it ends."""
        self._doomed_kick = trio.Event()
        task_status.started()
        try:
            while True:
                await self._doomed_kick.wait()
                self._doomed_kick = trio.Event()
                self._removing = True
                try:
                    await trio.to_thread.run_sync(self.remove_doomed)
                finally:
                    self._removing = False
        finally:
            self._doomed_kick = None
            self.remove_doomed()

    def own_file(self, bucket: str, key: str, *, empty: bool, held: int = 0) -> CacheEntry:
        """A new entry of ``bucket/key`` in place of the cached one, with a file of its own
        (``data/w-<id>``): empty (``empty``, or no cached content), or the cached content
        taken over (moved, or copied while readers have it open; ``held``: opens of the
        caller, not readers). Raises StoreError (ENOSPC, EIO) when the cache disk refuses."""
        k = (bucket, key)
        entry = self.entries.get(k)
        path = str(self.dir / f"w-{os.urandom(8).hex()}")
        try:
            if empty or entry is None or entry.etag is None or entry.download is not None:
                open(path, "xb").close()
                size = 0
            elif entry.opens > held:
                shutil.copyfile(entry.path, path)  # open readers keep their version
                size = entry.size
            else:
                os.rename(entry.path, path)
                size = entry.size
        except OSError as exc:
            _unlink(path)
            raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc
        if entry is not None:
            self.bytes -= entry.size
        new = CacheEntry(bucket, key, path)
        new.etag, new.size = "", size
        if entry is not None and entry.path != path and entry.download is None:
            _unlink(entry.path)  # open readers keep reading through their descriptors
        self.entries[k] = new
        self.entries.move_to_end(k)
        self.bytes += size
        return new

    def add(self, entry: CacheEntry) -> None:
        """Take in an entry whose file is in the data directory already (a recovered one),
        in place of the cached one."""
        old = self.entries.get((entry.bucket, entry.key))
        if old is not None:
            self.drop(old)
        self.entries[(entry.bucket, entry.key)] = entry
        self.bytes += entry.size

    def resize(self, entry: CacheEntry, size: int) -> None:
        self.bytes += size - entry.size
        entry.size = size

    def validated(self, entry: CacheEntry, etag: str) -> None:
        """The entry's content is object version ``etag`` in S3 now (it was uploaded)."""
        entry.etag = etag
        entry.validated = trio.current_time()
        self.evict()

    def rekey(self, entry: CacheEntry, bucket: str, key: str) -> None:
        """The entry now belongs to ``bucket/key`` (a rename); an entry there is dropped
        (a dirty one is the write side's to discard first: its journal record)."""
        if self.entries.get((entry.bucket, entry.key)) is entry:
            del self.entries[(entry.bucket, entry.key)]
        old = self.entries.get((bucket, key))
        if old is not None and old is not entry:
            self.drop(old)
        if entry.download is None and entry.path == self._path(entry.bucket, entry.key):
            # a downloaded file is named by its key: it moves with it, else the old key's
            # next download would land on it
            path = self._path(bucket, key)
            try:
                os.rename(entry.path, path)
                entry.path = path
            except OSError as exc:
                log.warning("cache file of %s/%s: %s", bucket, key, exc)
                self.bytes -= entry.size
                entry.etag = None  # unusable: downloaded again when read
        entry.bucket, entry.key = bucket, key
        self.entries[(bucket, key)] = entry

    # the free-space floor: whatever ``limit`` says, clean entries go while the cache's file
    # system has less free than the smaller of these (``limit`` None: the only bound)
    free_floor_bytes = 1 << 30
    free_floor_ratio = 0.05

    # statvfs at most this often (seconds), plus whenever the cache grew by a tenth of the
    # free space seen last: many small files are cached and written one after another
    free_check_interval = 0.5
    _free_checked = (-math.inf, 0, 0)  # (monotonic time, bytes cached then, shortfall then)
    _free_seen = 0

    def _space_shortfall(self) -> int:
        """Bytes missing to the free-space floor of the cache's file system (0: none)."""
        at, cached, shortfall = self._free_checked
        now = time.monotonic()
        if now - at < self.free_check_interval and self.bytes - cached < self._free_seen // 10:
            return shortfall
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return 0
        floor = min(self.free_floor_bytes, int(st.f_blocks * st.f_frsize * self.free_floor_ratio))
        self._free_seen = st.f_bavail * st.f_frsize
        shortfall = max(0, floor - self._free_seen)
        self._free_checked = (now, self.bytes, shortfall)
        return shortfall

    def evict(self) -> None:
        """Drop least-recently-used clean, closed entries until within ``limit`` and the
        free-space floor."""
        limit = self.limit
        shortfall = self._space_shortfall()
        if shortfall:
            limit = max(0, min(self.bytes if limit is None else limit, self.bytes - shortfall))
        if limit is None or self.bytes <= limit:
            return
        for k, entry in list(self.entries.items()):
            if self.bytes <= limit:
                break
            if entry.opens or entry.dirty or entry.download is not None or k in self._busy:
                continue
            self.drop(entry)
            self.evictions += 1


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ------------------------------------------------------------ cache directories of mounts

LOCK = "lock"
OWNER = "owner.json"


def claim(directory: str | os.PathLike, views_file: str | None) -> int:
    """Take the cache directory for this mount: an exclusive ``flock`` on ``<dir>/lock``,
    held (by the returned descriptor) for the mount's life and dropped by the kernel however
    the process ends; and ``owner.json`` naming the views file and user, by which a later
    mount finds the directory's journal if it was left behind (``adopt_orphans``). Raises
    BlockingIOError when a live mount holds it."""
    import fcntl
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    if views_file is not None:
        tmp = d / (OWNER + ".tmp")
        tmp.write_text(json.dumps({"views": os.path.realpath(views_file), "uid": os.getuid()}))
        os.replace(tmp, d / OWNER)
    return fd


def adopt_orphans(directory: str | os.PathLike, others: str | os.PathLike,
                  views_file: str | None) -> list[str]:
    """Move the journal (records and their data files) of every cache directory under
    ``others`` that an earlier mount of the same views file by the same user left behind
    and no live mount holds (its lock is free) into ``directory``, before its DataCache
    starts: dirty files survive a remount at another mount point. Returns the directories
    adopted from."""
    import fcntl
    here = Path(directory).resolve()
    if views_file is None or not Path(others).is_dir():
        return []
    want = {"views": os.path.realpath(views_file), "uid": os.getuid()}
    adopted = []
    for d in sorted(Path(others).iterdir()):
        journal = d / "journal"
        try:
            if d.resolve() == here or not journal.is_dir() or not any(journal.iterdir()):
                continue
            if json.loads((d / OWNER).read_text()) != want:
                continue
            fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except (OSError, ValueError):
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live mount: its journal is its own
            (here / "journal").mkdir(parents=True, exist_ok=True)
            (here / "data").mkdir(parents=True, exist_ok=True)
            moved = 0
            for p in sorted(journal.iterdir(), key=lambda p: p.stat().st_mtime_ns):
                if not p.name.endswith(".json"):
                    continue
                try:
                    r = json.loads(p.read_text())
                    data = d / "data" / r["file"]
                    if data.is_file():  # data first: a record is never without its file
                        os.rename(data, here / "data" / r["file"])
                    os.rename(p, here / "journal" / p.name)
                    moved += 1
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("journal record %s of %s not taken over: %s", p.name, d, exc)
            if moved:
                log.info("took over %d dirty files from the journal of %s (an earlier mount of "
                         "%s)", moved, d, want["views"])
                adopted.append(str(d))
        finally:
            os.close(fd)
    return adopted
