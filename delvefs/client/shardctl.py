"""``delvefs shards show`` and ``delvefs shards move BUCKET --to SHARD`` (docs/ARCHITECTURE.md,
"Shards"): the shard map as each shard serves it, and handing a bucket to another shard."""
from __future__ import annotations

import json
import sys

from ..shared import config
from ..shared.shards import ShardMap, ShardMapError
from .handler_api import HandlerError, SyncHandlerClient


def whole_bucket_proof(bucket: str, token: str | None) -> dict[str, str]:
    """A proof of list rights on all of ``bucket``, signed with the environment's keys."""
    from ..shared import s3
    settings = config.S3Settings.from_env()
    principal = config.handler_principal(token)
    url = s3.presign_list_url(settings, bucket, principal=principal)
    if url is None:  # credentials from a profile or a role: botocore signs
        url = s3.presigned_list_url(s3.make_client(settings), bucket, principal=principal)
    return {bucket: url}


def run(args) -> int:
    try:
        shard_map = ShardMap.parse(args.handler or config.handler_url())
    except ShardMapError as exc:
        print(f"delvefs shards: {exc}", file=sys.stderr)
        return 2
    token = config.handler_token()
    with SyncHandlerClient(shard_map.text(), token, timeout=120) as client:
        try:
            if args.action == "show":
                return show(client, shard_map)
            return move(client, shard_map, args.bucket, args.to, token)
        except HandlerError as exc:
            print(f"delvefs shards: {exc}", file=sys.stderr)
            return 1


def show(client: SyncHandlerClient, shard_map: ShardMap) -> int:
    if not shard_map.sharded:
        print(f"no shard map: one handler ({', '.join(shard_map.urls(''))})")
        return 0
    answers = client.shard_maps()
    for name, urls in shard_map.shards.items():
        answer = answers[name]
        differs = " (its map differs: " + answer["map"] + ")" \
            if ShardMap.from_json(answer) != shard_map else ""
        print(f"{name}: {', '.join(urls)}{differs}")
        print(f"  buckets: {', '.join(answer['buckets']) or '(none you may see)'}; "
              f"foreign events: {answer['foreign_events']}")
    if shard_map.placements:
        print("placed: " + json.dumps(shard_map.placements))
    return 0


def move(client: SyncHandlerClient, shard_map: ShardMap, bucket: str, to: str, token: str | None) -> int:
    if to not in shard_map.shards:
        print(f"delvefs shards: no shard {to!r} in the map {shard_map.text()!r}", file=sys.stderr)
        return 2
    proof = whole_bucket_proof(bucket, token)
    owner = shard_map.owner(bucket)
    # the new owner first (it takes the bucket), its old owner last (it lets it go)
    for shard in [to] + [s for s in shard_map.shards if s not in (to, owner)]:
        client.handoff(bucket, to, proof, shard=shard)
    answer = client.handoff(bucket, to, proof, shard=owner)
    print(f"{bucket}: handed from shard {answer['from']} to shard {answer['to']} "
          f"({len(answer['forgotten'])} view(s) forgotten there; queue "
          f"{'drained' if answer['unbound'] else 'not drained: the new owner rescans anyway'})")
    print(f"write @{bucket}={to} into the shard map (DELVEFS_HANDLER_URL) of every client and shard")
    return 0
