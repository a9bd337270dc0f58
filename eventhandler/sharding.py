"""This handler's shard (docs/ARCHITECTURE.md, "Shards").

A handler started with ``--shard NAME`` is one shard of the map given by ``--shard-map`` or
$DELVEFS_HANDLER_URL (delvefs/shared/shards.py: the same map its clients have). It serves
only the buckets the map gives it: a request about another bucket is answered 421
"misdirected", naming the owner and carrying the map, so a client with an outdated map
corrects itself. Buckets it handed off (``POST /v1/shards/handoff``) are written to
``STATE_DIR/handoffs.json`` and stay placed on their new owner across restarts (until
the configured map places them itself), with the views it forgot when it let them go: a
request about such a view is answered 421 too (not 404), so a client that knew the view
here follows its bucket to the new owner.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from delvefs.shared.shards import ShardMap, ShardMapError

log = logging.getLogger("delvefs.eventhandler.sharding")

HANDOFFS_FILE = "handoffs.json"


class Sharding:
    """The shard's name and map (with its handoffs placed); :meth:`owns` a bucket or not."""

    def __init__(self, shard: str, configured: ShardMap, state_dir: Path):
        if not configured.sharded:
            raise ShardMapError("--shard needs a map whose URLs name their shards (NAME=URL,...)")
        if shard not in configured.shards:
            raise ShardMapError(f"shard {shard!r} is not in the map {configured.text()!r}")
        self.shard = shard
        self.configured = configured
        self.path = Path(state_dir) / HANDOFFS_FILE
        self.handoffs: dict[str, str] = {}  # bucket -> the shard it was handed to
        # views forgotten when their bucket was handed off: view id -> (bucket, root)
        self.released: dict[str, tuple[str, str]] = {}
        self.foreign_events = 0  # events of buckets this shard does not own that reached it
        self._lock = threading.Lock()
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            saved = {}
        if "buckets" not in saved:  # written before released views were kept: buckets only
            saved = {"buckets": saved}
        self.released = {vid: (bucket, root) for vid, (bucket, root) in saved.get("views", {}).items()}
        for bucket, owner in saved["buckets"].items():
            if owner in configured.shards:
                self.handoffs[bucket] = owner
            else:
                log.warning("bucket %s was handed off to shard %s, which the map no longer has: "
                            "the map decides its owner", bucket, owner)
        self.map = self._placed()

    def _placed(self) -> ShardMap:
        placements = {**self.handoffs, **self.configured.placements}
        return ShardMap(self.configured.shards, placements)

    def owner(self, bucket: str) -> str:
        return self.map.owner(bucket)

    def owns(self, bucket: str) -> bool:
        return self.map.owner(bucket) == self.shard

    def hand_off(self, bucket: str, to: str) -> None:
        """From now on ``bucket`` belongs to shard ``to`` (kept across restarts). A bucket
        handed back here: the views of it forgotten before are its own again (404)."""
        if to not in self.map.shards:
            raise ShardMapError(f"no shard {to!r} in the map")
        with self._lock:
            self.handoffs[bucket] = to
            if to == self.shard:
                self.released = {vid: v for vid, v in self.released.items() if v[0] != bucket}
            self._save()
            self.map = self._placed()

    def release_views(self, views: dict[str, tuple[str, str]]) -> None:
        """Remember views forgotten with their bucket (view id -> (bucket, root)): requests
        about them are answered 421, naming the bucket's owner (kept across restarts)."""
        with self._lock:
            self.released.update(views)
            self._save()

    def moved_view(self, view_id: str) -> tuple[str, str] | None:
        """(bucket, root) of a view forgotten because its bucket now belongs to another
        shard; None for any other view."""
        moved = self.released.get(view_id)
        return moved if moved is not None and not self.owns(moved[0]) else None

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"buckets": self.handoffs, "views": self.released},
                                  indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def misdirected(self, bucket: str) -> dict:
        """The fields of a 421 answer about ``bucket``: its owner, the owner's URLs, the map."""
        owner = self.owner(bucket)
        return {"bucket": bucket, "owner": owner, "urls": self.map.urls(owner), "shard": self.shard,
                **self.map.as_json()}
