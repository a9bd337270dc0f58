"""The local data cache of a mount: one sparse file per object version under ``<cache-dir>/data``.

``DataCache`` owns the entries (``cacheentry.CacheEntry``, by bucket and key), their files
and the fetches that fill them (``cacheentry.Fetch``). Its parts, made by it: the bound
(``cachebound.CacheBound``: the bytes counted, the LRU, eviction) and the journal of dirty
files (``journal.Journal``).

Blocks. An entry's file has the object's size; which bytes are valid is ``present`` (a
:class:`RangeSet`; None: every byte, as for files written here). Missing bytes below
``source_len`` come from ``source`` = (bucket, key, etag): ``ensure(store, entry, start,
end)`` fetches the missing bytes of a range at once, rounded out to ``unit`` (a page: a
random read costs about what it reads), in ranged GETs of at most ``max_get`` bytes, every
GET pinned to the source's ETag with If-Match (412: ``Changed``); read-ahead
(``prefetch``) fetches more for sequential readers. Present bytes cost no request. The
bound counts, keeps in LRU order and evicts whole blocks of ``block_size`` (a block may be
partly present).

* ``fetch`` opens an object's entry: no request when the listing gave ETag and size (the
  first ``ensure`` proves them: a 412 or 404 there means the listing was behind, then one
  HEAD and the entry moves to the version S3 has); a copy of the listed version older than
  ``ttl`` is revalidated by one conditional GET of its first block (If-None-Match: 304
  confirms it; another version's answer is that version's first block, kept). ``current``
  (an open's revalidation) asks the same way. Objects of at most ``whole_size`` bytes are
  fetched whole on their first read.
* A new version gets a new entry and a new file; the old entry leaves the cache (file
  unlinked), and open handles keep their descriptor and entry object: they read the bytes
  they have, and a missing one is a GET pinned to the old ETag, which S3 refuses (412):
  EIO, never bytes of two versions.
* Fetches run in the cache's nursery (``nursery``; without one: trio system tasks), not
  in the reader's task: a cancelled read never aborts a fetch another reader waits for.
  Concurrent ``ensure`` calls share in-flight fetches (``entry.fetches``, by byte range).
  ``prefetch`` starts fetches nobody waits for yet (a handle's sequential read-ahead);
  ``cancel`` stops those still without a waiter (the handle closed, the entry replaced).
* A fetch's worker thread writes a clean entry's bytes straight into its file and tells
  the loop each completed block (``Fetch.received``); for a dirty entry (a writer may be
  writing to the same bytes) the thread hands the bytes to the loop, which writes only
  the sub-ranges still missing when they arrive.
* Bound (the part ``bound``; ``bytes``, ``limit`` and ``evictions`` are its figures):
  ``bytes`` counts present bytes of clean entries and the size of dirty ones. While it
  exceeds ``limit``, or the cache's file system has less free space than its floor,
  blocks are evicted least-recently-used (``touch`` on every read): their bytes punched
  out of the file (fallocate PUNCH_HOLE), first those of closed entries, then of open
  ones; an entry with nothing left and no opener is dropped. Never evicted: a block of a
  dirty entry or one open for writing, a block being fetched, a block an ``ensure`` in
  progress covers (``entry.pinned``). The cache tells the bound every change of what an
  entry counts (``added``, ``recount``, ``forget``); the bound drops an entry it emptied
  through the cache (``_drop_unused``: not while its version changes). A dirty entry that
  grows (``resize``) is checked against the bound at once.
* A full cache disk: every write to it — a fetch's bytes, a written file's (``pwrite``),
  a journal record, a ranges log, a copy taken over for writing — goes through
  ``with_room``: on ENOSPC or EDQUOT clean blocks are evicted whatever the bound says
  (``make_room``: one log line, ``forced_evictions``) and the write is tried again; its
  error stands only when nothing evictable is left (dirty data fills the disk).

Concurrency (one trio loop): between two awaits nothing else runs, so a reader that sees
``present.covers(a, b)`` and then preads without awaiting reads valid bytes — ``ensure``
returns only after such a check. ``present``, ``fetches``, and the bound's LRU and
``bytes`` change only on the loop (worker threads write file bytes and an integer,
``Fetch.received``, and hand the rest to the loop with ``run_sync_soon``). ``fetch`` runs
one version change per object at a time (``_busy``).

Write side: the cache stores the files of *dirty* entries too (``dirty`` = True: being
written, or written and not uploaded yet), each under a path of its own (``data/w-<id>``,
``own_file``), with its journal record (``journal/w-<id>.json``: ``delvefs.client.mount.cache.journal``). Their
state changes are made by ``delvefs.client.mount.fs.written`` alone; the cache never evicts from a
dirty entry and serves it to readers as it is.

The cache's *clean* part lives for one mount session: when ``DataCache`` starts it
removes every file except the dirty ones its journal names; those journal records are
``recovered``, for the core to take over and upload (a mount that was SIGKILLed loses
nothing it had accepted). Time is ``trio.current_time()`` (tests use trio's MockClock).
"""
from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import logging
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

