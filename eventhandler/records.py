"""The handler's LevelDB records: the key layout and every record's encoding. The only code
that builds or parses keys and values (statedb.py reads and writes them with plyvel).

Schema (every key starts with a one-byte prefix; ``vid`` = a view id's 8 raw bytes, i.e.
``bytes.fromhex(view_id)``; ``bucket`` and ``key`` are UTF-8; ``\\0`` separates a bucket
name, which never contains NUL, from what follows; ``v`` is an 8-byte big-endian unsigned
version so that byte order is numeric order). Values are msgpack.

=====================  ==========================================================  ==========
key                    value                                                       writers
=====================  ==========================================================  ==========
``S`` "schema"         int SCHEMA                                                  open()
``V`` vid              {"id", "slot", "spec", "names": [..], "floor", "ready",     register,
                        "created", "principals": {name: time}, "used"}: one         forget
                        registered view (filter spec, its slot = its index in
                        the matcher, the first version whose change log is
                        complete for it, who registered it when, when a mount
                        last used it)
``F`` slot             bucket: the slot of a forgotten view whose bits are being   forget
                        cleared from the bucket's records (not reusable before)
``L`` n                {"n", "time", "op", "id", "bucket", "root", "principal",     register,
                        "reason"}: the registration log, the newest                 forget
                        VIEW_LOG_SIZE entries (n: 8-byte big-endian counter)
``B`` bucket           {"state": "scanning"|"ready", "version", "tags": bool,      scan,
                        "scanned": epoch, "purged"}: a tracked bucket (some view     batches,
                        names it); ``version`` = last change-log version of the     compact
                        bucket; change entries <= ``purged`` may have been
                        compacted away (older ``since`` values must resync)
``o`` bucket\\0key      [seq, size, mtime, etag, tags|None, metadata, slots, ever,  batches
                        lv, flags]: object metadata (OBJ_* indices below)
``c`` bucket\\0 v       [key, deleted, slots, ever|None (= slots), size, mtime,     batches
                        etag(, props)]: change log of the bucket, shared by all
                        its views
``m`` bucket\\0 g key   [size, mtime, etag(, props)]: the membership index — one     batches
                        entry per object that matches at least one view, filed
                        under its ``slots`` bitmap g (prefixed with its 2-byte
                        big-endian length): every member of a view lies in the
                        groups g that hold its slot
``T`` bucket\\0key      int seq: a fetch of version seq's tags (and metadata) is    batches
                        owed (``TAGS_PENDING``)
``E`` bucket\\0 n       [kind, key, seq, size, etag, mtime, metadata, name]: an      consumer
                       event of a bucket whose first scan is running, held until
                       the scan ends (n: 8-byte big-endian arrival counter)
``G`` vid name          {"view", "name", "lease", "max_failures", "cursor",        api
                        "done", "created"}: a work-queue group of a view: its       (groups)
                        settings, the view version up to which files were
                        given to it (``cursor``), how many it finished
``W`` vid name\\0key    [state, attempts, member, until, version, props, error]:    api
                        one file of a group: pending, in flight (held by member     (groups)
                        until epoch ``until``), done or failed (set aside after
                        ``max_failures`` attempts)
``P`` bucket\\0 batch   {"deadline", "count", "digest", "committed"}: a batch of    batches,
                        an atomic directory publish (delvefs/shared/manifests.py):    publish
                        its manifest's count and digest once it arrived (None
                        before), whether it was shown; removed at its deadline
``H`` bucket\\0 batch   [seq, etag]: an object held back for the batch (its record   batches,
  \\0 key              has ``HELD``) until the batch commits or its deadline       publish
=====================  ==========================================================  ==========

Invariants (each WriteBatch keeps them, so they hold after any crash):

- ``o`` holds only keys of tracked buckets (events of other buckets are dropped unread, as
  in the paper: their metadata would cost writes for nobody). ``tags``/``metadata`` of None
  mean "not known" (a listing carries neither, an event no tags; tags are fetched only for
  an object whose answer they can change, metadata only where a view reads it), ``{}``
  means known to be empty. A settled record with unknown tags was matched with its tags
  unknown: no view's answer depended on them (``Matcher.match_partial``). ``seq`` (the S3 sequencer as int) never
  decreases for a key; a removed key is kept as a tombstone (``flags & DELETED``, the
  remove's seq) so that a late or replayed older create cannot resurrect it — until a
  reconcile compacts tombstones older than the horizon (``Engine.compact``), together with
  their change entries. Tagging events
  carry the sequencer of the version they tag: equal seq + tagging = fetch tags again.
- ``slots`` = the set of slots of the views the object matches, as a little-endian bitmap
  (bytes; bit i = slot i; b"" for tombstones; never changed while ``flags & TAGS_PENDING``);
  ``ever`` = bitmap union of all slots the key was in since it was first seen (so a change
  entry can tell a view "this key left you"). The slot of a forgotten view is reused only
  after its bit was cleared from ``slots`` and ``ever`` of every record of its bucket (and
  the membership entries moved to the groups without it): a view in a reused slot inherits
  nothing. Change entries keep the old bits, but a new view's floor is above all of them.
- ``m bucket\\0 g key`` exists iff the ``o`` record of key has ``slots`` == g != b"", and
  holds that record's size, mtime and etag.
- ``props`` ({name: value}) is there iff a view of the entry's slots lists property values
  (``layout_by``): for every name those views list, the record's tag of that name, else
  its user metadata of that name (names lowercase; a name it lacks left out). Such a
  record's tags and metadata are known (``Committer.finalize`` fetches them first). Entries without
  ``props`` cost nothing more than before (the field is simply absent, so states written
  before it need no migration). A view's listing merges, in key order, the
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
- ``G``/``W``: a group's files and its ``cursor`` are written in one WriteBatch, so a file
  of the view after the cursor is in no ``W`` record yet and every file up to it is in one
  (or was deleted); ``done`` counts the files the group finished. A group
  name is 1-64 of ``[A-Za-z0-9._-]`` (no NUL: it ends at the ``\\0`` before the key).
- A record with ``HELD`` (an object of a published batch whose manifest, or some other
  object of it, has not arrived) is in no view: ``slots`` is b"", as for a tombstone,
  and it is not matched; its ``H`` entry names it. The batch's release clears ``HELD`` of
  all its records in one WriteBatch (one commit: a client sees all or none of them) and
  deletes their ``H`` entries; so does its deadline, for whatever is held then.
- ``E`` records exist only for buckets in state "scanning"; each is written before the
  AMQP ack of its message and deleted in the WriteBatch that applies it (so memory stays
  bounded however long a scan takes, and a crash loses none of them).

Writes are WriteBatches with sync=False: they survive a killed process (the OS has the
log), not a power cut; AMQP acks are sent only after the batch is written.

Object records and change entries stay msgpack lists indexed by the module-level ``OBJ_*``
/ ``CH_*`` constants: the event path (apply.py) reads them in its inner loop, where a list
index is the cheapest access Python has. Code off that path uses the named helpers below.
"""
from __future__ import annotations

