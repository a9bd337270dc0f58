"""``delvefs notify BUCKET [--arn ARN] [--remove]``: send a bucket's create and remove events
to the handler's target (MinIO's AMQP target, or an SQS queue on AWS), or stop sending them.

Only DelveFS's own rule of the bucket's notification configuration (Id ``delvefs``) is
added, updated or removed; the rules of every other consumer stay as they are."""
from __future__ import annotations

import sys

from delvefs.shared import config, s3


def run(args) -> int:
    arn = None if args.remove else (args.arn or config.notify_arn())
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
