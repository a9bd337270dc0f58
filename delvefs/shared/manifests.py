"""Atomic directory publish: what a mount writes and the handler reads (pure; no I/O).

A directory renamed inside a writable view is *published*: the mount writes each of its
objects with the user metadata ``delvefs-batch: BATCH`` (events carry user metadata; they
carry no tags), then one small *manifest* object, ``PARENT/.delvefs-publish-BATCH``, whose
user metadata names the batch, how many objects it has and a digest of their keys and
ETags. The handler holds the batch's objects back from every view until the manifest and
every object it names have arrived, then shows them all in one commit. The mount deletes
the manifest once written (the handler needs its event only); views never show a manifest.

A batch id is ``<creation time, ms, 12 hex digits>-<16 random hex digits>``: the handler
holds nothing of a batch after its creation time (or first sight, if earlier) plus its
publish timeout, so a copy of a published object made later (which carries the metadata
along) is shown at once.
"""
from __future__ import annotations

import hashlib
import re
import secrets

BATCH_FIELD = "delvefs-batch"    # user metadata (x-amz-meta-delvefs-batch) of each object
COUNT_FIELD = "delvefs-count"    # the manifest's: how many objects the batch has
DIGEST_FIELD = "delvefs-digest"  # the manifest's: batch_digest of their keys and ETags
MANIFEST_NAME = ".delvefs-publish-"

_BATCH = re.compile(r"[0-9a-f]{12}-[0-9a-f]{16}")
_MANIFEST = re.compile(r"(?:.*/)?\.delvefs-publish-([0-9a-f]{12}-[0-9a-f]{16})")


def new_batch(now: float) -> str:
    """A new batch id created at ``now`` (epoch seconds)."""
    return f"{int(now * 1000) & (1 << 48) - 1:012x}-{secrets.token_hex(8)}"


def valid_batch(batch) -> bool:
    return isinstance(batch, str) and _BATCH.fullmatch(batch) is not None


def batch_time(batch: str) -> float:
    """The creation time (epoch seconds) of a valid batch id."""
    return int(batch[:12], 16) / 1000


def manifest_key(parent_prefix: str, batch: str) -> str:
    """The manifest's key: beside the published directory (``parent_prefix`` ends with "/"
    or is empty), so credentials limited to a prefix can write it."""
    return f"{parent_prefix}{MANIFEST_NAME}{batch}"


def manifest_batch(key: str) -> str | None:
    """The batch id of a manifest key, else None (an ordinary object)."""
    if MANIFEST_NAME not in key:  # the common case, without the regular expression
        return None
    m = _MANIFEST.fullmatch(key)
    return m.group(1) if m else None


def batch_digest(items) -> str:
    """The digest of a batch's (key, ETag) pairs, in any order: SHA-256 of the lines
    ``key NUL etag LF`` sorted by key (ETags without quotes)."""
    h = hashlib.sha256()
    for key, etag in sorted(items):
        h.update(key.encode() + b"\0" + etag.strip('"').encode() + b"\n")
    return h.hexdigest()


def manifest_metadata(batch: str, items) -> dict[str, str]:
    """The manifest's user metadata for a batch of (key, ETag) pairs."""
    items = list(items)
    return {BATCH_FIELD: batch, COUNT_FIELD: str(len(items)), DIGEST_FIELD: batch_digest(items)}