import struct

import msgpack
from rulesets import ObjectInfo

from .events import Event

SCHEMA = 2  # 2: the membership index (``m``), built from ``o`` when a schema-1 state is opened
SCHEMA_KEY = b"Sschema"

# object record fields
OBJ_SEQ, OBJ_SIZE, OBJ_MTIME, OBJ_ETAG, OBJ_TAGS, OBJ_META, OBJ_SLOTS, OBJ_EVER, OBJ_LV, OBJ_FLAGS = range(10)
DELETED = 1
TAGS_PENDING = 2
HELD = 4  # an object of a published batch not committed yet: in no view
UNSETTLED = DELETED | TAGS_PENDING | HELD  # not matched against the views now

# change entry fields
CH_KEY, CH_DELETED, CH_SLOTS, CH_EVER, CH_SIZE, CH_MTIME, CH_ETAG, CH_PROPS = range(8)

_V = struct.Struct(">Q")
_G = struct.Struct(">H")  # length of a membership group's bitmap
_EMPTY: dict = {}  # shared, never mutated
packb = msgpack.Packer(use_bin_type=True).pack
pack_schema = packb


def unpackb(data: bytes):
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


# ---- keys (pure; unit-tested) --------------------------------------------------------------

VIEW_PREFIX = b"V"
BUCKET_PREFIX = b"B"
OBJECT_PREFIX = b"o"
TAGWAIT_PREFIX = b"T"


