"""Readiness under systemd (Type=notify), without systemd: a real datagram socket as
$NOTIFY_SOCKET around a real mount and a real event handler. READY=1 arrives once the
service answers, STOPPING=1 when it stops (contrib/systemd/)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request

import pytest

from delvefs.client.mount.mountpoints import mounted_fstype

from ..waiting import wait_until
from .mounts import DELVEFS, handler, mounts, put  # noqa: F401

pytestmark = [pytest.mark.services]


def listen(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(120)
    return sock


def fields(sock) -> dict:
    return dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())


@pytest.mark.fuse
def test_mount_tells_systemd_when_ready_and_when_stopping(mounts, s3, bucket, tmp_path):
    put(s3, bucket, "data/a.txt", b"hello")
    views = mounts.views(f"""
    data:
      bucket: {bucket}
      object: "data/*"
    """)
    mp = tmp_path / "mnt"
    mp.mkdir()
    sock = listen(tmp_path / "notify")
    proc = subprocess.Popen([DELVEFS, "mount", str(views), str(mp), "--foreground",
                             "--cache-dir", str(tmp_path / "cache"), "--log-file", str(tmp_path / "log")],
                            env={**mounts.env, "NOTIFY_SOCKET": str(tmp_path / "notify")},
                            stdin=subprocess.DEVNULL)
    try:
        ready = fields(sock)
        assert ready["READY"] == "1" and ready["MAINPID"] == str(proc.pid)
        # ready means answering: the file is there at once
        assert mounted_fstype(str(mp)) == "fuse.delvefs"
        assert (mp / "data/a.txt").read_bytes() == b"hello"
        proc.send_signal(signal.SIGTERM)
        assert fields(sock)["STOPPING"] == "1"
        assert proc.wait(60) == 0
        assert mounted_fstype(str(mp)) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if mounted_fstype(str(mp)) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        sock.close()


def test_handler_tells_systemd_when_its_api_answers(services, service_env, tmp_path):
    from eventhandler.devtools import HandlerProcess
    sock = listen(tmp_path / "notify")
    h = HandlerProcess(services.env(), tmp_path / "state",
                       extra_env={"NOTIFY_SOCKET": str(tmp_path / "notify")})
    try:
        h.start()
        ready = fields(sock)
        assert ready["READY"] == "1" and ready["STATUS"].startswith("active on ")
        with urllib.request.urlopen(f"{h.url}/healthz", timeout=10) as r:
            assert r.status == 200
        h.proc.send_signal(signal.SIGTERM)
        assert fields(sock)["STOPPING"] == "1"
        wait_until(lambda: h.proc.poll() is not None, 60, "the handler to exit")
    finally:
        h.close()
        sock.close()
