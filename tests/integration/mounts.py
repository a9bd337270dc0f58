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

from delvefs.client.mount import mounted_fstype

from ..conftest import service_unavailable

# --- the real handler as a subprocess; kernel mounts that are always unmounted again ---

DELVEFS = str(Path(sys.executable).parent / "delvefs")


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and bool(subprocess.run(["which", "fusermount3"],
                                                                capture_output=True).stdout)


@pytest.fixture
def handler(services, service_env, tmp_path):
    from delvefs.devtools.handlerprocess import HandlerProcess
    h = HandlerProcess(services.env(), tmp_path / "handler-state")
    try:
        h.start()
    except RuntimeError as exc:
        h.close()
        service_unavailable(f"event handler: {exc}")
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

    def umount(self, mp, check: bool = True) -> subprocess.CompletedProcess:
        r = self.run("umount", str(mp))
        if check:
            assert r.returncode == 0, r.stderr
        if mounted_fstype(str(mp)) is None and str(mp) in self.mounted:
            self.mounted.remove(str(mp))
        return r

    def daemon_pid(self, mp) -> int:
        from delvefs.client.mount import _key
        run = Path(self.env["DELVEFS_STATE_HOME"]) / "run" / f"{_key(str(mp))}.json"
        return json.loads(run.read_text())["pid"]

    def cleanup(self) -> None:
        for mp in self.mounted:
            if mounted_fstype(mp) is not None:
                if self.run("umount", mp).returncode != 0:
                    subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True)


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
