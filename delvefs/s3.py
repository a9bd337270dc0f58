"""The one module that talks to S3 (boto3). Synchronous by design: the trio
client calls it through ``trio.to_thread.run_sync`` with a limiter, the handler
from its worker threads. Callers never import boto3 themselves.
"""
from __future__ import annotations

import boto3
import botocore.config
from botocore.exceptions import ClientError, EndpointConnectionError  # noqa: F401  (re-exported)

from .config import S3Settings

S3_EVENTS = ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]


def make_client(settings: S3Settings | None = None, *, max_pool: int = 32, retries: int = 3):
    """A boto3 S3 client for ``settings`` (default: from the environment)."""
    settings = settings or S3Settings.from_env()
    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        region_name=settings.region,
        config=botocore.config.Config(
            max_pool_connections=max_pool,
            retries={"max_attempts": retries, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
            s3={"addressing_style": "path"},
            signature_version="s3v4",
        ),
    )


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (e.g. 'NoSuchKey'), else None."""
    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def ensure_bucket(client, bucket: str) -> None:
    """Create ``bucket`` unless it exists already."""
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def wire_notifications(client, bucket: str, arn: str) -> None:
    """Point all create/remove events of ``bucket`` at the queue target ``arn``."""
    client.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {"Id": "delvefs", "QueueArn": arn, "Events": list(S3_EVENTS)},
            ]
        },
    )