def k_view(vid: str) -> bytes:
    return VIEW_PREFIX + bytes.fromhex(vid)


def k_bucket(bucket: str) -> bytes:
    return BUCKET_PREFIX + bucket.encode()


def bucket_of_key(k: bytes) -> str:
    """The bucket name of a ``B`` key."""
    return k[1:].decode()


def k_obj(bucket: str, key: str) -> bytes:
    return OBJECT_PREFIX + bucket.encode() + b"\0" + key.encode()


def obj_prefix(bucket: str) -> bytes:
    return OBJECT_PREFIX + bucket.encode() + b"\0"


def split_obj_key(k: bytes) -> tuple[str, str]:
    """(bucket, key) of an ``o`` or ``T`` key."""
    b, _, key = k[1:].partition(b"\0")
    return b.decode(), key.decode()


def member_prefix(bucket: str) -> bytes:
    return b"m" + bucket.encode() + b"\0"


def member_group_prefix(bucket: str, slots: bytes) -> bytes:
    return member_prefix(bucket) + _G.pack(len(slots)) + slots


def member_group_at(k: bytes, n: int) -> tuple[bytes, int]:
    """(group bitmap, where it ends) of ``m`` key ``k``; ``n`` = len(member_prefix(bucket))."""
    end = n + 2 + _G.unpack_from(k, n)[0]
    return k[n + 2:end], end


def k_member(bucket: str, slots: bytes, key: str) -> bytes:
    return member_group_prefix(bucket, slots) + key.encode()


def k_change(bucket: str, v: int) -> bytes:
    return b"c" + bucket.encode() + b"\0" + _V.pack(v)


pack_version = _V.pack


def change_prefix(bucket: str) -> bytes:
    return b"c" + bucket.encode() + b"\0"


def version_at(k: bytes, offset: int) -> int:
    """The version of a ``c`` key whose prefix is ``offset`` bytes long."""
    return _V.unpack_from(k, offset)[0]


def k_tagwait(bucket: str, key: str) -> bytes:
    return TAGWAIT_PREFIX + bucket.encode() + b"\0" + key.encode()


def tagwait_prefix(bucket: bytes | None = None) -> bytes:
    """``T`` keys of every bucket, or of one (UTF-8)."""
    return TAGWAIT_PREFIX if bucket is None else TAGWAIT_PREFIX + bucket + b"\0"


def held_prefix(bucket: str) -> bytes:
    return b"E" + bucket.encode() + b"\0"


def bucket_prefixes(bucket: str) -> list[bytes]:
    """The prefixes of every record of one bucket (its bucket record aside): what a shard
    deletes when the bucket moves to another one."""
    return [obj_prefix(bucket), member_prefix(bucket), change_prefix(bucket),
            tagwait_prefix(bucket.encode()), held_prefix(bucket)]


def k_held(bucket: str, n: int) -> bytes:
    return held_prefix(bucket) + _V.pack(n)


def held_counter(k: bytes) -> int:
    """The arrival counter of an ``E`` key."""
    return _V.unpack_from(k, len(k) - 8)[0]


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


# ---- object records (``o``) -----------------------------------------------------------------

pack_object = packb


def new_object(seq, size, mtime, etag, tags, metadata, flags=0) -> list:
    """The record of a key seen for the first time (in no view yet)."""
    return [seq, size, mtime, etag, tags, metadata, b"", b"", 0, flags]


