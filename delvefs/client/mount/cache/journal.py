"""The journal of a mount's cache directory: one record per dirty file, and the ownership of
cache directories.

A dirty file's record (``<cache-dir>/journal/<file>.json``, written by
``delvefs.client.mount.fs.written``) names its data file under ``<cache-dir>/data``, its bucket,
key and the version it is based on. A file's first record is created and written by one
write(2) (an eager untar journals every file: a tmp file and a rename cost several times
that); a record written again replaces the old one by tmp + rename (never half a record).
Not fsync'd: they outlive the process, not a kernel crash — but an fsync(2) of an eager
mount with ``fsync=journal`` makes one record durable (``make_durable``: the record file
and the journal directory fsync'd, and once per mount the cache directory's own entries).
A record whose data file is missing, or that cannot be parsed (empty: its mount died
between creating and writing it, before any byte of its file was accepted), is dropped
with a warning when the journal is read; a ``.tmp`` left by a mount that died while
writing one is removed.

Records of uploaded files are removed by a worker thread in batches (``run_removals``):
the upload path need not wait for an unlink. A record written again before its removal
ran is spared.

``claim`` and ``adopt_orphans``: a mount holds its cache directory with an exclusive
``flock`` for its life; a later mount of the same views file by the same user takes over
the journal of a directory no live mount holds, so dirty files survive a remount at
another mount point.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from pathlib import Path

import orjson
import trio

from ..errors import cache_file_error

log = logging.getLogger(__name__)


class Journal:
    """The records of ``directory`` (their data files are in ``data_dir``). ``os.fspath``
    of a journal is its directory."""

    def __init__(self, directory: str | os.PathLike, data_dir: str | os.PathLike):
        self.dir = Path(directory)
        self._dir = str(self.dir)
        self.data_dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._seq = itertools.count()
        self._doomed: set[str] = set()
        self._doomed_lock = threading.Lock()
        self._doomed_kick: trio.Event | None = None  # set while ``run_removals`` runs
        self._removing = False
        self._settled = False  # ``make_durable``: the cache directory's entries fsync'd

    def __fspath__(self) -> str:
        return str(self.dir)

    def read(self) -> list[dict]:
        """The usable records, oldest first (unusable ones are dropped)."""
        def usable(r: dict) -> None:
            if not (self.data_dir / r["file"]).is_file():
                raise ValueError("data file missing")
        return _read_records(self.dir, usable, "journal")

    def write(self, record: dict, *, unless_same: bool = False) -> None:
        """Put a dirty file's record on disk (``unless_same``: not when the file holds
        exactly this record already). Raises StoreError (the cache disk refused)."""
        name = record["file"] + ".json"
        final = f"{self._dir}/{name}"  # (strings, not Path: every eager close comes here)
        doomed = False
        if self._doomed:  # (only the loop adds to it) written again before its removal
            with self._doomed_lock:
                doomed = name in self._doomed
                self._doomed.discard(name)
        try:
            data = orjson.dumps(record)
        except TypeError:  # a name of bytes that are no UTF-8 (surrogate-escaped): escaped
            data = json.dumps(record).encode()
        if unless_same:
            try:
                with open(final, "rb") as f:
                    if f.read() == data:
                        return
            except OSError:
                pass  # not there (or unreadable): written
        tmp = None
        try:
            try:
                fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # written again: replaced whole
                tmp = f"{final}{_TMP_TAG}{next(self._seq)}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
            if tmp is not None:
                os.replace(tmp, final)
        except OSError as exc:
            _unlink(tmp if tmp is not None else final)
            if doomed:  # the old record is still there: still to be removed
                with self._doomed_lock:
                    self._doomed.add(name)
            raise cache_file_error(exc, f"journal of {record['bucket']}/{record['key']}") from exc

    def make_durable(self, record: dict) -> None:
        """Blocking (a worker thread): the record as written last (``write``) durable on
        the local disk — its file fsync'd, then the journal directory (the record's entry:
        a new record is a new name, a rewritten one a rename). The first call of a mount
        also makes the cache directory's own entries durable (the journal and data
        directories, ``owner.json`` by which a mount elsewhere takes the journal over).
        A record removed meanwhile (its file was uploaded) needs nothing. Raises OSError."""
        final = f"{self._dir}/{record['file']}.json"
        for _ in range(3):  # a rewrite (tmp + rename) between the two fsyncs: its file too
            try:
                fd = os.open(final, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                ino = None
            else:
                try:
                    os.fsync(fd)
                    ino = os.fstat(fd).st_ino
                finally:
                    os.close(fd)
            sync_path(self._dir)
            try:
                if os.stat(final).st_ino == ino:
                    break
            except FileNotFoundError:
                if ino is None:
                    break
        if not self._settled:
            cache_dir = self.dir.parent
            for path in (cache_dir / OWNER, cache_dir, cache_dir.parent):
                try:
                    sync_path(path)
                except FileNotFoundError:
                    pass  # (no owner.json: a cache directory of tests)
            self._settled = True

    def remove(self, record: dict, *, at_once: bool = False) -> None:
        """Drop a record: at once, or (``run_removals`` running, unless ``at_once``: a record
        that must not outlive the call) soon, by a worker thread."""
        name = record["file"] + ".json"
        if self._doomed_kick is None or at_once:
            _unlink(f"{self._dir}/{name}")
            return
        with self._doomed_lock:
            self._doomed.add(name)
        self._doomed_kick.set()

    def remove_doomed(self) -> None:
        """Blocking: unlink the records ``remove`` left to the background. One at a time
        under the lock: a record written again meanwhile (``write``) is spared."""
        while True:
            with self._doomed_lock:
                if not self._doomed:
                    return
                _unlink(self.dir / self._doomed.pop())

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


class PublishJournal:
    """Directory publishes under way (``<cache-dir>/publish/<batch>.json``): written before
    the first object of a renamed directory is copied or uploaded, removed once its manifest
    is written (delvefs.client.mount.fs.publisher). A mount finishes the ones an earlier mount left
    (after a crash: the objects are in S3, held back from every view, until the manifest).
    Written with tmp + rename, like the dirty files' records."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict]:
        """The records, oldest first (unusable ones are dropped with a warning)."""
        def usable(r: dict) -> None:
            r["batch"], r["bucket"], r["moves"], r["manifest"]  # noqa: B018 — the fields it must have
        return _read_records(self.dir, usable, "publish")

    def write(self, record: dict) -> None:
        """Blocking. Raises StoreError (the cache disk refused)."""
        final = self.dir / (record["batch"] + ".json")
        tmp = final.with_suffix(f"{_TMP_TAG}tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, final)
        except OSError as exc:
            _unlink(tmp)
            raise cache_file_error(exc, f"publish record of {record['bucket']}/{record['manifest']}") from exc

    def remove(self, record: dict) -> None:
        """Blocking."""
        _unlink(self.dir / (record["batch"] + ".json"))


def _read_records(directory: Path, usable, what: str) -> list[dict]:
    """The JSON records of ``directory``, oldest first. A record ``usable(record)`` refuses
    (ValueError, KeyError, TypeError) or that cannot be parsed is dropped with a warning; a
    ``.tmp`` left by a mount that died while writing one is removed (never one this process
    is writing: its name has the process's tag)."""
    records = []
    for p in _oldest_first(directory):
        if not p.name.endswith(".json"):
            if _TMP_TAG not in p.name:
                _unlink(p)  # a record being written when its mount died
            continue
        try:
            r = json.loads(p.read_text())
            usable(r)
            records.append(r)
        except FileNotFoundError:
            continue  # removed meanwhile (its file was uploaded, its batch published)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s record %s unusable (%s): dropped", what, p.name, exc)
            _unlink(p)
    return records


def _oldest_first(directory: Path) -> list[Path]:
    """The files of ``directory`` by modification time (those removed meanwhile left out)."""
    dated = []
    for p in directory.iterdir() if directory.is_dir() else ():
        try:
            dated.append((p.stat().st_mtime_ns, p))
        except FileNotFoundError:
            pass
    return [p for _, p in sorted(dated)]


# in the names of this process's tmp files: a journal read (at start, by a background
# task) leaves the ones being written now alone
_TMP_TAG = f".p{os.getpid()}."


def sync_path(path: str | os.PathLike, *, data_only: bool = False) -> None:
    """Blocking: fsync (``data_only``: fdatasync) the file or directory at ``path``.
    Raises OSError (FileNotFoundError: it is gone)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if data_only:
            os.fdatasync(fd)
        else:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _unlink(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass



# ------------------------------------------------------------ cache directories of mounts

LOCK = "lock"
OWNER = "owner.json"
PUBLISH = "publish"  # the PublishJournal's directory in a cache directory


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
            if d.resolve() == here or not any(
                    x.is_dir() and any(x.iterdir()) for x in (journal, d / PUBLISH)):
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
            for p in _oldest_first(journal):
                if not p.name.endswith(".json"):
                    continue
                try:
                    r = json.loads(p.read_text())
                    data = d / "data" / r["file"]
                    if data.is_file():  # data first: a record is never without its file
                        os.rename(data, here / "data" / r["file"])
                    ranges = d / "data" / (r["file"] + ".ranges")
                    if ranges.is_file():  # a sparse dirty file's ranges log, also before it
                        os.rename(ranges, here / "data" / ranges.name)
                    os.rename(p, here / "journal" / p.name)
                    moved += 1
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("journal record %s of %s not taken over: %s", p.name, d, exc)
            publish = d / PUBLISH
            for p in sorted(publish.iterdir()) if publish.is_dir() else ():
                if p.name.endswith(".json"):  # a publish under way: finished by this mount
                    try:
                        (here / PUBLISH).mkdir(parents=True, exist_ok=True)
                        os.rename(p, here / PUBLISH / p.name)
                        moved += 1
                    except OSError as exc:
                        log.warning("publish record %s of %s not taken over: %s", p.name, d, exc)
            if moved:
                log.info("took over %d dirty files from the journal of %s (an earlier mount of "
                         "%s)", moved, d, want["views"])
                adopted.append(str(d))
        finally:
            os.close(fd)
    return adopted
