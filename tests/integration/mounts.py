"""Shared pieces of the kernel-mount tests (test_mount_read.py, test_mount_write.py):
the real event handler as a subprocess, ``delvefs mount`` / ``umount`` runs that are always
unmounted again, and small helpers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from delvefs.client.mount.mountpoints import mounted_fstype

from ..conftest import service_unavailable

# --- the real handler as a subprocess; kernel mounts that are always unmounted again ---

DELVEFS = str(Path(sys.executable).parent / "delvefs")


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and bool(subprocess.run(["which", "fusermount3"],
                                                                capture_output=True).stdout)


def started_handler(env: dict, state_dir: Path, **kwargs):
    """A running handler subprocess on ``env``'s services; a test fails (CI) or skips
    when it cannot start. The caller closes it."""
    from eventhandler.devtools import HandlerProcess
    h = HandlerProcess(env, state_dir, **kwargs)
    try:
        h.start()
    except RuntimeError as exc:
        h.close()
        service_unavailable(f"event handler: {exc}")
    return h


@pytest.fixture
def handler(services, service_env, tmp_path):
    h = started_handler(services.env(), tmp_path / "handler-state")
    yield h
    h.close()


class Mounts:
    def __init__(self, tmp_path: Path, env: dict):
        self.tmp = tmp_path
        self.env = env
        self.mounted: list[str] = []
        self.count = 0

    def views(self, text: str) -> Path:
        self.count += 1
        path = self.tmp / f"views-{self.count}.yaml"
        path.write_text(textwrap.dedent(text))
        return path

    def run(self, *args, env=None, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([DELVEFS, *args], env=env or self.env, capture_output=True,
                              text=True, timeout=timeout)

    def mount(self, views_text: str, *extra, mountpoint: Path | None = None,
              cache_dir: Path | None = None, env=None) -> Path:
        views = self.views(views_text)
        mp = mountpoint or self.tmp / f"mnt-{self.count}"
        mp.mkdir(exist_ok=True)
        cache = cache_dir or self.tmp / f"cache-{self.count}"
        r = self.run("mount", str(views), str(mp), "--cache-dir", str(cache), *extra, env=env)
        assert r.returncode == 0, f"mount failed: {r.stderr}"
        self.mounted.append(str(mp))
        assert mounted_fstype(str(mp)) == "fuse.delvefs"
        return mp

    def mount_again(self, name: str, cache_dir: Path, *extra) -> Path:
        """The last views file mounted again at another mount point ``name``, with another
        cache dir (as a user does after a crash: the dead mount's journal is taken over)."""
        mp = self.tmp / name
        mp.mkdir()
        views_file = self.tmp / f"views-{self.count}.yaml"
        r = self.run("mount", str(views_file), str(mp), "--cache-dir", str(cache_dir), *extra)
        assert r.returncode == 0, r.stderr
        self.mounted.append(str(mp))
        return mp

    def umount(self, mp, check: bool = True) -> subprocess.CompletedProcess:
        r = self.run("umount", str(mp))
        if check:
            assert r.returncode == 0, r.stderr
        if mounted_fstype(str(mp)) is None and str(mp) in self.mounted:
            self.mounted.remove(str(mp))
        return r

    def daemon_pid(self, mp) -> int:
        from delvefs.client.mount.mountpoints import run_file
        run = run_file(str(mp), Path(self.env["DELVEFS_STATE_HOME"]))
        return json.loads(run.read_text())["pid"]

    def kill(self, mp) -> None:
        """SIGKILL the mount's daemon (a crash at any line) and detach the dead mount."""
        import signal
        from ..waiting import wait_until
        os.kill(self.daemon_pid(mp), signal.SIGKILL)
        wait_until(lambda: subprocess.run(["fusermount3", "-u", "-z", str(mp)],
                                          capture_output=True).returncode == 0
                   or mounted_fstype(str(mp)) is None, 10, "the dead mount is detached")
        if str(mp) in self.mounted:
            self.mounted.remove(str(mp))

    def cleanup(self) -> None:
        for mp in self.mounted:
            if mounted_fstype(mp) is not None:
                if self.run("umount", mp).returncode != 0:
                    subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True)


def private_stack(private_services, tmp_path: Path, **service_options) -> "Mounts":
    """Private MinIO + RabbitMQ (which a test may stop), a handler on them, a bucket wired
    to it and mounts: ``.svc``, ``.s3``, ``.bucket``, ``.handler``. Close with
    ``close_private_stack``. ``service_options``: LocalServices' (``queue_dir=True``)."""
    import uuid

    from delvefs.shared import s3 as s3api
    from delvefs.shared.config import S3Settings
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    svc = private_services(**service_options)
    env = svc.env()
    h = started_handler(env, tmp_path / "own-handler")
    client = s3api.make_client(S3Settings.from_env(env))
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3api.ensure_bucket(client, bucket)
    s3api.wire_notifications(client, bucket, svc.minio.notify_arn)
    m = Mounts(tmp_path, {**os.environ, **env, "DELVEFS_HANDLER_URL": h.url,
                          "DELVEFS_HANDLER_TOKEN": h.token or "",
                          "DELVEFS_STATE_HOME": str(tmp_path / "state")})
    m.svc, m.s3, m.bucket, m.handler = svc, client, bucket, h
    return m


def close_private_stack(m: "Mounts") -> None:
    if m.svc.minio.proc is None or m.svc.minio.proc.poll() is not None:
        m.svc.minio.start()  # a test stopped it: the mounts upload what they kept
    m.cleanup()
    m.handler.close()


@pytest.fixture
def mounts(handler, service_env, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    env = {**os.environ, **service_env, "DELVEFS_HANDLER_URL": handler.url,
           "DELVEFS_HANDLER_TOKEN": handler.token or "", "DELVEFS_STATE_HOME": str(tmp_path / "state")}
    m = Mounts(tmp_path, env)
    yield m
    m.cleanup()


# --- tests ---

TTL = 1.0
EVENT_DELAY = 20.0  # generous bound on MinIO -> RabbitMQ -> handler (machines under load)
CHANGE_TIMEOUT = TTL + EVENT_DELAY


def data_views(bucket: str, ttl: float = TTL) -> str:
    """``data`` (every object under data/) and ``raw`` (those tagged stage=raw): the views
    most mount tests start from (append more views at the same indentation)."""
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: {ttl}s
    raw:
      bucket: {bucket}
      object: "data/*"
      properties:
        stage: raw
      ttl: {ttl}s
    """


def tree_views(bucket: str, ttl: float = TTL) -> str:
    return data_views(bucket, ttl) + f"""flat:
      bucket: {bucket}
      object: "data/*"
      layout: flat
      ttl: {ttl}s
    """


def put(s3, bucket, key, body=b"", tags=None, metadata=None):
    kw = {}
    if tags:
        kw["Tagging"] = "&".join(f"{k}={v}" for k, v in tags.items())
    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata or {}, **kw)


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return None