def new_version(prev, seq, size, mtime, etag, tags, metadata, flags) -> list:
    """The record of a new version of a key; keeps the membership history (slots, ever,
    change entry) of ``prev``, its current record or None."""
    if prev is None:
        return new_object(seq, size, mtime, etag, tags, metadata, flags)
    return [seq, size, mtime, etag, tags, metadata, prev[OBJ_SLOTS], prev[OBJ_EVER], prev[OBJ_LV], flags]


def tombstone(seq, prev) -> list:
    """The record of a key removed at ``seq`` (``prev``: its record or None)."""
    return new_version(prev, seq, 0, 0.0, "", None, {}, DELETED)


def with_tags_unknown(rec) -> list:
    """A copy of ``rec`` whose tags changed to something not known yet (a tagging event)."""
    new = list(rec)
    new[OBJ_TAGS] = None
    return new


def with_tags(rec, tags, metadata) -> list:
    """A copy of ``rec`` with what a fetch brought: tags (None: not fetched, they could not
    change an answer) and metadata (None: not fetched; kept, or known empty when unknown
    and the tags were fetched), no longer waiting."""
    new = list(rec)
    if tags is not None:
        new[OBJ_TAGS] = tags
    if metadata is not None:
        new[OBJ_META] = metadata
    elif new[OBJ_META] is None and tags is not None:
        new[OBJ_META] = {}
    new[OBJ_FLAGS] &= ~TAGS_PENDING
    return new


def to_match_again(rec) -> list:
    """A copy of ``rec`` to be matched again (``Committer.finalize`` decides whether it must wait
    for its tags or metadata first)."""
    return list(rec)


def tags_unknown(rec) -> bool:
    return rec[OBJ_TAGS] is None


def seq_of(rec) -> int:
    return rec[OBJ_SEQ]


def is_deleted(rec) -> bool:
    return bool(rec[OBJ_FLAGS] & DELETED)


def is_tags_pending(rec) -> bool:
    return bool(rec[OBJ_FLAGS] & TAGS_PENDING)


def is_settled(rec) -> bool:
    """Neither removed nor waiting for tags: matched against the views."""
    return not rec[OBJ_FLAGS] & UNSETTLED


def lacks_metadata(rec) -> bool:
    return rec[OBJ_META] is None


def change_version(rec) -> int:
    """The version of the key's change entry (0: none)."""
    return rec[OBJ_LV]


def object_info(bucket: str, key: str, rec) -> ObjectInfo:
    """What the matcher sees of an object."""
    return ObjectInfo(bucket, key, rec[OBJ_SIZE], rec[OBJ_MTIME], None,
                      rec[OBJ_TAGS] or _EMPTY, rec[OBJ_META] or _EMPTY)


def object_fields(rec) -> dict:
    """An object's size, mtime, etag, tags and metadata (unknown ones as empty)."""
    return {"size": rec[OBJ_SIZE], "mtime": rec[OBJ_MTIME], "etag": rec[OBJ_ETAG],
            "tags": rec[OBJ_TAGS] or {}, "metadata": rec[OBJ_META] or {}}


def slot_bits(rec) -> bytes:
    """The bitmap of the views the object is in (its membership group)."""
    return rec[OBJ_SLOTS]


def view_slots(rec) -> list[int]:
    """The slots of the views the object is in."""
    return slots_of(rec[OBJ_SLOTS])


def listed_fields_differ(old, new) -> bool:
    """Whether what a listing shows of the object (size, etag, mtime) changed."""
    return old[OBJ_SIZE] != new[OBJ_SIZE] or old[OBJ_ETAG] != new[OBJ_ETAG] or old[OBJ_MTIME] != new[OBJ_MTIME]


def listed_properties(rec, names) -> dict:
    """The values of the properties ``names`` (lowercase) of a record whose tags and metadata
    are known: its tag of that name (compared case-insensitively), else its user metadata
    of that name; names it lacks are left out."""
    found = {}
    for source in (rec[OBJ_META] or _EMPTY), (rec[OBJ_TAGS] or _EMPTY):  # tags last: a tag wins
        for name, value in source.items():
            name = name.lower()
            if name in names:
                found[name] = value
    return found


