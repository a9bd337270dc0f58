"""The services one stress run stands on: private MinIO + RabbitMQ, the event handler
(the integration tier's helper: tests/integration/mounts.py), a bucket wired to it, and
``Mounts`` to mount views of it — all stopped again when the block ends."""
from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from delvefs.devtools.localservices import LocalServices
from delvefs.shared import s3 as s3api
from delvefs.shared.config import S3Settings

from ..integration.mounts import Mounts, fuse_available, started_handler


def views(bucket: str, ttl: float) -> str:
    """One writable view ``data`` of every object under data/."""
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: {ttl}s
    """


@dataclass
class Stack:
    work: Path
    handler: object   # the integration tier's handler process: .stop(), .start(), .log_path
    s3: object        # a boto3 client (delvefs.shared.s3)
    bucket: str
    mounts: Mounts

    def client(self):
        """Another S3 client, for another thread."""
        return s3api.make_client(S3Settings.from_env(self.mounts.env))

    def mount_logs(self) -> dict[str, Path]:
        return {f"mount {cache.name}": cache / "mount.log" for cache in sorted(self.work.glob("cache-*"))}


@contextlib.contextmanager
def stack(work: Path):
    if not fuse_available():
        raise SystemExit("/dev/fuse or fusermount3 missing")
    with LocalServices(work / "services") as svc:
        env = svc.env()
        handler = started_handler(env, work / "handler-state")
        try:
            s3 = s3api.make_client(S3Settings.from_env(env))
            bucket = f"stress-{uuid.uuid4().hex[:10]}"
            s3api.ensure_bucket(s3, bucket)
            s3api.wire_notifications(s3, bucket, svc.minio.notify_arn)
            mounts = Mounts(work, {**os.environ, **env, "DELVEFS_HANDLER_URL": handler.url,
                                   "DELVEFS_HANDLER_TOKEN": handler.token or "",
                                   "DELVEFS_STATE_HOME": str(work / "state")})
            try:
                yield Stack(work, handler, s3, bucket, mounts)
            finally:
                mounts.cleanup()
        finally:
            handler.close()
