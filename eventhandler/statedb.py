"""The handler's LevelDB (plyvel): the only module that imports plyvel; it owns the key layout.

Schema (every key starts with a one-byte prefix; ``vid`` = a view id's 8 raw bytes, i.e.
``bytes.fromhex(view_id)``; ``bucket`` and ``key`` are UTF-8; ``\\0`` separates a bucket
name, which never contains NUL, from what follows; ``v`` is an 8-byte big-endian unsigned
version so that byte order is numeric order). Values are msgpack.

=====================  ==========================================================  ==========
key                    value                                                       writers
=====================  ==========================================================  ==========
``S`` "schema"         int SCHEMA                                                  open()
``V`` vid              {"id", "slot", "spec", "names": [..], "floor", "ready",     register
                        "created"}: one registered view (filter spec, its slot =
                        its index in the matcher, the first version whose change
                        log is complete for it)
``B`` bucket           {"state": "scanning"|"ready", "version", "tags": bool,      scan,
                        "scanned": epoch, "purged"}: a tracked bucket (some view     batches,
                        names it); ``version`` = last change-log version of the     compact
                        bucket; change entries <= ``purged`` may have been
                        compacted away (older ``since`` values must resync)
``o`` bucket\\0key      [seq, size, mtime, etag, tags|None, metadata, slots, ever,  batches
                        lv, flags]: object metadata (OBJ_* indices below)
``c`` bucket\\0 v       [key, deleted, slots, ever|None (= slots), size, mtime,     batches
                        etag]: change log of the bucket, shared by all its views
``m`` bucket\\0 g key   [size, mtime, etag]: the membership index — one entry per    batches
                        object that matches at least one view, filed under its
                        ``slots`` bitmap g (prefixed with its 2-byte big-endian
                        length): every member of a view lies in the groups g
                        that hold its slot
``T`` bucket\\0key      int seq: a GetObjectTagging for version seq is pending      batches
``E`` bucket\\0 n       [kind, key, seq, size, etag, mtime, metadata, name]: an      consumer
                       event of a bucket whose first scan is running, held until
                       the scan ends (n: 8-byte big-endian arrival counter)
=====================  ==========================================================  ==========

Invariants (each WriteBatch keeps them, so they hold after any crash):

- ``o`` holds only keys of tracked buckets (events of other buckets are dropped unread, as
  in the paper: their metadata would cost writes for nobody). ``tags``/``metadata`` of None
  mean "not known" (tags are fetched only for buckets where a view has property rules; a
  listing carries no metadata), ``{}`` means known to be empty. ``seq`` (the S3 sequencer as int) never
  decreases for a key; a removed key is kept as a tombstone (``flags & DELETED``, the
  remove's seq) so that a late or replayed older create cannot resurrect it — until a
  reconcile compacts tombstones older than the horizon (``Engine.compact``), together with
  their change entries. Tagging events
  carry the sequencer of the version they tag: equal seq + tagging = fetch tags again.
- ``slots`` = the set of slots of the views the object matches, as a little-endian bitmap
  (bytes; bit i = slot i; b"" for tombstones; never changed while ``flags & TAGS_PENDING``);
  ``ever`` = bitmap union of all slots the key was in since it was first seen (so a change
  entry can tell a view "this key left you"). Slots are never reused (views are not removed).
- ``m bucket\\0 g key`` exists iff the ``o`` record of key has ``slots`` == g != b"", and
  holds that record's size, mtime and etag. A view's listing merges, in key order, the
  groups whose bitmap holds its slot: it reads its members and nothing else, however big
  the bucket. The index is grouped by the whole bitmap rather than kept per view so that
  an event costs O(1) writes however many views match (one put when a member changes,
  plus one delete when its set of views changes); the number of distinct groups is the
  number of distinct combinations of views objects fall in (see docs/PERFORMANCE.md).
- ``lv`` = version of the key's one change-log entry (0 = none): the log holds at most one
  entry per key (the newest); writing a new entry deletes ``c bucket v=lv``. Entry versions
  are the bucket's ``version`` counter, strictly increasing, starting at the epoch time in
  microseconds when the bucket became tracked (so versions from a wiped state are rejected).
- A view's change for an entry: put when its slot is in ``slots``; delete when it is only
  in ``ever``; none otherwise.
- ``T`` exists iff the object has ``TAGS_PENDING`` (a fetch is owed after a restart).
- ``E`` records exist only for buckets in state "scanning"; each is written before the
  AMQP ack of its message and deleted in the WriteBatch that applies it (so memory stays
  bounded however long a scan takes, and a crash loses none of them).

Writes are WriteBatches with sync=False: they survive a killed process (the OS has the
log), not a power cut; AMQP acks are sent only after the batch is written.
"""
from __future__ import annotations

