"""``delvefs notify BUCKET``: point a bucket's notifications at the handler's AMQP target."""
from __future__ import annotations

import sys

from delvefs.shared import config, s3


def run(args) -> int:
    client = s3.make_client()
    arn = config.notify_arn()
    try:
        s3.wire_notifications(client, args.bucket, arn)
    except s3.ClientError as exc:
        print(f"delvefs notify: {args.bucket}: {s3.error_code(exc) or exc}: "
              f"{exc.response.get('Error', {}).get('Message', '')}", file=sys.stderr)
        return 1
    except s3.EndpointConnectionError as exc:
        print(f"delvefs notify: cannot reach the object store: {exc}", file=sys.stderr)
        return 1
    print(f"{args.bucket}: s3:ObjectCreated:* and s3:ObjectRemoved:* -> {arn}")
    return 0
