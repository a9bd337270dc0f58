"""Hot standby: one handler at a time owns a state directory; the others stand by.

The owner holds an exclusive ``flock`` on ``STATE_DIR/handler.lock`` (beside ``leveldb/``)
for its whole life. The kernel drops the lock when the process dies, however it dies
(SIGKILL and out-of-memory kills included), so a standby blocked on the same lock wakes at
once and takes over: it opens LevelDB and starts consuming, and the broker redelivers what
the dead handler had not acked (applying is idempotent: nothing is lost or doubled).

While it waits, a standby answers every HTTP request on its own listen address with 503
``{"status": "standby", "error": "standby", ...}``, so operators (``/healthz``) and clients
(which then try the next handler URL) can see what it is.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from aiohttp import web

log = logging.getLogger("delvefs.eventhandler.standby")

LOCK_NAME = "handler.lock"


class StateLock:
    """The exclusive lock on a state directory. The lock file also says who holds it
    (pid, host, listen address, since when): read by standbys for their messages."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / LOCK_NAME
        # not inherited by children (os.open's default): a child outliving us must not
        # keep the standby waiting
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.held = False

    def acquire_now(self) -> bool:
        """Take the lock if it is free; False when another handler holds it."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    def acquire(self) -> None:
        """Block until the lock is ours (the holder exited or died)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.held = True

    def record_holder(self, listen: str) -> None:
        """Write who holds the lock into the lock file (for the standbys' messages)."""
        data = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "listen": listen,
                           "since": round(time.time(), 3)}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def holder(self) -> dict:
        """What the current holder wrote about itself ({} if nothing readable)."""
        try:
            return json.loads(os.pread(self.fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            return {}

    def close(self) -> None:
        """Release the lock (closing the file does; so does the process's death)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self.held = False


def describe_holder(holder: dict) -> str:
    if not holder:
        return "another handler"
    return (f"the handler with pid {holder.get('pid')} on {holder.get('host')} "
            f"(listening on {holder.get('listen')})")


def standby_app(lock: StateLock, waiting_since: float) -> web.Application:
    """Answers everything with 503 "standby": /healthz for operators, the API's paths for
    clients, which move on to their next handler URL."""

    async def answer(request: web.Request) -> web.Response:
        holder = lock.holder()
        body = {"status": "standby", "error": "standby",
                "message": f"standing by: {describe_holder(holder)} holds the state lock "
                           f"{lock.path}; this handler takes over when it exits",
                "holder": holder, "standby_seconds": round(time.time() - waiting_since, 3)}
        return web.json_response(body, status=503)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    return app


async def stand_by(lock: StateLock, serve, stop: asyncio.Event) -> bool:
    """Serve standby answers (``serve(app, until)`` runs an app until the event is set)
    until the lock is ours (True) or ``stop`` is set first (False)."""
    loop = asyncio.get_running_loop()
    acquired = asyncio.Event()
    waiting_since = time.time()
    log.warning("standing by: %s holds the state lock %s; taking over when it exits",
                describe_holder(lock.holder()), lock.path)

    def wait_for_lock() -> None:  # flock blocks: in a thread, woken by the kernel at once
        lock.acquire()
        try:
            loop.call_soon_threadsafe(acquired.set)
        except RuntimeError:  # the loop closed: we stopped while standing by
            pass
    threading.Thread(target=wait_for_lock, name="delvefs-standby", daemon=True).start()

    done = asyncio.Event()

    async def until_lock_or_stop() -> None:
        waits = [asyncio.ensure_future(acquired.wait()), asyncio.ensure_future(stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        done.set()

    await asyncio.gather(serve(standby_app(lock, waiting_since), done), until_lock_or_stop())
    if acquired.is_set() and not stop.is_set():
        log.warning("took over the state lock %s after standing by %.1f s", lock.path,
                    time.time() - waiting_since)
        return True
    return False
