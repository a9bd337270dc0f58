"""Dirty files: the write side's state of cache entries, changed here and nowhere else.

A file opened for writing is a *dirty* cache entry: a local file of its own
(``data/w-<id>``, independent of the key, so renames only re-key it and no download can
ever land on it; see ``DataCache.own_file``). Every dirty entry that holds a byte S3 does
not have has a journal record ``journal/w-<id>.json`` (bucket, key, and ``meta``: view,
``base`` — the ETag of the version it was based on, "" when the object did not exist —
existing, tags, untag, since, and ``conflict`` for a conflict copy). It is written with
tmp + rename before the first byte that differs from S3 is accepted (a write, a truncate)
and when the upload is left to the background (``persist``: an eager close; not fsync'd),
and removed when the upload succeeded: a mount that was SIGKILLed loses nothing it had
accepted (a kernel or machine crash may lose the last ones); the next mount of its cache directory takes the records over
(``restore``). Records of older versions have no ``base``: their upload checks with a HEAD.

An entry's write-side state (``CacheEntry``):

``dirty``      its content is this mount's, not (yet) an object in S3; never evicted
``meta``       the journal record (None when clean); ``journaled``: it is on disk
``gen``        bumped by every write and truncate: an upload that read the file before
               a write leaves the entry dirty, to be uploaded again
``writers``    handles open for writing (the last one's close uploads)

Transitions: ``take`` (clean -> dirty, not journaled: a created, never written file is
journaled lazily), ``journal``, ``written`` / ``truncate``, ``uploaded`` (dirty ->
clean), ``redirty`` (written again through a handle still open after an upload),
``update_record`` (tags set while dirty, a rename's view), ``rekey`` (a rename),
``discard`` (unlinked or replaced: gone).
"""
from __future__ import annotations

import os
import time

from ..datacache import CacheEntry, DataCache
from ..errors import cache_file_error


class DirtyFiles:
    def __init__(self, cache: DataCache):
        self.cache = cache

    def entries(self) -> list[CacheEntry]:
        return [e for e in self.cache.entries.values() if e.dirty]

    def _record(self, entry: CacheEntry, *, view: str, base: str) -> dict:
        return {"file": os.path.basename(entry.path), "view": view, "base": base,
                "existing": bool(base), "tags": {}, "untag": [], "since": time.time()}

    def take(self, bucket: str, key: str, *, view: str, base: str, truncate: bool,
             held: int = 0) -> CacheEntry:
        """The dirty entry of ``bucket/key``: the one there is (emptied when ``truncate``),
        else a new file of its own, empty (``truncate``) or with the cached content (see
        ``DataCache.own_file``; ``held``: the caller's opens of the cached entry). Raises
        StoreError (ENOSPC, EIO) when the cache disk refuses."""
        entry = self.cache.get(bucket, key)
        if entry is not None and entry.dirty:
            if truncate and entry.size:
                self.truncate(entry, 0)
            for field, value in self._record(entry, view=view, base=base).items():
                entry.meta.setdefault(field, value)
            return entry
        entry = self.cache.own_file(bucket, key, empty=truncate, held=held)
        entry.dirty = True
        entry.meta = self._record(entry, view=view, base=base)
        return entry

    def journal(self, entry: CacheEntry) -> None:
        """Make sure the dirty entry's record is on disk: before the first byte that differs
        from S3 is accepted (a write, a truncate) and when an upload failed."""
        if not entry.journaled and entry.meta is not None:
            self._write(entry)

    def _write(self, entry: CacheEntry) -> None:
        r = entry.meta
        r["bucket"], r["key"] = entry.bucket, entry.key
        self.cache.write_record(r)
        entry.journaled = True  # only once it is on disk: a failed write is tried again

    def persist(self, entry: CacheEntry) -> None:
        """Eager close: the record on disk before close returns — written here, on the loop,
        only when it is not there yet (every change of a journaled record rewrites it). Not
        fsync'd: the page cache outlives a killed process; only a kernel or machine crash
        can lose the last eager closes (``fsync(2)`` waits for the upload). Raises
        StoreError."""
        if entry.dirty and entry.meta is not None:
            self.journal(entry)

    def _unjournal(self, entry: CacheEntry) -> None:
        if entry.meta is not None:
            if entry.journaled:
                self.cache.remove_record(entry.meta)
            entry.meta = None
            entry.journaled = False

    def add_writer(self, entry: CacheEntry) -> None:
        """A handle opened for writing (it holds the entry open too)."""
        self.cache.hold(entry)
        entry.writers += 1

    def drop_writer(self, entry: CacheEntry) -> None:
        """A writing handle was released (its ``cache.release`` follows)."""
        entry.writers -= 1

    def written(self, entry: CacheEntry, end: int) -> None:
        """Bytes up to ``end`` were written to the entry's file."""
        if end > entry.size:
            self.cache.resize(entry, end)
        entry.gen += 1

    def truncate(self, entry: CacheEntry, size: int) -> None:
        self.journal(entry)
        try:
            os.truncate(entry.path, size)
        except OSError as exc:
            raise cache_file_error(exc, f"cache file for {entry.bucket}/{entry.key}") from exc
        self.cache.resize(entry, size)
        entry.gen += 1

    def redirty(self, entry: CacheEntry, view: str) -> None:
        """An entry cleaned by an upload is written again through a handle still open: based
        on the version it uploaded."""
        entry.dirty = True
        entry.meta = self._record(entry, view=view, base=entry.etag or "")
        self._write(entry)

    def update_record(self, entry: CacheEntry, **changes) -> None:
        """Change the record (``view``, ``base``, ``tags``, ``untag``, ``conflict``) of a
        dirty entry."""
        entry.meta.update(changes)
        if "base" in changes:
            entry.meta["existing"] = bool(changes["base"])
        if entry.journaled:
            self._write(entry)

    def uploaded(self, entry: CacheEntry, etag: str) -> None:
        """The entry's content is now object ``etag`` in S3: no longer dirty."""
        entry.dirty = False
        self._unjournal(entry)
        self.cache.validated(entry, etag)

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
        entry.dirty = False
        self._unjournal(entry)
        self.cache.drop(entry)

    def restore(self) -> list[CacheEntry]:
        """The dirty entries an earlier mount of this cache directory journaled (the
        records ``DataCache`` found at its start): in the cache again, to be uploaded."""
        records, self.cache.recovered = self.cache.recovered, []
        restored = []
        for r in records:
            entry = CacheEntry(r["bucket"], r["key"], str(self.cache.dir / r["file"]))
            entry.etag = ""
            entry.size = os.stat(entry.path).st_size
            entry.dirty = True
            entry.meta = r
            entry.journaled = True
            old = self.cache.get(entry.bucket, entry.key)
            if old is not None and old.dirty:  # two records for one key: the later one wins
                self.discard(old)
            self.cache.add(entry)
            restored.append(entry)
        return [e for e in restored if e.dirty]
