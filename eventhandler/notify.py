"""``delvefs notify BUCKET [--arn ARN] [--remove]``: send a bucket's create and remove events
to the handler's target (MinIO's AMQP target, or an SQS queue on AWS), or stop sending them.

Only DelveFS's own rule of the bucket's notification configuration (Id ``delvefs``) is
added, updated or removed; the rules of every other consumer stay as they are.

Sharded with one target per shard (SQS: one queue each), the target setting is a map
``NAME=ARN,...`` and the bucket is wired to its owner's (the owner by the shard map in
$DELVEFS_HANDLER_URL, delvefs/shared/shards.py). With RabbitMQ every shard shares MinIO's
one target: the broker routes by bucket (eventhandler/amqp.py)."""
from __future__ import annotations

import sys

import re

from delvefs.shared import config, s3
from delvefs.shared.shards import SHARD_NAME, ShardMap


def owner_target(bucket: str, targets: str, handler_url: str) -> str:
    """The target of ``bucket``: ``targets`` itself, or from a ``NAME=ARN,...`` map its
    owner's."""
    entries = [e.strip() for e in targets.split(",") if e.strip()]
    named = dict(e.split("=", 1) for e in entries if re.match(rf"{SHARD_NAME}=", e))
    if not named:
        return targets
    owner = ShardMap.parse(handler_url).owner(bucket)
    if owner not in named:
        raise ValueError(f"no target of shard {owner!r} (the owner of {bucket!r}) in {targets!r}")
    return named[owner]


def run(args) -> int:
    try:
        arn = None if args.remove else owner_target(args.bucket, args.arn or config.notify_arn(),
                                                    config.handler_url())
    except ValueError as exc:
        print(f"delvefs notify: {exc}", file=sys.stderr)
        return 2
    client = s3.make_client()
    try:
        merged = s3.wire_notifications(client, args.bucket, arn)
    except s3.ClientError as exc:
        print(f"delvefs notify: {args.bucket}: {s3.error_code(exc) or exc}: "
              f"{exc.response.get('Error', {}).get('Message', '')}", file=sys.stderr)
        return 1
    except s3.EndpointConnectionError as exc:
        print(f"delvefs notify: cannot reach the object store: {exc}", file=sys.stderr)
        return 1
    others = sum(len(rules) for kind, rules in merged.items() if kind.endswith("Configurations")) \
        - (arn is not None)
    kept = f" ({others} rule{'s' if others != 1 else ''} of other consumers kept)" if others else ""
    if arn is None:
        print(f"{args.bucket}: rule {s3.NOTIFY_RULE_ID!r} removed{kept}")
    else:
        print(f"{args.bucket}: s3:ObjectCreated:* and s3:ObjectRemoved:* -> {arn} "
              f"(rule {s3.NOTIFY_RULE_ID!r}){kept}")
    return 0