import contextlib
import heapq
import logging
import struct
from collections.abc import Iterator

import msgpack
import plyvel

# LevelDB could not write or read (disk full, I/O error, corruption): the caller's batch is
# not committed; nothing about the events that were in it is wrong
StorageError = plyvel.Error

SCHEMA = 2  # 2: the membership index (``m``), built from ``o`` when a schema-1 state is opened

# object record fields
OBJ_SEQ, OBJ_SIZE, OBJ_MTIME, OBJ_ETAG, OBJ_TAGS, OBJ_META, OBJ_SLOTS, OBJ_EVER, OBJ_LV, OBJ_FLAGS = range(10)
DELETED = 1
TAGS_PENDING = 2

# change entry fields
CH_KEY, CH_DELETED, CH_SLOTS, CH_EVER, CH_SIZE, CH_MTIME, CH_ETAG = range(7)

log = logging.getLogger("delvefs.eventhandler.store")

_V = struct.Struct(">Q")
_G = struct.Struct(">H")  # length of a membership group's bitmap
packb = msgpack.Packer(use_bin_type=True).pack


def unpackb(data: bytes):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# ---- key encoding (pure; unit-tested) --------------------------------------------------

def k_view(vid: str) -> bytes:
    return b"V" + bytes.fromhex(vid)


def k_bucket(bucket: str) -> bytes:
    return b"B" + bucket.encode()


def k_obj(bucket: str, key: str) -> bytes:
    return b"o" + bucket.encode() + b"\0" + key.encode()


def obj_prefix(bucket: str) -> bytes:
    return b"o" + bucket.encode() + b"\0"


def split_obj_key(k: bytes) -> tuple[str, str]:
    b, _, key = k[1:].partition(b"\0")
    return b.decode(), key.decode()


def member_prefix(bucket: str) -> bytes:
    return b"m" + bucket.encode() + b"\0"


def member_group_prefix(bucket: str, slots: bytes) -> bytes:
    return member_prefix(bucket) + _G.pack(len(slots)) + slots


def k_member(bucket: str, slots: bytes, key: str) -> bytes:
    return member_group_prefix(bucket, slots) + key.encode()


def k_change(bucket: str, v: int) -> bytes:
    return b"c" + bucket.encode() + b"\0" + _V.pack(v)


pack_version = _V.pack


def change_prefix(bucket: str) -> bytes:
    return b"c" + bucket.encode() + b"\0"


def k_tagwait(bucket: str, key: str) -> bytes:
    return b"T" + bucket.encode() + b"\0" + key.encode()


def held_prefix(bucket: str) -> bytes:
    return b"E" + bucket.encode() + b"\0"


def k_held(bucket: str, n: int) -> bytes:
    return held_prefix(bucket) + _V.pack(n)


def new_object(seq, size, mtime, etag, tags, metadata) -> list:
    return [seq, size, mtime, etag, tags, metadata, b"", b"", 0, 0]


# ---- slot sets: little-endian bitmaps (bit i = the view with slot i) ----------------------

def bits_of(slots) -> bytes:
    n = 0
    for s in slots:
        n |= 1 << s
    return n.to_bytes((n.bit_length() + 7) >> 3, "little")


def bits_has(bits: bytes, slot: int) -> bool:
    i = slot >> 3
    return i < len(bits) and (bits[i] >> (slot & 7)) & 1 == 1


def bits_union(a: bytes, b: bytes) -> bytes:
    n = int.from_bytes(a, "little") | int.from_bytes(b, "little")
    return n.to_bytes((n.bit_length() + 7) >> 3, "little")


def slots_of(bits: bytes) -> list[int]:
    n = int.from_bytes(bits, "little")
    return [i for i in range(n.bit_length()) if (n >> i) & 1]


