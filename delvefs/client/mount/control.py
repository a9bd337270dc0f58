"""The mount's control channel: how ``delvefs sync``, ``status`` and ``reload`` talk to a
running mount.

Each mount daemon listens on a unix socket beside its run file
(``~/.cache/delvefs/run/<key>.sock``, the key being a hash of the mount point; when that
path is too long for a socket address, ``/tmp/delvefs-<uid>/<key>.sock``). The
directory must be the user's own and writable by no one else; the socket is 0600, and the
server checks the peer's credentials (``SO_PEERCRED``): only the mount's own user and root
may send operations — the mount point itself may be shared with ``allow_other``, its
control is not.

Protocol: one JSON object per connection and direction, each a single line.
Request ``{"op": NAME, "args": {...}}``; reply ``{"ok": true, "result": {...}}`` or
``{"ok": false, "error": "one line"}``. An operation may take as long as it needs
(``sync`` waits for uploads); the caller chooses its own timeout.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Awaitable, Callable

from delvefs.shared.config import state_home
from .mountpoints import mounted_fstype, run_file

log = logging.getLogger("delvefs.client.mount.control")

MAX_REQUEST = 1 << 20
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path, less the terminating NUL


class ControlError(Exception):
    """A one-line, user-facing reason why a control operation failed."""


def socket_path(mountpoint: str, state_dir: Path) -> Path:
    """Where the mount at ``mountpoint`` (a real path) listens."""
    path = run_file(mountpoint, state_dir).with_suffix(".sock")
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        return path
    return Path(f"/tmp/delvefs-{os.getuid()}") / path.name


def _own_dir(path: Path) -> None:
    """Make ``path``, or accept it if this user owns it and no one else may write in it
    (the /tmp fallback could otherwise be another user's trap)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ControlError(f"{path}: not a directory of this user that only it may write in; "
                           "refusing to put the control socket there")


Handler = Callable[[dict], Awaitable[dict]]


class ControlServer:
    """Serves ``operations`` (name -> async fn(args) -> result) on the socket at ``path``
    (inside the mount's nursery)."""

    def __init__(self, path: Path, operations: dict[str, Handler]):
        self.path = path
        self._ops = dict(operations)

    async def serve(self, task_status=None) -> None:
        import trio

        _own_dir(self.path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(os.fspath(self.path))
            os.chmod(self.path, 0o600)
            sock.listen(16)
            listener = trio.SocketListener(sock)
        except BaseException:
            sock.close()
            raise
        try:
            async with trio.open_nursery() as nursery:
                if task_status is not None:
                    task_status.started()
                while True:
                    stream = await listener.accept()
                    nursery.start_soon(self._serve_one, stream)
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink()
            await listener.aclose()

    def _peer_allowed(self, stream) -> bool:
        creds = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid in (os.getuid(), 0)

    async def _serve_one(self, stream) -> None:
        async with stream:
            try:
                if not self._peer_allowed(stream):
                    reply = {"ok": False, "error": "permission denied: not the mount's user"}
                else:
                    reply = await self._answer(await _read_line(stream))
            except ControlError as exc:
                reply = {"ok": False, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 — the caller gets one line, the log the rest
                log.exception("control operation failed")
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(Exception):
                await stream.send_all(json.dumps(reply).encode() + b"\n")

    async def _answer(self, line: bytes) -> dict:
        try:
            request = json.loads(line)
            op, args = request["op"], request.get("args") or {}
            if not isinstance(op, str) or not isinstance(args, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise ControlError("malformed request: expected {\"op\": NAME, \"args\": {...}}") from None
        fn = self._ops.get(op)
        if fn is None:
            raise ControlError(f"unknown operation {op!r} (this mount knows: {', '.join(sorted(self._ops))})")
        return {"ok": True, "result": await fn(args)}


async def _read_line(stream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ControlError("request too large")
    return data


def request(mountpoint: str, op: str, timeout: float | None = None, **args) -> dict:
    """Send ``op`` to the mount at ``mountpoint`` and return its result (blocking)."""
    real = os.path.realpath(mountpoint)
    fstype = mounted_fstype(real)
    if fstype is None:
        raise ControlError(f"{real} is not mounted")
    if fstype != "fuse.delvefs":
        raise ControlError(f"{real} is a {fstype} mount, not DelveFS")
    path = socket_path(real, state_home())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(os.fspath(path))
        except OSError as exc:
            raise ControlError(f"the mount at {real} does not answer on {path}: {exc.strerror or exc}") from None
        sock.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        raise ControlError(f"the mount at {real} did not answer {op!r} within {timeout:g} s") from None
    finally:
        sock.close()
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError(f"the mount at {real} closed the connection without an answer") from None
    if not reply.get("ok"):
        raise ControlError(reply.get("error") or "failed")
    return reply.get("result") or {}