def only_properties(props, names) -> dict:
    """What a view listing the properties ``names`` shows of an entry's ``props``."""
    if not props:
        return {}
    return {name: props[name] for name in names if name in props}


# ---- membership index entries (``m``) ---------------------------------------------------------

def pack_member(rec, props: dict | None = None) -> bytes:
    if props is None:
        return packb([rec[OBJ_SIZE], rec[OBJ_MTIME], rec[OBJ_ETAG]])
    return packb([rec[OBJ_SIZE], rec[OBJ_MTIME], rec[OBJ_ETAG], props])


def member_properties(entry) -> dict | None:
    """The ``props`` of a membership entry (None: no view of its group lists any)."""
    return entry[3] if len(entry) > 3 else None


def member_listing(key: str, entry, names: tuple[str, ...] | None = None) -> dict:
    """A listed object as the API shows it, from its membership entry; with ``names`` (a
    view's ``layout_by``) also its ``properties``."""
    obj = {"key": key, "size": entry[0], "mtime": entry[1], "etag": entry[2]}
    if names is not None:
        obj["properties"] = only_properties(member_properties(entry), names)
    return obj


# ---- change entries (``c``) -------------------------------------------------------------------

def pack_change(key: str, rec, props: dict | None = None) -> bytes:
    """The change entry of ``key`` whose record is now ``rec`` (slots and ever final);
    ``props`` as in its membership entry."""
    slots, ever = rec[OBJ_SLOTS], rec[OBJ_EVER]
    entry = [key, 1 if rec[OBJ_FLAGS] & DELETED else 0, slots, None if ever == slots else ever,
             rec[OBJ_SIZE], rec[OBJ_MTIME], rec[OBJ_ETAG]]
    if props is not None:
        entry.append(props)
    return packb(entry)


def change_key(entry) -> str:
    return entry[CH_KEY]


def change_view_op(entry, slot: int) -> str | None:
    """What the entry means to the view in ``slot``: "put", "delete" (the key left it) or
    None (nothing)."""
    if bits_has(entry[CH_SLOTS], slot):
        return "put"
    if entry[CH_EVER] is not None and bits_has(entry[CH_EVER], slot):
        return "delete"
    return None


def change_object(entry, names: tuple[str, ...] | None = None) -> dict:
    """The object of a "put" change as the API shows it; with ``names`` (a view's
    ``layout_by``) also its ``properties``."""
    obj = {"key": entry[CH_KEY], "size": entry[CH_SIZE], "mtime": entry[CH_MTIME], "etag": entry[CH_ETAG]}
    if names is not None:
        obj["properties"] = only_properties(entry[CH_PROPS] if len(entry) > CH_PROPS else None, names)
    return obj


# ---- pending tag fetches (``T``) --------------------------------------------------------------

def pack_tagwait(seq: int) -> bytes:
    return packb(seq)


# ---- held events (``E``) ------------------------------------------------------------------

def pack_held(ev: Event) -> bytes:
    return packb([ev.kind, ev.key, ev.seq, ev.size, ev.etag, ev.mtime, ev.metadata, ev.name])


def held_event(bucket: str, fields) -> Event:
    kind, key, seq, size, etag, mtime, metadata, name = fields
    return Event(kind, bucket, key, seq, size, etag, mtime, metadata, name)


# ---- buckets (``B``) and views (``V``) --------------------------------------------------------

def pack_bucket(state: str, version: int, tags: bool, scanned: float, purged: int) -> bytes:
    return packb({"state": state, "version": version, "tags": tags, "scanned": scanned, "purged": purged})


def unpack_bucket(raw: bytes) -> dict:
    """A bucket record's fields (the ones older records lack at their defaults)."""
    return {"tags": False, "scanned": 0.0, "purged": 0, **unpackb(raw)}


