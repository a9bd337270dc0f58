"""``delvefs shards show``, ``delvefs shards owner BUCKET...`` and ``delvefs shards move
BUCKET --to SHARD`` (docs/ARCHITECTURE.md, "Shards"): the shard map as each shard serves it,
which shard owns a bucket, and handing a bucket to another shard."""
from __future__ import annotations

import concurrent.futures
import json
import sys

from delvefs.shared import config
from delvefs.shared.shards import UNSHARDED, ShardMap, ShardMapError
from ..handler.api import HandlerError, SyncHandlerClient


def whole_bucket_proof(bucket: str, token: str | None) -> dict[str, str]:
    """A proof of list rights on all of ``bucket``, signed with the environment's keys."""
    from delvefs.shared import s3
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
    if args.action == "owner":
        return owners(shard_map, args.buckets, token, as_json=args.json)
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


ASK_TIMEOUT = 10.0  # seconds a shard has to say its placements (``owner``)


def reported_maps(shard_map: ShardMap, token: str | None) -> dict[str, ShardMap | str]:
    """Each shard's map as it serves it (``GET /v1/shards``: with the buckets handed off
    placed), or why it did not answer. Asked all at once, each through its own URLs."""
    def ask(urls: list[str]) -> ShardMap | str:
        try:
            with SyncHandlerClient(urls, token, timeout=ASK_TIMEOUT) as client:
                return ShardMap.from_json(client.shard_maps())
        except HandlerError as exc:
            return str(exc)
        except (KeyError, TypeError, AttributeError, ShardMapError) as exc:
            return f"an answer without a shard map ({type(exc).__name__}: {exc})"
    with concurrent.futures.ThreadPoolExecutor(len(shard_map.shards)) as pool:
        futures = {name: pool.submit(ask, urls) for name, urls in shard_map.shards.items()}
        return {name: future.result() for name, future in futures.items()}


def owner_of(bucket: str, shard_map: ShardMap, reported: dict[str, ShardMap | str]) -> dict:
    """``{"bucket", "shard", "urls", "by"}`` (and ``"disagree"``): the owner of ``bucket``
    and how it is found — "placement" (``@BUCKET=SHARD`` in ``shard_map``), "hash"
    (rendezvous hashing over ``shard_map``) or "handoff" (the shards that answered place it
    elsewhere: a bucket moved, not written into the map yet). ``disagree``: {shard: the
    owner it names}, when the shards that answered do not all name the same one (a move
    under way, or one a shard missed); the owner is then the shard whose own map gives it
    the bucket, if exactly one does, else the map's."""
    named = {name: answer.owner(bucket) for name, answer in reported.items()
             if isinstance(answer, ShardMap)}
    owner = shard_map.owner(bucket)
    if len(set(named.values())) == 1:
        owner = next(iter(named.values()))
    elif named:
        claims = [name for name, says in named.items() if says == name]
        owner = claims[0] if len(claims) == 1 else owner
    if shard_map.placements.get(bucket) == owner:
        by = "placement"
    elif bucket not in shard_map.placements and shard_map.owner(bucket) == owner:
        by = "hash"
    else:
        by = "handoff"
    maps = [shard_map] + [m for m in reported.values() if isinstance(m, ShardMap)]
    urls = next(m.urls(owner) for m in maps if owner in m.shards)
    found = {"bucket": bucket, "shard": owner, "urls": urls, "by": by}
    if len(set(named.values())) > 1:
        found["disagree"] = named
    return found


def owners(shard_map: ShardMap, buckets: list[str], token: str | None, *, as_json: bool = False) -> int:
    """Print the shard that owns each bucket, used or not. Exit status 1 when the shards
    that answered disagree about one (a move under way, or one a shard missed)."""
    if not shard_map.sharded:
        found = [{"bucket": b, "shard": None, "urls": shard_map.urls(UNSHARDED), "by": "unsharded"}
                 for b in buckets]
    else:
        reported = reported_maps(shard_map, token)
        for name, answer in reported.items():
            if not isinstance(answer, ShardMap):
                print(f"delvefs shards: shard {name} did not say its placements ({answer}): "
                      "its handoffs are not counted", file=sys.stderr)
        found = [owner_of(b, shard_map, reported) for b in buckets]
    if as_json:
        print(json.dumps(found, indent=1))
    else:
        for f in found:
            if f["shard"] is None:
                print(f"{f['bucket']}: the only handler ({', '.join(f['urls'])})")
                continue
            how = {"hash": "rendezvous hash", "placement": "placed in the map",
                   "handoff": "handed off: write @" + f["bucket"] + "=" + f["shard"] + " into the map"}[f["by"]]
            print(f"{f['bucket']}: {f['shard']} ({', '.join(f['urls'])}; {how})")
            if "disagree" in f:
                print("  the shards disagree: " + ", ".join(f"{s} says {o}" for s, o in f["disagree"].items()))
    return 1 if any("disagree" in f for f in found) else 0


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