class Store:
    """An open LevelDB. Thread-safe for reads; writers serialise themselves (engine lock)."""

    def __init__(self, path: str):
        self.path = path
        self.db = plyvel.DB(path, create_if_missing=True, write_buffer_size=32 << 20,
                            lru_cache_size=64 << 20, max_open_files=500)
        raw = self.db.get(b"Sschema")
        schema = SCHEMA if raw is None else unpackb(raw)
        if schema == 1:
            self._build_member_index()
        elif schema != SCHEMA:
            raise RuntimeError(f"{path}: state schema {schema} is not {SCHEMA}; "
                               "remove the state directory to start afresh")
        if schema != SCHEMA or raw is None:
            self.db.put(b"Sschema", packb(SCHEMA))

    def _build_member_index(self) -> None:
        """Schema 1 → 2: file every object that matches a view in the membership index."""
        log.info("%s: building the membership index (state schema 1 -> 2)", self.path)
        wb = self.db.write_batch()
        n = 0
        for k, v in self.db.iterator(prefix=b"o"):
            rec = unpackb(v)
            if rec[OBJ_SLOTS]:
                bucket, key = split_obj_key(k)
                wb.put(k_member(bucket, rec[OBJ_SLOTS], key),
                       packb([rec[OBJ_SIZE], rec[OBJ_MTIME], rec[OBJ_ETAG]]))
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

    # reads
    def get_object(self, bucket: str, key: str) -> list | None:
        raw = self.db.get(k_obj(bucket, key))
        return None if raw is None else unpackb(raw)

    def get_raw(self, k: bytes) -> bytes | None:
        return self.db.get(k)

    def iter_objects(self, bucket: str, after: str | None = None,
                     upto: str | None = None) -> Iterator[tuple[str, list]]:
        """(key, record) of a bucket in key order: after < key <= upto."""
        prefix = obj_prefix(bucket)
        n = len(prefix)
        start = prefix + after.encode() if after is not None else prefix
        stop = prefix + upto.encode() if upto is not None else None
        it = self.db.iterator(start=start, stop=stop, include_stop=True,
                              include_start=after is None) if stop is not None else \
            self.db.iterator(start=start, include_start=after is None, stop=_prefix_end(prefix))
        with it:
            for k, v in it:
                yield k[n:].decode(), unpackb(v)

    def member_groups(self, bucket: str) -> list[bytes]:
        """The bitmaps of the non-empty membership groups of ``bucket``: one seek per group."""
        prefix = member_prefix(bucket)
        n = len(prefix)
        groups = []
        with self.db.iterator(start=prefix, stop=_prefix_end(prefix), include_value=False) as it:
            for k in it:
                end = n + 2 + _G.unpack_from(k, n)[0]
                groups.append(k[n + 2:end])
                it.seek(_prefix_end(k[:end]))
        return groups

    def iter_members(self, bucket: str, groups, after: str | None = None) -> Iterator[tuple[str, list]]:
        """(key, [size, mtime, etag]) of the members of the given groups, key > after, in key
        order (a merge of one ordered range per group)."""
        with contextlib.ExitStack() as stack:
            ranges = []
            for g in groups:
                gp = member_group_prefix(bucket, g)
                it = stack.enter_context(self.db.iterator(
                    start=gp + after.encode() if after is not None else gp,
                    include_start=after is None, stop=_prefix_end(gp)))
                ranges.append(_members(it, len(gp)))
            for key, raw in heapq.merge(*ranges) if len(ranges) > 1 else ranges[0] if ranges else ():
                yield key.decode(), unpackb(raw)

    def iter_changes(self, bucket: str, since: int) -> Iterator[tuple[int, list]]:
        prefix = change_prefix(bucket)
        with self.db.iterator(start=prefix + _V.pack(since + 1), stop=_prefix_end(prefix)) as it:
            for k, v in it:
                yield _V.unpack_from(k, len(prefix))[0], unpackb(v)

    def iter_held(self, bucket: str, limit: int) -> list[tuple[bytes, list]]:
        """Up to ``limit`` (LevelDB key, event fields) held for ``bucket``, oldest first."""
        out = []
        with self.db.iterator(prefix=held_prefix(bucket)) as it:
            for k, v in it:
                out.append((k, unpackb(v)))
                if len(out) >= limit:
                    break
        return out

    def last_held(self, bucket: str) -> int:
        """The counter of the newest held event of ``bucket`` (0 if none)."""
        with self.db.iterator(prefix=held_prefix(bucket), reverse=True, include_value=False) as it:
            k = next(it, None)
        return 0 if k is None else _V.unpack_from(k, len(k) - 8)[0]

    def load_views(self) -> list[dict]:
        return sorted((unpackb(v) for _, v in self.db.iterator(prefix=b"V")),
                      key=lambda d: d["slot"])

    def load_buckets(self) -> dict[str, dict]:
        return {k[1:].decode(): unpackb(v) for k, v in self.db.iterator(prefix=b"B")}

    def has_pending_tags(self, bucket: str) -> bool:
        with self.db.iterator(prefix=b"T" + bucket.encode() + b"\0", include_value=False) as it:
            return next(it, None) is not None

    def pending_tags(self, bucket: bytes | None = None) -> Iterator[tuple[str, str, int]]:
        """(bucket, key, seq) of owed tag fetches (of one bucket when given, UTF-8)."""
        prefix = b"T" if bucket is None else b"T" + bucket + b"\0"
        for k, v in self.db.iterator(prefix=prefix):
            b, _, key = k[1:].partition(b"\0")
            yield b.decode(), key.decode(), unpackb(v)


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