import trio

from .cachebound import CacheBound
from .cacheentry import CacheEntry, Fetch
from ..errors import Changed, StopGet, StoreError, cache_file_error
from .journal import PUBLISH, Journal, PublishJournal
from .ranges import RangeSet

log = logging.getLogger(__name__)

KiB, MiB = 1 << 10, 1 << 20

# the errnos of a full cache disk, for which evicting clean blocks makes room
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class DataCache:
    """The cache of ``directory``: at most ``limit`` bytes (None: only the free-space
    floor), evicted in blocks of ``block_size``, read in GETs of at most
    ``max_get`` bytes. Its bound (``bytes``, the LRU, eviction) is the part ``bound``."""

    # objects up to this size are fetched whole on their first read (one GET)
    whole_size = 2 * MiB
    # a read's missing bytes are fetched rounded out to this (a page; at most a block)
    unit = 4 * KiB

    def __init__(self, directory: str | os.PathLike, limit: int | None = None, *,
                 block_size: int = 512 * KiB, max_get: int = 8 * MiB):
        self.dir = Path(directory) / "data"
        self._dir = str(self.dir)
        self.tmp = Path(directory) / "tmp"
        self.entries: OrderedDict[tuple[str, str], CacheEntry] = OrderedDict()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(Path(directory) / "journal", self.dir)
        self.publishes = PublishJournal(Path(directory) / PUBLISH)
        records = self.journal.read()
        # a sparse dirty file's ranges log (delvefs.client.mount.fs.written) stays with its record
        keep = {r["file"] for r in records} | {r["file"] + ".ranges" for r in records}
        self.tmp.mkdir(exist_ok=True)
        for d in (self.dir, self.tmp):
            for p in d.iterdir():
                if d is self.tmp or p.name not in keep:
                    if p.is_dir():
                        shutil.rmtree(p)
                    else:
                        p.unlink()
        self.recovered = records  # journal records of dirty files, for the write side
        if block_size <= 0 or max_get < block_size:
            raise ValueError(f"block size {block_size}, largest GET {max_get}")
        self.bound = CacheBound(self.dir, limit, block_size, self._drop_unused)
        self.max_get = max_get - max_get % block_size
        self.nursery: trio.Nursery | None = None  # where fetches run (else system tasks)
        self._busy: dict[tuple[str, str], trio.Event] = {}
        self._seq = itertools.count()
        self.gets = 0       # statistics, for tests and logs: ranged GETs started
        self.got = 0        # bytes they brought
        self.fetching = 0   # fetches running now
        self.heads = 0
        self.revalidations = 0  # conditional GETs asking whether a cached copy is current
        # reads (the mount's metrics): served from bytes present (hits) or after waiting
        # for a fetch (misses: ``waits`` counts the ensures that waited)
        self.hits = self.misses = self.hit_bytes = self.miss_bytes = 0
        self.waits = 0

    def take_recovered(self) -> list[dict]:
        """The journal's records found at the start, handed over once (to the write side)."""
        records, self.recovered = self.recovered, []
        return records

    # the bound's figures, as the cache's
    @property
    def bytes(self) -> int:
        return self.bound.bytes

    @property
    def limit(self) -> int | None:
        return self.bound.limit

    @property
    def evictions(self) -> int:
        return self.bound.evictions

    @property
    def forced_evictions(self) -> int:
        return self.bound.forced_evictions

    @property
    def block_size(self) -> int:
        return self.bound.block_size

    @block_size.setter
    def block_size(self, size: int) -> None:
        self.bound.set_block_size(size)

    def _path(self, bucket: str, key: str) -> str:
        """A new file name for a version of ``bucket/key`` (never reused: a fetch of an old
        version still writing can never land in a newer one's file)."""
        digest = hashlib.sha256(f"{bucket}\0{key}".encode("utf-8", "surrogateescape")).hexdigest()
        return f"{self._dir}/{digest[:40]}.{next(self._seq)}"

    def get(self, bucket: str, key: str) -> CacheEntry | None:
        return self.entries.get((bucket, key))

    # ------------------------------------------------------------------ opening

    async def fetch(self, store, bucket: str, key: str, *, etag: str, size: int, ttl: float,
                    want: tuple[int, int] | None = None,
                    exact: bool = False) -> tuple[CacheEntry, dict | None]:
        """The cache entry of ``bucket/key``'s current version, opened (``opens`` + 1: the
        caller must ``release`` it), and the object's HEAD answer when one was made (the
        caller updates its metadata from it). ``etag``/``size`` are what the listing says.
        With ``want`` = (start, end), those bytes are ensured too (the whole object when it
        is small): a listing that was behind S3 shows there (412, 404), and the entry moves
        to the version S3 has. ``exact``: version ``etag`` and no other (the kernel holds
        pages of it): never moved, and its bytes gone from S3 are a StoreError. Raises
        StoreError (ENOENT when the object is gone)."""
        k = (bucket, key)
        info = None
        for attempt in range(5):
            while (ev := self._busy.get(k)) is not None:
                await ev.wait()
            entry = self.entries.get(k)
            now = trio.current_time()
            # within ttl a copy is trusted — unless the listing names another version than it
            if not (entry is not None and entry.etag is not None and (
                    entry.dirty or (exact and etag == entry.etag)
                    or (now - entry.validated < ttl and (not etag or etag == entry.etag)))):
                ev = self._busy[k] = trio.Event()
                try:
                    if entry is not None and entry.etag is not None and info is None \
                            and not exact and (not etag or etag == entry.etag):
                        # the copy of the listed version is older than ttl: one conditional
                        # GET (a listing that names another version goes straight to a GET
                        # pinned to that one, below: a 412 or 404 there asks S3 which)
                        self.revalidations += 1
                        got = await store.get_if_changed(bucket, key, 0, self.block_size,
                                                         etag=entry.etag)
                        if got is None or got["etag"] == entry.etag:
                            entry.validated = trio.current_time()
                        else:
                            info = {f: got[f] for f in ("etag", "size", "mtime", "metadata")}
                            etag, size = info["etag"], info["size"]
                            entry = self._new_version(bucket, key, etag, size)
                            self._fill_first(entry, got)
                    else:
                        entry = self._new_version(bucket, key, etag, size)
                finally:
                    del self._busy[k]
                    ev.set()
            self.hold(entry)
            if want is None:
                return entry, info
            start, end = (0, entry.size) if entry.size <= self.whole_size else want
            try:
                await self.ensure(store, entry, start, end)
                return entry, info
            except BaseException as exc:
                self.release(entry)  # (also when the caller was cancelled)
                if not isinstance(exc, StoreError):
                    raise
                stale = isinstance(exc, Changed) or exc.errno == errno.ENOENT
                if not stale or entry.dirty or attempt == 4 or exact:
                    raise
            # the listing (or the cache) was behind S3: ask S3 what is there now (the loop
            # then moves the entry to that version, unless a concurrent caller did)
            entry.validated = float("-inf")
            info = await self._head(store, bucket, key)
            etag, size = info["etag"], info["size"]
        raise AssertionError("unreachable")

    async def _head(self, store, bucket: str, key: str) -> dict:
        self.heads += 1
        return await store.head(bucket, key)

    def _new_version(self, bucket: str, key: str, etag: str, size: int) -> CacheEntry:
        """A new, empty entry (a sparse file of ``size``) for version ``etag``, in place of
        the cached one (which leaves the cache; open handles keep it)."""
        path = self._path(bucket, key)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            _unlink(path)
            raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc
        old = self.entries.get((bucket, key))
        if old is not None:
            self.drop(old)
        entry = self.entries[(bucket, key)] = CacheEntry(bucket, key, path)
        entry.etag, entry.size = etag, size
        entry.present = RangeSet()
        entry.source, entry.source_len = (bucket, key, etag), size
        entry.validated = trio.current_time()
        return entry

    # ------------------------------------------------------------------ blocks

    async def ensure(self, store, entry: CacheEntry, start: int, end: int) -> None:
        """Afterwards bytes [start, min(end, size)) of ``entry`` are present in its file
        (those below ``source_len`` fetched from ``source``): valid until the caller next
        awaits. Raises StoreError (``Changed``: the source version is gone or changed)."""
        while True:
            present = entry.present
            stop = min(end, entry.size, entry.source_len)
            if present is None or start >= stop or present.covers(start, stop):
                return
            if entry.source is None:
                raise StoreError(errno.EIO, f"{entry.bucket}/{entry.key}: bytes {start}-{stop - 1} "
                                 "are missing and have no source")
            waits: dict[Fetch, int] = {}
            # a read needs its own bytes only (rounded out to ``unit``), not whole blocks:
            # random reads cost what they read; read-ahead fetches more for sequential ones
            unit = min(self.unit, self.block_size)
            lo, hi = start - start % unit, min(-(-stop // unit) * unit, entry.size, entry.source_len)
            new = self._not_in_flight(entry, present.missing(lo, hi), waits)
            for f in self._start(store, entry, new):
                waits[f] = f.end
            if waits:
                self.waits += 1
            pin = (start, stop)
            entry.pinned.append(pin)
            try:
                for f, upto in waits.items():
                    await f.wait(upto)
            finally:
                entry.pinned.remove(pin)
            # loop: a fetch that ended early (cancelled, the size changed) is started again

    def served(self, nbytes: int, missed: bool) -> None:
        """A read of ``nbytes`` was answered: after waiting for a fetch (``missed``: an
        ``ensure`` waited since the read began, see ``waits``) or from the cache."""
        if missed:
            self.misses += 1
            self.miss_bytes += nbytes
        else:
            self.hits += 1
            self.hit_bytes += nbytes

    def prefetch(self, store, entry: CacheEntry, start: int, end: int) -> list[Fetch]:
        """Start fetching the missing bytes of [start, end) nobody waits for yet (they are
        cancelled by ``cancel`` while nobody does); the fetches started."""
        present = entry.present
        stop = min(end, entry.size, entry.source_len)
        if present is None or entry.source is None or start >= stop or not self._holds(entry):
            return []  # (an entry no longer in the cache reads only what it has)
        return self._start(store, entry, self._not_in_flight(entry, present.missing(start, stop)))

    @staticmethod
    def _not_in_flight(entry: CacheEntry, gaps, waits: dict | None = None) -> list[tuple[int, int]]:
        """The parts of ``gaps`` (missing byte ranges, sorted) no fetch in flight brings;
        with ``waits``, the fetches that bring the other parts, each with how far it must
        have come (``Fetch.wait``)."""
        flying = sorted(entry.fetches, key=lambda f: f.start)
        new: list[tuple[int, int]] = []
        for gap_start, gap_end in gaps:
            pos = gap_start
            for f in flying:
                if f.end <= pos or f.start >= gap_end:
                    continue
                if f.start > pos:
                    new.append((pos, f.start))
                if waits is not None:
                    waits[f] = max(waits.get(f, 0), min(gap_end, f.end))
                pos = f.end
                if pos >= gap_end:
                    break
            if pos < gap_end:
                new.append((pos, gap_end))
        return new

    def cancel(self, fetches: list[Fetch]) -> None:
        """Stop those of ``fetches`` that nobody waits for (blocks brought so far stay)."""
        for f in fetches:
            if not f.finished and not f.waiters:
                f.cancelled = True

    def _start(self, store, entry: CacheEntry, ranges: list[tuple[int, int]]) -> list[Fetch]:
        """Fetches of byte ``ranges`` (sorted, disjoint): ``max_get`` bytes each at most."""
        started = []
        for range_start, range_end in ranges:
            range_end = min(range_end, entry.source_len)
            for pos in range(range_start, range_end, self.max_get):
                f = Fetch(entry, pos, min(pos + self.max_get, range_end))
                entry.fetches.append(f)
                started.append(f)
                self.background(self._run, store, f)
        return started

    def background(self, fn, *args) -> None:
        """Run ``fn(*args)`` as a task of the cache's nursery (without one: a system task):
        not in the caller's task, so no cancelled read aborts it."""
        if self.nursery is not None:
            self.nursery.start_soon(fn, *args)
        else:
            trio.lowlevel.spawn_system_task(fn, *args)

    async def fetch_ahead(self, store, bucket: str, key: str, *, etag: str, size: int,
                          ttl: float, upto: int) -> None:
        """Bytes [0, upto) of version ``etag`` fetched into the cache before anyone reads
        them (an open's prefetch of files its reader will want): as a first read would
        (``fetch``: an object of at most ``whole_size`` whole), nothing held afterwards.
        Best effort: nothing when they are there or being fetched already, the key's entry
        is dirty, or S3 refuses (logged)."""
        entry = self.entries.get((bucket, key))
        if entry is not None and (entry.dirty or entry.writers or (
                entry.etag == etag and (entry.present is None or entry.fetches
                                        or entry.present.covers(0, min(upto, entry.size))))):
            return
        try:
            entry, _ = await self.fetch(store, bucket, key, etag=etag, size=size, ttl=ttl,
                                        want=(0, upto))
        except StoreError as exc:
            log.info("prefetching %s/%s: %s", bucket, key, exc)
            return
        self.release(entry)

    async def _run(self, store, f: Fetch) -> None:
        """Bring bytes [f.start, f.end) of the entry's source into its file (a task)."""
        entry = f.entry
        bucket, key, etag = entry.source
        token = trio.lowlevel.current_trio_token()
        loop_thread = threading.get_ident()
        direct = not entry.dirty and not entry.writers
        bs = self.block_size
        fd = None
        self.fetching += 1
        self.gets += 1
        try:
            try:
                fd = os.open(entry.path, os.O_WRONLY)
            except FileNotFoundError:
                # the entry left the cache (a newer version replaced it): its source is gone
                raise Changed(f"GET {bucket}/{key}: version {etag} was replaced") from None
            except OSError as exc:
                raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc

            def room_from_thread(need: int) -> int:  # (the bound is the loop's)
                if threading.get_ident() == loop_thread:  # (a store that writes on the loop)
                    return self.make_room(need)
                return trio.from_thread.run_sync(self.make_room, need, trio_token=token)

            def write(offset: int, data) -> None:  # a worker thread
                if f.cancelled:
                    raise StopGet()
                n = len(data)
                if direct:
                    self.with_room(functools.partial(pwrite_all, fd, offset, data), n,
                                   make_room=room_from_thread)
                    f.received = offset + n
                    if (offset + n) // bs != offset // bs or offset + n == f.end:
                        token.run_sync_soon(self._mark, f)
                else:
                    f.arrived.append((offset, bytes(data)))
                    token.run_sync_soon(self._apply, f, fd)

            await store.get_range(bucket, key, f.start, f.end, etag=etag, write=write)
            self.got += f.end - f.start
            if direct:
                f.received = f.end
                self._mark(f)
            else:
                self._apply(f, fd)  # what the loop has not taken yet
        except StopGet:
            pass
        except StoreError as exc:
            if isinstance(exc, Changed) or exc.errno == errno.ENOENT:
                entry.validated = float("-inf")  # the next open asks S3 which version is there
            if not f.cancelled:
                f.error = exc
                log.warning("GET %s/%s bytes %d-%d: %s", bucket, key, f.start, f.end - 1, exc)
        except Exception as exc:  # noqa: BLE001 — any other failure of the GET is EIO
            if not f.cancelled:
                f.error = StoreError(errno.EIO, f"GET {bucket}/{key}: {type(exc).__name__}: {exc}")
                log.warning("%s", f.error)
        except BaseException:
            f.error = StoreError(errno.EIO, f"GET {bucket}/{key}: the mount is stopping")
            raise
        finally:
            self.fetching -= 1
            if fd is not None:
                os.close(fd)
            f.finished = True
            if f in entry.fetches:
                entry.fetches.remove(f)
            f.wake()
            if entry.opens == 0 and entry.present is not None and not entry.present \
                    and not entry.fetches and not entry.dirty:
                self._drop_unused(entry)
            self.evict()

    def _mark(self, f: Fetch) -> None:
        """(the loop) The blocks of a clean entry's fetch received so far are present."""
        upto = f.end if f.received >= f.end else f.received - f.received % self.block_size
        if upto > f.marked:
            self._add_present(f.entry, f.marked, upto)
            f.marked = upto
            f.wake()

    def _apply(self, f: Fetch, fd: int) -> None:
        """(the loop) The bytes of a dirty entry's fetch that arrived: written where still
        missing (never over bytes a writer wrote meanwhile, nor beyond ``source_len``). Runs
        before the fetch's task closes ``fd`` (that task takes what is left itself)."""
        entry = f.entry
        while f.arrived and not f.finished:
            offset, data = f.arrived.popleft()
            end = offset + len(data)
            if entry.present is None or f.error is not None:
                continue
            try:
                for gap_start, gap_end in entry.present.missing(offset, min(end, entry.source_len)):
                    self.with_room(functools.partial(
                        pwrite_all, fd, gap_start, memoryview(data)[gap_start - offset:gap_end - offset]),
                        gap_end - gap_start)
                    entry.present.add(gap_start, gap_end)
            except OSError as exc:
                f.cancelled = True  # the thread stops at its next write
                f.error = cache_file_error(exc, f"cache file for {entry.bucket}/{entry.key}")
                continue
            f.received = f.marked = end
        f.wake()

    def _add_present(self, entry: CacheEntry, start: int, end: int) -> None:
        present = entry.present
        if present is None:
            return
        if entry.dirty or not self._holds(entry):  # dirty: counted by size; gone: not at all
            present.add(start, end)
            return
        added = sum(e - s for s, e in present.missing(start, end))
        present.add(start, end)
        self.bound.added(entry, start, end, added)

    def _holds(self, entry: CacheEntry) -> bool:
        return self.entries.get((entry.bucket, entry.key)) is entry

    def touch(self, entry: CacheEntry, start: int, end: int) -> None:
        """Bytes [start, end) of the entry were read: its blocks are the most recently used."""
        self.bound.touch(entry, start, end)

    def evict(self) -> None:
        """Evict clean blocks until the cache is within its bound (``CacheBound.evict``)."""
        self.bound.evict()

    # ------------------------------------------------------------ a full cache disk

    def make_room(self, need: int) -> int:
        """(the loop) The cache disk refused a write of ``need`` bytes: clean blocks
        evicted, whatever the bound says (``CacheBound.make_room``); the bytes freed (0:
        nothing evictable is left). One log line for each time it frees anything."""
        freed = self.bound.make_room(need)
        if freed:
            log.info("the cache directory %s is full: evicted %d bytes of cached blocks to "
                     "make room for %d bytes", self.dir, freed, need)
        return freed

    def with_room(self, write, need: int, *, make_room=None):
        """``write()``, a write of about ``need`` bytes to the cache disk, answered; when
        the disk is full (ENOSPC, EDQUOT: an OSError, or the StoreError of a cache file)
        clean blocks are evicted to make room (``make_room``; from a worker thread: one
        that calls the loop's) and it is tried again, until nothing evictable is left:
        then its error is raised. ``write`` must be one that may be repeated."""
        make_room = make_room or self.make_room
        while True:
            try:
                return write()
            except (OSError, StoreError) as exc:
                if exc.errno not in DISK_FULL or not make_room(need):
                    raise

    def pwrite(self, fd: int, data, offset: int) -> int:
        """``os.pwrite`` into a file of the write side: all of ``data``, room made on a
        full disk (``with_room``). The bytes written: fewer (a short write) when the disk
        is full of what is never evicted after some were; raises OSError when none were."""
        try:
            n = os.pwrite(fd, data, offset)
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            n = 0
        size = len(data)
        if n == size:  # (the usual case: no more than one system call)
            return n
        view = memoryview(data)
        while n < size:
            try:
                more = self.with_room(
                    functools.partial(os.pwrite, fd, view[n:], offset + n), size - n)
            except OSError:
                if n:
                    return n  # the error comes with the next write, as on a full disk
                raise
            if not more:
                break
            n += more
        return n

    # ------------------------------------------------------------------ opens

    def hold(self, entry: CacheEntry) -> None:
        """An open handle uses the entry (never dropped until ``release``)."""
        entry.opens += 1
        if self._holds(entry):
            self.entries.move_to_end((entry.bucket, entry.key))

    def release(self, entry: CacheEntry) -> None:
        entry.opens -= 1
        if entry.opens == 0:
            if entry.present is not None and not entry.present and not entry.fetches \
                    and not entry.dirty:
                self._drop_unused(entry)
            self.evict()

    def _drop_unused(self, entry: CacheEntry) -> bool:
        """An empty clean entry nobody has open: dropped (its file goes) unless a version
        change is under way; whether it was."""
        if self._holds(entry) and (entry.bucket, entry.key) not in self._busy:
            self.drop(entry)
            return True
        return False

    def forget(self, bucket: str, key: str) -> None:
        """The object is gone: drop its entry unless it is open, dirty or being fetched."""
        entry = self.entries.get((bucket, key))
        if entry is not None and entry.opens == 0 and not entry.dirty and not entry.fetches \
                and (bucket, key) not in self._busy:
            self.drop(entry)

    def drop(self, entry: CacheEntry) -> None:
        """Out of the cache, its file deleted (open handles keep their descriptors; a dirty
        entry's record is the write side's); fetches nobody waits for stop."""
        if self._holds(entry):
            del self.entries[(entry.bucket, entry.key)]
        self.bound.forget(entry)  # (only an entry the cache holds counts)
        self.cancel(list(entry.fetches))
        _unlink(entry.path)

    # ------------------------------------------------------------ write side's files

    def own_file(self, bucket: str, key: str, *, empty: bool, held: int = 0) -> CacheEntry:
        """A new entry of ``bucket/key`` in place of the cached one, with a file of its own
        (``data/w-<id>``): empty (``empty``, or no cached content), or the cached file taken
        over (moved; copied while readers have it open or fetches write to it; ``held``:
        opens of the caller, not readers) with its ``present``/``source``. Raises StoreError
        (ENOSPC, EIO) when the cache disk refuses."""
        k = (bucket, key)
        entry = self.entries.get(k)
        path = self._own_path()
        take = not empty and entry is not None and entry.etag is not None
        try:
            if not take:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            elif entry.opens > held or entry.fetches:
                # open readers keep their version; what is copied is the caller's ``present``
                # of it: none of its blocks is evicted to make room for the copy
                pin = (0, entry.size)
                entry.pinned.append(pin)
                try:
                    self.with_room(functools.partial(shutil.copyfile, entry.path, path),
                                   entry.size if entry.present is None else entry.present.total)
                finally:
                    entry.pinned.remove(pin)
            else:
                os.rename(entry.path, path)
        except OSError as exc:
            _unlink(path)
            raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc
        new = CacheEntry(bucket, key, path)
        new.etag = ""
        if take:
            new.size = entry.size
            if entry.present is not None and not entry.present.covers(0, entry.size):
                new.present = entry.present.copy()
                new.source, new.source_len = entry.source, entry.source_len
        if entry is not None:
            self.drop(entry)  # open readers keep reading through their descriptors
        self.entries[k] = new
        self._recount(new)
        return new

    def _own_path(self) -> str:
        """A new name for a file of the write side (``data/w-<id>``)."""
        return f"{self._dir}/w-{os.urandom(8).hex()}"  # (a string: every create comes here)

    def scratch_file(self, bucket: str, key: str) -> tuple[CacheEntry, int]:
        """An empty entry of ``bucket/key`` outside the cache, and a descriptor of its file,
        which is unlinked at once: nothing of it outlives the descriptor. Raises StoreError
        (ENOSPC, EIO) when the cache disk refuses."""
        entry = CacheEntry(bucket, key, self._own_path())
        entry.etag = ""
        try:
            fd = os.open(entry.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(entry.path)
        except OSError as exc:
            _unlink(entry.path)
            raise cache_file_error(exc, f"cache file for {bucket}/{key}") from exc
        return entry, fd

    def add(self, entry: CacheEntry) -> None:
        """Take in an entry whose file is in the data directory already (a recovered one),
        in place of the cached one."""
        old = self.entries.get((entry.bucket, entry.key))
        if old is not None:
            self.drop(old)
        self.entries[(entry.bucket, entry.key)] = entry
        self._recount(entry)
        if not entry.dirty:
            self._as_blocks(entry)

    def pin(self, entry: CacheEntry, pin: tuple[int, int]) -> None:
        """Bytes ``pin`` of ``entry`` are never evicted until ``unpin``."""
        entry.pinned.append(pin)

    def unpin(self, entry: CacheEntry, pin: tuple[int, int]) -> None:
        try:
            entry.pinned.remove(pin)
        except ValueError:
            pass

    def resize(self, entry: CacheEntry, size: int) -> None:
        """A dirty entry is ``size`` bytes now. One that grew counts toward the bound and
        the free-space floor at once: clean blocks make way before the disk is full."""
        grew = size > entry.size
        entry.size = size
        self._recount(entry)
        if grew:
            self.evict()

    def _recount(self, entry: CacheEntry) -> None:
        """What the entry adds to ``bytes``: a dirty (or complete) one its size, a clean one
        its present bytes."""
        if not self._holds(entry):
            return
        self.bound.recount(entry, entry.size if entry.dirty or entry.present is None
                           else entry.present.total)

    async def current(self, store, bucket: str, key: str, *, etag: str, ttl: float,
                      once: bool = False) -> dict | None:
        """Whether ``etag`` is still ``bucket/key``'s version: None when the cached copy of
        it was validated within ``ttl`` (trusted) or S3 says so (the copy is then validated
        again), else what S3 has (``{"etag", "size", "mtime", "metadata"}``). One round
        trip: a conditional GET of the first block (If-None-Match ``etag``; ``revalidations``
        counts them) — 304 confirms; another version's answer brings its first block
        along, and the cache holds it as that version's new entry (``_took_first_block``),
        so that the open that follows reads it without a request. ``once``: S3 asked in one
        try (the caller has an answer of its own when it cannot be asked). Raises
        StoreError."""
        entry = self.entries.get((bucket, key))
        now = trio.current_time()
        if entry is not None and entry.etag == etag and (entry.dirty or now - entry.validated < ttl):
            return None
        self.revalidations += 1
        got = await store.get_if_changed(bucket, key, 0, self.block_size, etag=etag, once=once)
        if got is not None and got["etag"] != etag:
            self._took_first_block(bucket, key, got)
            return {k: got[k] for k in ("etag", "size", "mtime", "metadata")}
        entry = self.entries.get((bucket, key))
        if entry is not None and entry.etag == etag:
            entry.validated = trio.current_time()
        return None

    def _took_first_block(self, bucket: str, key: str, got: dict) -> None:
        """S3 answered a revalidation with another version and its first bytes: they become
        that version's entry (validated now) in place of the cached one — unless the key's
        entry is being changed meanwhile (a version change under way, a writer, another
        fetch took that version already). Best effort: without it the first read GETs them."""
        k = (bucket, key)
        entry = self.entries.get(k)
        if k in self._busy or (entry is not None and (
                entry.dirty or entry.writers or entry.etag == got["etag"])):
            return
        try:
            new = self._new_version(bucket, key, got["etag"], got["size"])
        except StoreError:
            return
        self._fill_first(new, got)

    def _fill_first(self, new: CacheEntry, got: dict) -> None:
        """The bytes a conditional GET brought (``get_if_changed``) into ``new``, the new
        entry of the version it answered with."""
        bucket, key = new.bucket, new.key
        data, start, size = got["data"], got["start"], new.size
        if not data or start != 0:
            return
        data = data[:size]
        fd = None
        try:
            fd = os.open(new.path, os.O_WRONLY)
            self.with_room(functools.partial(pwrite_all, fd, 0, memoryview(data)), len(data))
        except (OSError, StoreError) as exc:
            log.info("%s/%s: keeping the first bytes of version %s: %s", bucket, key,
                     got["etag"], exc)
            return
        finally:
            if fd is not None:
                os.close(fd)
        self.got += len(data)
        self._add_present(new, 0, len(data))
        self.evict()

    def validated(self, entry: CacheEntry, etag: str) -> None:
        """The entry's content is object version ``etag`` in S3 now (it was uploaded): a
        clean entry whose blocks may be evicted and fetched again from that version."""
        entry.etag = etag
        entry.validated = trio.current_time()
        if not entry.dirty:
            entry.source, entry.source_len = (entry.bucket, entry.key, etag), entry.size
            self._as_blocks(entry)
        self.evict()

    def _as_blocks(self, entry: CacheEntry) -> None:
        """A clean entry's bytes as blocks in the LRU (evictable one by one)."""
        if entry.present is None:
            entry.present = RangeSet([(0, entry.size)])
        entry.present.truncate(entry.size)
        if self._holds(entry):
            self.bound.forget(entry)
            for start, end in list(entry.present):
                entry.present.remove(start, end)
                self._add_present(entry, start, end)

    def rekey(self, entry: CacheEntry, bucket: str, key: str) -> None:
        """The entry now belongs to ``bucket/key`` (a rename); an entry there is dropped
        (a dirty one is the write side's to discard first: its journal record). A clean
        entry's missing bytes come from the new key (the same version, copied there)."""
        if self._holds(entry):
            del self.entries[(entry.bucket, entry.key)]
        old = self.entries.get((bucket, key))
        if old is not None and old is not entry:
            self.drop(old)
        if not entry.dirty and entry.source is not None:
            entry.source = (bucket, key, entry.source[2])
        entry.bucket, entry.key = bucket, key
        self.entries[(bucket, key)] = entry


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def pwrite_all(fd: int, offset: int, data) -> None:
    """All of ``data`` at ``offset`` (a short write: the rest, or the error)."""
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
