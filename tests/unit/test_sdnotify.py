"""sd_notify(3) over a real datagram socket: what systemd would receive."""
from __future__ import annotations

import logging
import os
import socket

import pytest

from delvefs.shared import sdnotify


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield sock
    sock.close()


def fields(sock) -> dict:
    return dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())


def test_ready_and_stopping_arrive_as_one_datagram_each(notify_socket):
    assert sdnotify.ready("mounted 2 views")
    assert fields(notify_socket) == {"READY": "1", "STATUS": "mounted 2 views", "MAINPID": str(os.getpid())}
    assert sdnotify.stopping()
    assert fields(notify_socket) == {"STOPPING": "1"}


def test_abstract_socket_names(monkeypatch):
    name = f"delvefs-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("READY=1")
        assert sock.recv(100) == b"READY=1"


def test_without_systemd_nothing_happens(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not sdnotify.ready()
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    monkeypatch.setattr(sdnotify, "_warned", False)
    with caplog.at_level(logging.WARNING, "delvefs.sdnotify"):
        assert not sdnotify.ready() and not sdnotify.stopping()
    assert len(caplog.records) == 1 and "cannot notify systemd" in caplog.records[0].message
