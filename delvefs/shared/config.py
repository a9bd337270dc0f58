"""Configuration from flags, then environment (SPEC.md, "Commands").

One place that knows the environment variable names and their defaults.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_EXCHANGE = "delvefs"
DEFAULT_NOTIFY_ARN = "arn:minio:sqs::PRIMARY:amqp"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_HANDLER_URL = "http://127.0.0.1:8731"


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None
    access_key: str | None
    secret_key: str | None
    region: str
    session_token: str | None = None  # temporary (STS) credentials come with one

    @classmethod
    def from_env(cls, env=os.environ) -> "S3Settings":
        return cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )


# S3's limit for one CopyObject; renames of larger objects are multipart copies
MAX_SINGLE_COPY = 5 * 1024**3


def copy_threshold(env=os.environ) -> int:
    """Objects of at least this many bytes are renamed by a multipart copy
    (``DELVEFS_COPY_THRESHOLD``, bytes; default and maximum S3's 5 GiB CopyObject limit)."""
    value = env.get("DELVEFS_COPY_THRESHOLD")
    return max(1, min(int(value), MAX_SINGLE_COPY)) if value else MAX_SINGLE_COPY


def amqp_url(flag: str | None = None, env=os.environ) -> str:
    return flag or env.get("DELVEFS_AMQP_URL") or DEFAULT_AMQP_URL


def amqp_exchange(flag: str | None = None, env=os.environ) -> str:
    return flag or env.get("DELVEFS_AMQP_EXCHANGE") or DEFAULT_EXCHANGE


def notify_arn(env=os.environ) -> str:
    return env.get("DELVEFS_NOTIFY_ARN") or DEFAULT_NOTIFY_ARN


def handler_url(flag: str | None = None, env=os.environ) -> str:
    return flag or env.get("DELVEFS_HANDLER_URL") or DEFAULT_HANDLER_URL


def handler_token(env=os.environ) -> str | None:
    return env.get("DELVEFS_HANDLER_TOKEN") or None
