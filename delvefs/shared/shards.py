"""The shard map: which event handler shard owns which bucket (docs/ARCHITECTURE.md, "Shards").

A deployment with one handler has no map: its handler URL setting (``--handler``,
``-o handler=``, $DELVEFS_HANDLER_URL) is one URL, or the active handler's and its standbys',
comma-separated, exactly as ever. A sharded deployment writes the map in the same setting:
each entry ``NAME=URL`` names a shard and one of its URLs (the entries of one shard, in
order, are its active handler and its standbys), and an entry ``@BUCKET=NAME`` places a
bucket on a shard by hand (a bucket moved there)::

    a=http://h1:8731,a=http://h1b:8731,b=http://h2:8731,c=http://h3:8731,@photos=c

Every other bucket belongs to the shard that rendezvous hashing picks: the shard whose
hash of (shard name, bucket) is highest. Every client and every handler computes the same
owner from the same map, with no lookup; adding a shard moves only the buckets it then wins.
"""
from __future__ import annotations

import hashlib
import re

SHARD_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
_SHARD_ENTRY = re.compile(rf"({SHARD_NAME})=(.+)")
_PLACEMENT = re.compile(rf"@([^=,@]+)=({SHARD_NAME})")
UNSHARDED = ""  # the name of the one shard of a deployment without a map


class ShardMapError(ValueError):
    pass


def shard_score(shard: str, bucket: str) -> int:
    """Rendezvous hashing: the owner of a bucket is the shard that scores highest (of equal
    scores, the greatest name). The score is BLAKE2b with an 8-byte output (its digest
    length parameter, not a cut longer digest) of UTF-8(shard) + LF + UTF-8(bucket), read
    big-endian: what docs/ARCHITECTURE.md ("The owner of a bucket, exactly") defines for
    other clients, pinned by fixed vectors in tests/unit/test_shards.py."""
    digest = hashlib.blake2b(f"{shard}\n{bucket}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class ShardMap:
    """Shard names -> their URLs (active handler first, then its standbys), and buckets
    placed by hand. Unsharded: one shard named :data:`UNSHARDED` owning every bucket."""

    __slots__ = ("shards", "placements")

    def __init__(self, shards: dict[str, list[str]], placements: dict[str, str] | None = None):
        if not shards or any(not urls for urls in shards.values()):
            raise ShardMapError("a shard map needs at least one shard, each with a URL")
        placements = dict(placements or {})
        for bucket, shard in placements.items():
            if shard not in shards:
                raise ShardMapError(f"bucket {bucket!r} is placed on {shard!r}, which is not in the map")
        if UNSHARDED in shards and (len(shards) > 1 or placements):
            raise ShardMapError("either every handler URL names its shard (NAME=URL) or none does")
        self.shards = {name: list(urls) for name, urls in shards.items()}
        self.placements = placements

    @classmethod
    def parse(cls, text: str | list[str]) -> "ShardMap":
        """The map of a handler URL setting: a comma-separated string or a list of entries."""
        entries = text.split(",") if isinstance(text, str) else list(text)
        shards: dict[str, list[str]] = {}
        placements: dict[str, str] = {}
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            placed = _PLACEMENT.fullmatch(entry)
            named = _SHARD_ENTRY.fullmatch(entry)
            if placed:
                placements[placed.group(1)] = placed.group(2)
            elif entry.startswith("@"):
                raise ShardMapError(f"{entry!r}: a placement is @BUCKET=SHARD")
            elif named and "://" not in named.group(1):
                shards.setdefault(named.group(1), []).append(named.group(2).strip().rstrip("/"))
            else:
                shards.setdefault(UNSHARDED, []).append(entry.rstrip("/"))
        if not shards:
            raise ShardMapError(f"no handler URL in {text!r}")
        return cls(shards, placements)

    @classmethod
    def from_json(cls, data: dict) -> "ShardMap":
        """The map as ``GET /v1/shards`` (and a 421 answer) shows it."""
        return cls({str(k): [str(u) for u in v] for k, v in data["shards"].items()},
                   {str(k): str(v) for k, v in (data.get("placements") or {}).items()})

    def as_json(self) -> dict:
        return {"shards": self.shards, "placements": self.placements}

    def text(self) -> str:
        """The map as the handler URL setting writes it."""
        parts = [url if name == UNSHARDED else f"{name}={url}"
                 for name, urls in self.shards.items() for url in urls]
        return ",".join(parts + [f"@{b}={s}" for b, s in sorted(self.placements.items())])

    @property
    def sharded(self) -> bool:
        return UNSHARDED not in self.shards

    def owner(self, bucket: str) -> str:
        """The name of the shard that owns ``bucket``."""
        placed = self.placements.get(bucket)
        if placed is not None:
            return placed
        if len(self.shards) == 1:
            return next(iter(self.shards))
        return max(self.shards, key=lambda shard: (shard_score(shard, bucket), shard))

    def urls(self, shard: str) -> list[str]:
        return self.shards[shard]

    def placed(self, bucket: str, shard: str) -> "ShardMap":
        """This map with ``bucket`` placed on ``shard`` (a moved bucket)."""
        if shard not in self.shards:
            raise ShardMapError(f"no shard {shard!r} in the map")
        return ShardMap(self.shards, {**self.placements, bucket: shard})

    def __eq__(self, other) -> bool:
        return isinstance(other, ShardMap) and self.as_json() == other.as_json()

    def __repr__(self) -> str:
        return f"ShardMap({self.text()!r})"
