"""The routes of shards (docs/API.md, "The shard map"; the shard itself:
eventhandler/sharding.py): the map this handler serves, and handing a bucket over."""
from __future__ import annotations

import asyncio

from aiohttp import web

from ..auth import GRANTED, valid_bucket
from .common import ApiError, log, read_body, reply
from .core import Routes


class ShardRoutes(Routes):
    async def shards(self, request: web.Request):
        """The shard map this handler serves (docs/API.md, ``GET /v1/shards``)."""
        if self.core.sharding is None:
            return reply(request, {"shard": None, "shards": None, "placements": {}})
        sharding = self.core.sharding
        readable = self.core.grants.buckets(request["principal"])
        owned = sorted(b for b in self.core.engine.buckets if b in readable and sharding.owns(b))
        return reply(request, {"shard": sharding.shard, **sharding.map.as_json(),
                               "map": sharding.map.text(), "buckets": owned,
                               "foreign_events": sharding.foreign_events})

    async def handoff(self, request: web.Request):
        """Place a bucket on shard ``to``: ``{"bucket", "to", "proof"}`` from a principal
        that may list the whole bucket, sent to every shard (``delvefs shards move``: to
        ``to`` first, its old owner last). ``to`` itself takes the bucket (it binds and
        scans it when mounts register there). Any other shard answers 421 naming ``to``
        from then on; the old owner stops receiving the bucket's events, applies what is
        queued, and forgets its views and records."""
        if self.core.sharding is None:
            raise ApiError(400, "bad_request", "this handler is no shard (it has no shard map)")
        body = await read_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("bucket"), str) \
                or not isinstance(body.get("to"), str):
            raise ApiError(400, "bad_request", 'body must be {"bucket", "to", "proof": {bucket: URL}}')
        bucket, to = body["bucket"], body["to"]
        if not valid_bucket(bucket):
            raise ApiError(400, "bad_request", f"{bucket[:80]!r} is no valid bucket name")
        if to not in self.core.sharding.map.shards:
            raise ApiError(400, "bad_request", f"no shard {to!r} in the map")
        principal = request["principal"]
        await self.core.accept_proofs(principal, self.core.proof_urls(body.get("proof"), owned=False))
        if self.core.grants.status(principal, bucket, "") != GRANTED:
            raise ApiError(403, "forbidden", f"handing off bucket {bucket!r} needs a proof of list "
                           "rights on all of it", bucket=bucket)
        was_owner = self.core.sharding.owner(bucket)
        loop = asyncio.get_running_loop()
        self.core.sharding.hand_off(bucket, to)  # from here on: 421 for it, unless it is ours now
        # long polls and change streams of the bucket wake: they answer 421, or end with
        # the "moved" event
        self.core.hub.handed_off(bucket)
        drained = {"unbound": False, "forgotten": []} if to == self.core.shard else \
            await loop.run_in_executor(None, self._release, bucket, to)
        log.warning("%s handed bucket %s from shard %s to shard %s", principal, bucket, was_owner, to)
        return reply(request, {"bucket": bucket, "from": was_owner, "to": to, **drained})

    def _release(self, bucket: str, to: str) -> dict:
        unbound = self.core.consumer.release(bucket) if hasattr(self.core.consumer, "release") else False
        roots = {info.id: (bucket, info.view.root or "") for info in self.core.engine.infos if info.bucket == bucket}
        views = self.core.engine.release_bucket(bucket, f"handed off to shard {to}")
        # requests about them: 421, so their clients follow the bucket
        self.core.sharding.release_views({vid: roots[vid] for vid in views if vid in roots})
        return {"unbound": unbound, "forgotten": views}
