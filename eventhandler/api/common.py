"""What every part of the HTTP API shares: its errors (:class:`ApiError`, answered as
``{"error", "message", ...}``), the answer's encoding (:func:`reply`: msgpack when asked
for, else JSON), the request's body and parameters read strictly (4xx before anything is
read or streamed), its limits, and the :class:`Hub` that wakes long polls and streams."""
from __future__ import annotations

import asyncio
import logging
import math
import re

import msgpack
import orjson
from aiohttp import web

from ..auth import MAX_KEY_BYTES
from ..feed import ChangeFeed

log = logging.getLogger("delvefs.eventhandler.api")

MSGPACK = "application/msgpack"
MAX_LIMIT = 50000
DEFAULT_LIMIT = 5000
MAX_BODY = 1 << 20        # bytes of a request body (413 beyond)
MAX_VIEWS = 1000          # views in one registration
MAX_VIEW_NAME = 255
MAX_PROOFS = 64           # proof URLs in one request
MAX_VERSION = 2**64 - 1   # versions are unsigned 64-bit numbers
VIEW_ID = re.compile(r"[0-9a-f]{16}")
VERSION = re.compile(r"[0-9]{1,20}")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


class Hub:
    """Wakes waiters of a bucket when the engine committed changes of it, and the change
    streams through their feed (eventhandler/feed.py)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, feed: ChangeFeed):
        self.loop = loop
        self.feed = feed
        self.events: dict[str, asyncio.Event] = {}

    def event(self, bucket: str) -> asyncio.Event:
        ev = self.events.get(bucket)
        if ev is None:
            ev = self.events[bucket] = asyncio.Event()
        return ev

    def changed(self, buckets) -> None:  # any thread
        if self.events or self.feed.windows:
            self.loop.call_soon_threadsafe(self.committed, buckets)

    def committed(self, buckets) -> None:  # the loop's thread
        self.feed.committed(buckets)
        self.wake(buckets)

    def wake(self, buckets) -> None:  # the loop's thread
        for b in buckets:
            ev = self.events.pop(b, None)
            if ev is not None:
                ev.set()

    def handed_off(self, bucket: str) -> None:
        """Every long poll and change stream of ``bucket`` wakes (to answer 421 / end)."""
        self.wake([bucket])
        self.feed.wake_all(bucket)


def reply(request: web.Request, data, status: int = 200) -> web.Response:
    if MSGPACK in request.headers.get("Accept", ""):
        return web.Response(body=msgpack.packb(data, use_bin_type=True), status=status,
                            content_type=MSGPACK)
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


async def read_body(request: web.Request):
    raw = await request.read()
    try:
        if request.content_type == MSGPACK:
            return msgpack.unpackb(raw, raw=False)
        return orjson.loads(raw or b"null")
    except Exception as exc:
        raise ApiError(400, "bad_request", f"undecodable {request.content_type} body: {exc}") from None


def int_arg(request, name, default, lo: int, hi: int, *, clamp: bool = False) -> int:
    """An integer parameter in [lo, hi]; above ``hi`` it is ``hi`` when ``clamp``, else 400."""
    value = request.query.get(name)
    if value is None or value == "":
        return default
    if not re.fullmatch(r"-?[0-9]{1,30}", value):
        raise ApiError(400, "bad_request", f"{name} must be an integer, not {value[:40]!r}")
    n = int(value)
    if n < lo or (n > hi and not clamp):
        raise ApiError(400, "bad_request", f"{name} must be between {lo} and {hi}")
    return min(n, hi)


def float_arg(request, name, default, hi) -> float:
    """Seconds, 0 or more; values above ``hi`` are ``hi``."""
    value = request.query.get(name)
    if value is None or value == "":
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ApiError(400, "bad_request", f"{name} must be a finite number of seconds, 0 or more")
    return min(seconds, hi)


def version_arg(text: str | None, what: str) -> int:
    if text is None or not VERSION.fullmatch(text) or int(text) > MAX_VERSION:
        raise ApiError(400, "bad_request", f"{what} must be a version: an integer from 0 to 2^64-1")
    return int(text)


def key_arg(text: str, what: str) -> str:
    if not text or len(text.encode()) > MAX_KEY_BYTES:
        raise ApiError(400, "bad_request", f"{what} must be 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    return text
