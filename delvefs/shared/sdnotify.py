"""systemd's readiness protocol (sd_notify(3)), without a dependency.

A service of ``Type=notify`` is started when it sends ``READY=1`` as one datagram to the
unix socket named by ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace);
``STOPPING=1`` says it is shutting down, ``STATUS=...`` is shown by ``systemctl status``.
Without ``$NOTIFY_SOCKET`` (not started by systemd) every call does nothing. A failure to
send is logged once and never stops the service: readiness is systemd's concern.
"""
from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("delvefs.sdnotify")

_warned = False


def notify(*fields: str) -> bool:
    """Send ``fields`` (e.g. "READY=1", "STATUS=serving") as one message; True if sent."""
    global _warned
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not fields:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    message = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message)
        return True
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("cannot notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False


def ready(status: str | None = None) -> bool:
    return notify("READY=1", *([f"STATUS={status}"] if status else []), f"MAINPID={os.getpid()}")


def stopping(status: str | None = None) -> bool:
    return notify("STOPPING=1", *([f"STATUS={status}"] if status else []))
