"""The services one stress run stands on: private MinIO + RabbitMQ, and on them the
integration tier's private stack (tests/integration/mounts.py: the event handler, a
bucket wired to it, ``Mounts`` to mount views of it) — all stopped when the block ends."""
from __future__ import annotations

import contextlib
from pathlib import Path

from delvefs.devtools.localservices import LocalServices
from delvefs.shared import s3 as s3api
from delvefs.shared.config import S3Settings

from ..integration.mounts import Mounts, close_private_stack, private_stack


def views(bucket: str, ttl: float) -> str:
    """One writable view ``data`` of every object under data/."""
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: {ttl}s
    """


@contextlib.contextmanager
def stack(work: Path, queue_dir: bool = False):
    """``Mounts`` with ``.s3``, ``.bucket``, ``.handler`` (``.stop()``, ``.start()``);
    ``queue_dir``: MinIO sends its events from a queue dir (seconds late, docs/SEMANTICS.md)."""
    with LocalServices(work / "services", queue_dir=queue_dir) as svc:
        mounts = private_stack(lambda: svc, work)
        try:
            yield mounts
        finally:
            close_private_stack(mounts)


def another_client(mounts: Mounts):
    """Another S3 client on the stack's store, for another thread."""
    return s3api.make_client(S3Settings.from_env(mounts.env))


def mount_logs(work: Path) -> dict[str, Path]:
    return {f"mount {cache.name}": cache / "mount.log" for cache in sorted(work.glob("cache-*"))}
