"""The handler's LevelDB (plyvel): the only module that imports plyvel. It opens the
database, hands out WriteBatches and iterates key ranges; what the keys and values are
(the schema, its invariants, every record's encoding) is records.py.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
from collections.abc import Iterator

import plyvel

from . import records as r

# LevelDB could not write or read (disk full, I/O error, corruption): the caller's batch is
# not committed; nothing about the events that were in it is wrong
StorageError = plyvel.Error

log = logging.getLogger("delvefs.eventhandler.store")


class Store:
    """An open LevelDB. Thread-safe for reads; writers serialise themselves (engine lock)."""

    def __init__(self, path: str):
        self.path = path
        self.db = plyvel.DB(path, create_if_missing=True, write_buffer_size=32 << 20,
                            lru_cache_size=64 << 20, max_open_files=500)
        raw = self.db.get(r.SCHEMA_KEY)
        schema = r.SCHEMA if raw is None else r.unpackb(raw)
        if schema == 1:
            self._build_member_index()
        elif schema != r.SCHEMA:
            raise RuntimeError(f"{path}: state schema {schema} is not {r.SCHEMA}; "
                               "remove the state directory to start afresh")
        if schema != r.SCHEMA or raw is None:
            self.db.put(r.SCHEMA_KEY, r.pack_schema(r.SCHEMA))

    def _build_member_index(self) -> None:
        """Schema 1 → 2: file every object that matches a view in the membership index."""
        log.info("%s: building the membership index (state schema 1 -> 2)", self.path)
        wb = self.db.write_batch()
        n = 0
        for k, v in self.db.iterator(prefix=r.OBJECT_PREFIX):
            rec = r.unpackb(v)
            if r.slot_bits(rec):
                bucket, key = r.split_obj_key(k)
                wb.put(r.k_member(bucket, r.slot_bits(rec), key), r.pack_member(rec))
                n += 1
                if n % 10_000 == 0:
                    wb.write()
                    wb = self.db.write_batch()
        wb.write()
        log.info("%s: membership index built: %d objects filed", self.path, n)

    def close(self) -> None:
        if not self.db.closed:
            self.db.close()

    # writes
    def batch(self):
        """A plyvel WriteBatch: .put(k, v) / .delete(k); commit with write(batch)."""
        return self.db.write_batch()

    @staticmethod
    def write(batch) -> None:
        batch.write()

    def delete_bucket(self, bucket: str, chunk: int = 10000) -> int:
        """Delete one bucket's records, ``chunk`` keys per write; returns how many."""
        n = 0
        for prefix in r.bucket_prefixes(bucket):
            while True:
                with self.db.iterator(start=prefix, stop=_prefix_end(prefix), include_value=False) as it:
                    keys = list(itertools.islice(it, chunk))
                if not keys:
                    break
                with self.db.write_batch() as wb:
                    for k in keys:
                        wb.delete(k)
                n += len(keys)
        self.db.delete(r.k_bucket(bucket))
        return n

    # reads
    def get_object(self, bucket: str, key: str) -> list | None:
        raw = self.db.get(r.k_obj(bucket, key))
        return None if raw is None else r.unpackb(raw)

    def get_raw(self, k: bytes) -> bytes | None:
        return self.db.get(k)

    def iter_objects(self, bucket: str, after: str | None = None,
                     upto: str | None = None) -> Iterator[tuple[str, list]]:
        """(key, record) of a bucket in key order: after < key <= upto."""
        prefix = r.obj_prefix(bucket)
        n = len(prefix)
        start = prefix + after.encode() if after is not None else prefix
        stop = prefix + upto.encode() if upto is not None else None
        it = self.db.iterator(start=start, stop=stop, include_stop=True,
                              include_start=after is None) if stop is not None else \
            self.db.iterator(start=start, include_start=after is None, stop=_prefix_end(prefix))
        with it:
            for k, v in it:
                yield k[n:].decode(), r.unpackb(v)

    def member_groups(self, bucket: str) -> list[bytes]:
        """The bitmaps of the non-empty membership groups of ``bucket``: one seek per group."""
        prefix = r.member_prefix(bucket)
        n = len(prefix)
        groups = []
        with self.db.iterator(start=prefix, stop=_prefix_end(prefix), include_value=False) as it:
            for k in it:
                group, end = r.member_group_at(k, n)
                groups.append(group)
                it.seek(_prefix_end(k[:end]))
        return groups

    def iter_members(self, bucket: str, groups, after: str | None = None) -> Iterator[tuple[str, list]]:
        """(key, [size, mtime, etag]) of the members of the given groups, key > after, in key
        order (a merge of one ordered range per group)."""
        with contextlib.ExitStack() as stack:
            ranges = []
            for g in groups:
                gp = r.member_group_prefix(bucket, g)
                it = stack.enter_context(self.db.iterator(
                    start=gp + after.encode() if after is not None else gp,
                    include_start=after is None, stop=_prefix_end(gp)))
                ranges.append(_members(it, len(gp)))
            for key, raw in heapq.merge(*ranges) if len(ranges) > 1 else ranges[0] if ranges else ():
                yield key.decode(), r.unpackb(raw)

    def iter_changes(self, bucket: str, since: int) -> Iterator[tuple[int, list]]:
        prefix = r.change_prefix(bucket)
        n = len(prefix)
        with self.db.iterator(start=prefix + r.pack_version(since + 1), stop=_prefix_end(prefix)) as it:
            for k, v in it:
                yield r.version_at(k, n), r.unpackb(v)

    def iter_held(self, bucket: str, limit: int) -> list[tuple[bytes, list]]:
        """Up to ``limit`` (LevelDB key, event fields) held for ``bucket``, oldest first."""
        out = []
        with self.db.iterator(prefix=r.held_prefix(bucket)) as it:
            for k, v in it:
                out.append((k, r.unpackb(v)))
                if len(out) >= limit:
                    break
        return out

    def last_held(self, bucket: str) -> int:
        """The counter of the newest held event of ``bucket`` (0 if none)."""
        with self.db.iterator(prefix=r.held_prefix(bucket), reverse=True, include_value=False) as it:
            k = next(it, None)
        return 0 if k is None else r.held_counter(k)

    def load_views(self) -> list[dict]:
        return sorted((r.unpack_view(v) for _, v in self.db.iterator(prefix=r.VIEW_PREFIX)),
                      key=lambda d: d["slot"])

    def load_freeing(self) -> dict[int, str]:
        """{slot: bucket} of forgotten views whose bits are still being cleared."""
        return {r.freeing_slot(k): r.unpackb(v) for k, v in self.db.iterator(prefix=r.FREEING_PREFIX)}

    def view_log(self, after: int = 0) -> list[dict]:
        """The registration log's entries after counter ``after``, oldest first."""
        with self.db.iterator(start=r.k_view_log(after + 1), stop=_prefix_end(r.VIEW_LOG_PREFIX)) as it:
            return [r.unpackb(v) for _k, v in it]

    def last_view_log(self) -> int:
        """The counter of the newest registration log entry (0 if none)."""
        with self.db.iterator(prefix=r.VIEW_LOG_PREFIX, reverse=True, include_value=False) as it:
            k = next(it, None)
        return 0 if k is None else r.version_at(k, 1)

    def load_buckets(self) -> dict[str, dict]:
        return {r.bucket_of_key(k): r.unpack_bucket(v) for k, v in self.db.iterator(prefix=r.BUCKET_PREFIX)}

    def load_batches(self) -> dict[tuple[str, str], dict]:
        """{(bucket, batch): record} of the published batches not past their deadline's sweep."""
        return {r.split_batch_key(k): r.unpackb(v) for k, v in self.db.iterator(prefix=r.BATCH_PREFIX)}

    def held_members(self, bucket: str, batch: str) -> list[tuple[str, list]]:
        """(key, [seq, etag]) of the objects held for a batch, in key order."""
        prefix = r.held_member_prefix(bucket, batch)
        n = len(prefix)
        with self.db.iterator(prefix=prefix) as it:
            return [(k[n:].decode(), r.unpackb(v)) for k, v in it]

    def has_pending_tags(self, bucket: str) -> bool:
        with self.db.iterator(prefix=r.tagwait_prefix(bucket.encode()), include_value=False) as it:
            return next(it, None) is not None

    def pending_tags(self, bucket: bytes | None = None) -> Iterator[tuple[str, str, int]]:
        """(bucket, key, seq) of owed tag fetches (of one bucket when given, UTF-8)."""
        for k, v in self.db.iterator(prefix=r.tagwait_prefix(bucket)):
            b, key = r.split_obj_key(k)
            yield b, key, r.unpackb(v)

    def load_groups(self) -> list[dict]:
        """The work-queue groups' records (``G``)."""
        return [r.unpackb(v) for _k, v in self.db.iterator(prefix=r.GROUP_PREFIX)]

    def iter_work(self, vid: str, name: str) -> Iterator[tuple[str, list]]:
        """(key, record) of every file of a group (``W``), in key order."""
        prefix = r.work_prefix(vid, name)
        n = len(prefix)
        with self.db.iterator(prefix=prefix) as it:
            for k, v in it:
                yield k[n:].decode(), r.unpackb(v)

    def get_work(self, vid: str, name: str, key: str) -> list | None:
        raw = self.db.get(r.k_work(vid, name, key))
        return None if raw is None else r.unpackb(raw)


def _members(it, n: int):
    # keys stay bytes until merged: UTF-8 byte order is code point order
    for k, v in it:
        yield k[n:], v


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with prefix."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    p[-1] += 1
    return bytes(p)