def pack_view(vid: str, slot: int, spec: dict, names, floor: int, ready: bool, created: float,
              principals: dict[str, float] | None = None, used: float = 0.0) -> bytes:
    return packb({"id": vid, "slot": slot, "spec": spec, "names": sorted(names), "floor": floor,
                  "ready": ready, "created": created, "principals": principals or {}, "used": used})


def unpack_view(raw: bytes) -> dict:
    """A view record's fields (the ones older records lack at their defaults: ``created``
    0.0, no principals, ``used`` when created)."""
    rec = {"created": 0.0, "principals": {}, **unpackb(raw)}
    rec.setdefault("used", rec["created"])
    return rec


# ---- slots being cleared (``F``) and the registration log (``L``) -------------------------

FREEING_PREFIX = b"F"
VIEW_LOG_PREFIX = b"L"
VIEW_LOG_SIZE = 1000


def k_freeing(slot: int) -> bytes:
    return FREEING_PREFIX + _V.pack(slot)


def freeing_slot(k: bytes) -> int:
    return _V.unpack_from(k, 1)[0]


def k_view_log(n: int) -> bytes:
    return VIEW_LOG_PREFIX + _V.pack(n)


def bits_without(bits: bytes, slot: int) -> bytes:
    """``bits`` with ``slot`` cleared (minimal length, as bits_of makes them)."""
    n = int.from_bytes(bits, "little") & ~(1 << slot)
    return n.to_bytes((n.bit_length() + 7) >> 3, "little")


# ---- work-queue groups (``G``, ``W``) ---------------------------------------------------------

GROUP_PREFIX = b"G"
WORK_PREFIX = b"W"
PENDING, IN_FLIGHT, DONE, FAILED = "pending", "in_flight", "done", "failed"


def k_group(vid: str, name: str) -> bytes:
    return GROUP_PREFIX + bytes.fromhex(vid) + name.encode()


def work_prefix(vid: str, name: str) -> bytes:
    return WORK_PREFIX + bytes.fromhex(vid) + name.encode() + b"\0"


def k_work(vid: str, name: str, key: str) -> bytes:
    return work_prefix(vid, name) + key.encode()


def pack_group(fields: dict) -> bytes:
    return packb(fields)


def pack_work(state: str, attempts: int, member: str | None, until: float, version: int,
              props: dict | None, error: str | None) -> bytes:
    return packb([state, attempts, member, until, version, props, error])


# ---- atomic publish: batches (``P``) and the objects held for them (``H``) -------------------

BATCH_PREFIX = b"P"
HELD_MEMBER_PREFIX = b"H"


def k_batch(bucket: str, batch: str) -> bytes:
    return BATCH_PREFIX + bucket.encode() + b"\0" + batch.encode()


def split_batch_key(k: bytes) -> tuple[str, str]:
    """(bucket, batch) of a ``P`` key."""
    b, _, batch = k[1:].partition(b"\0")
    return b.decode(), batch.decode()


def pack_batch(deadline: float, count: int | None = None, digest: str | None = None,
               committed: bool = False) -> bytes:
    return packb({"deadline": deadline, "count": count, "digest": digest, "committed": committed})


def held_member_prefix(bucket: str, batch: str) -> bytes:
    return HELD_MEMBER_PREFIX + bucket.encode() + b"\0" + batch.encode() + b"\0"


def k_held_member(bucket: str, batch: str, key: str) -> bytes:
    return held_member_prefix(bucket, batch) + key.encode()


def pack_held_member(seq: int, etag: str) -> bytes:
    return packb([seq, etag])


def is_held(rec) -> bool:
    return bool(rec[OBJ_FLAGS] & HELD)


def etag_of(rec) -> str:
    return rec[OBJ_ETAG]


def released(rec) -> list:
    """A copy of a held record, no longer held (``Committer.finalize`` matches it)."""
    new = list(rec)
    new[OBJ_FLAGS] &= ~HELD
    return new
