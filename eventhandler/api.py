"""The HTTP API (aiohttp), as documented in docs/API.md. Runs on the asyncio loop of the
main thread; LevelDB reads of more than a few records go to the default executor so the
loop stays responsive. Long polls and streams sleep on a per-bucket asyncio.Event that the
engine's writer threads set through ``loop.call_soon_threadsafe`` after each commit.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from urllib.parse import parse_qs, urlsplit

import aiohttp
import msgpack
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .tracking import bucket_glob_message, bucket_is_glob

log = logging.getLogger("delvefs.eventhandler.api")

MSGPACK = "application/msgpack"
MAX_LIMIT = 50000
DEFAULT_LIMIT = 5000


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


class Hub:
    """Wakes waiters of a bucket when the engine committed changes of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: dict[str, asyncio.Event] = {}

    def event(self, bucket: str) -> asyncio.Event:
        ev = self.events.get(bucket)
        if ev is None:
            ev = self.events[bucket] = asyncio.Event()
        return ev

    def changed(self, buckets) -> None:  # any thread
        if self.events:
            self.loop.call_soon_threadsafe(self._wake, buckets)

    def _wake(self, buckets) -> None:
        for b in buckets:
            ev = self.events.pop(b, None)
            if ev is not None:
                ev.set()


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


def _int_arg(request, name, default, lo=None, hi=None) -> int:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be an integer, not {value!r}") from None
    if lo is not None and n < lo:
        raise ApiError(400, "bad_request", f"{name} must be >= {lo}")
    return min(n, hi) if hi is not None else n


def _float_arg(request, name, default, hi) -> float:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    try:
        return max(0.0, min(float(value), hi))
    except ValueError:
        raise ApiError(400, "bad_request", f"{name} must be a number of seconds") from None


class Api:
    def __init__(self, engine, consumer, metrics, token: str | None, s3_endpoint: str | None,
                 *, proof_timeout: float = 10.0):
        self.engine = engine
        self.consumer = consumer
        self.metrics = metrics
        self.token = token
        self.s3_endpoint = s3_endpoint
        self.proof_timeout = proof_timeout
        self.hub: Hub | None = None
        self.session: aiohttp.ClientSession | None = None
        self.started = time.time()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/v1/views", self.register)
        app.router.add_get("/v1/views/{id}/objects", self.list_objects)
        app.router.add_get("/v1/views/{id}/changes", self.changes)
        app.router.add_get("/v1/views/{id}/stream", self.stream)
        app.router.add_get("/v1/objects/{bucket}/{key:.+}", self.lookup)
        app.router.add_post("/v1/reconcile", self.reconcile)
        app.router.add_get("/healthz", self.health)
        app.router.add_get("/metrics", self.prom)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app) -> None:
        self.hub = Hub(asyncio.get_running_loop())
        self.engine.add_listener(self.hub.changed)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.proof_timeout))

    async def _cleanup(self, app) -> None:
        if self.session:
            await self.session.close()

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        try:
            if request.path.startswith("/v1/") and self.token is not None:
                auth = request.headers.get("Authorization", "")
                if not (auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip(), self.token)):
                    raise ApiError(401, "unauthorized", "missing or wrong bearer token")
            return await handler(request)
        except ApiError as exc:
            return reply(request, {"error": exc.code, "message": exc.message, **exc.extra}, exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return reply(request, {"error": exc.reason.lower().replace(" ", "_"), "message": exc.text or exc.reason},
                         exc.status)

    def _view(self, request):
        info = self.engine.views_by_id.get(request.match_info["id"])
        if info is None:
            raise ApiError(404, "not_found", f"no view with id {request.match_info['id']!r}")
        return info

    # ---- views -------------------------------------------------------------------

    async def register(self, request: web.Request):
        body = await read_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("views"), list):
            raise ApiError(400, "bad_request", 'body must be {"client", "views": [...], "proof": {...}}')
        views = []
        for v in body["views"]:
            if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not isinstance(v.get("spec"), dict):
                raise ApiError(400, "invalid_view", 'each view must be {"name": str, "spec": {...}}')
            bucket = v["spec"].get("bucket")
            if not isinstance(bucket, str) or not bucket:
                raise ApiError(400, "invalid_view", f"view {v['name']!r}: spec.bucket must be a bucket name")
            if bucket_is_glob(bucket):  # before the proof: a glob has no presigned URL
                raise ApiError(400, "invalid_view", bucket_glob_message(v["name"], bucket))
            views.append((v["name"], v["spec"]))
        proof = body.get("proof") or {}
        if not isinstance(proof, dict):
            raise ApiError(400, "bad_request", "proof must map bucket -> presigned URL")
        for bucket in sorted({spec["bucket"] for _, spec in views}):
            await self._check_proof(bucket, proof.get(bucket))
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(None, self.engine.register, views)
        except ValueError as exc:
            raise ApiError(400, "invalid_view", str(exc)) from None
        log.info("client %r registered %s", body.get("client"), [(v["name"], v["id"]) for v in out])
        return reply(request, {"views": out})

    async def _check_proof(self, bucket: str, url) -> None:
        if not isinstance(url, str) or not url:
            raise ApiError(403, "forbidden", f"no proof for bucket {bucket!r}: send a presigned "
                           "ListObjectsV2 URL made with your credentials", bucket=bucket)
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        expected = urlsplit(self.s3_endpoint) if self.s3_endpoint else None
        if parts.scheme not in ("http", "https") or "X-Amz-Signature" not in query \
                or query.get("list-type") != ["2"] \
                or (expected is not None and (parts.scheme, parts.netloc) != (expected.scheme, expected.netloc)) \
                or parts.path.strip("/") != bucket:
            raise ApiError(403, "forbidden", f"proof for bucket {bucket!r} is not a presigned "
                           "ListObjectsV2 URL of this handler's object store", bucket=bucket)
        try:
            async with self.session.get(url) as resp:
                status = resp.status
                await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ApiError(403, "forbidden", f"proof for bucket {bucket!r} could not be checked: {exc}",
                           bucket=bucket) from None
        if status != 200:
            raise ApiError(403, "forbidden", f"the object store refused the proof for bucket {bucket!r} "
                           f"(HTTP {status}): your credentials cannot list it", bucket=bucket)

    async def _wait_ready(self, info, wait: float) -> None:
        if self.engine.view_ready(info):
            return
        deadline = time.monotonic() + wait
        while not self.engine.view_ready(info):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ApiError(503, "scanning", f"view {info.id} is still being built (bucket scan)")
            await asyncio.sleep(min(0.05, left))

    async def list_objects(self, request: web.Request):
        info = self._view(request)
        limit = _int_arg(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        after = request.query.get("after") or None
        await self._wait_ready(info, _float_arg(request, "wait", 30.0, 300.0))
        if limit <= 200:
            page = self.engine.list_view(info, after, limit)
        else:
            page = await asyncio.get_running_loop().run_in_executor(
                None, self.engine.list_view, info, after, limit)
        return reply(request, page)

    def _check_since(self, info, since: int) -> None:
        top = self.engine.buckets[info.bucket].committed
        floor = self.engine.change_floor(info)
        if since < floor or since > top:
            raise ApiError(410, "resync", f"version {since} is outside the change log of view "
                           f"{info.id} ({floor}..{top}): list the view again", version=top)

    async def _changes(self, info, since, limit):
        # small answers inline; the log read is bounded by `limit` relevant entries
        res = self.engine.changes(info, since, limit)
        # checked after the read: a compaction during it may have removed entries it needed
        self._check_since(info, since)
        return res

    async def changes(self, request: web.Request):
        info = self._view(request)
        since = _int_arg(request, "since", None)
        if since is None:
            raise ApiError(400, "bad_request", "since=V is required (the version of your listing)")
        limit = _int_arg(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        wait = _float_arg(request, "wait", 0.0, 60.0)
        await self._wait_ready(info, 30.0 if wait else 0.0)
        deadline = time.monotonic() + wait
        while True:
            ev = self.hub.event(info.bucket)
            res = await self._changes(info, since, limit)
            if res["changes"] or res["more"]:
                return reply(request, res)
            left = deadline - time.monotonic()
            if left <= 0:
                return reply(request, res)
            since = max(since, res["version"])
            try:
                await asyncio.wait_for(ev.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def stream(self, request: web.Request):
        info = self._view(request)
        since = request.headers.get("Last-Event-ID") or request.query.get("since")
        try:
            since = int(since)
        except (TypeError, ValueError):
            raise ApiError(400, "bad_request", "since=V or Last-Event-ID is required") from None
        await self._wait_ready(info, 30.0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            while True:
                ev = self.hub.event(info.bucket)
                try:
                    res = await self._changes(info, since, 1000)
                except ApiError as exc:  # outside the change log
                    data = orjson.dumps({"version": exc.extra["version"]})
                    await resp.write(b"event: resync\ndata: " + data + b"\n\n")
                    return resp
                if res["changes"]:
                    out = bytearray()
                    for ch in res["changes"]:
                        out += b"id: %d\ndata: " % ch["v"] + orjson.dumps(ch) + b"\n\n"
                    await resp.write(bytes(out))
                since = max(since, res["version"])
                if res["more"]:
                    continue
                try:
                    await asyncio.wait_for(ev.wait(), 15.0)
                except asyncio.TimeoutError:
                    await resp.write(b": keepalive\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        return resp

    async def lookup(self, request: web.Request):
        bucket, key = request.match_info["bucket"], request.match_info["key"]
        obj = self.engine.lookup(bucket, key)
        if obj is None:
            raise ApiError(404, "not_found", f"no object {bucket}/{key} known to the handler")
        return reply(request, obj)

    async def reconcile(self, request: web.Request):
        bucket = request.query.get("bucket") or None
        if bucket is not None and bucket not in self.engine.buckets:
            raise ApiError(404, "not_found", f"bucket {bucket!r} is not tracked (no view names it)")
        counts = await asyncio.get_running_loop().run_in_executor(None, self.engine.reconcile, bucket)
        return reply(request, {"buckets": counts})

    # ---- operations ------------------------------------------------------------------

    async def health(self, request: web.Request):
        amqp = "connected" if self.consumer is None or self.consumer.connected.is_set() else "reconnecting"
        buckets = {b: s.state for b, s in self.engine.buckets.items()}
        status = "ok" if amqp == "connected" else "degraded"
        data = {"status": status, "amqp": amqp, "views": len(self.engine.infos),
                "buckets": buckets, "uptime": round(time.time() - self.started, 3)}
        if self.consumer is not None and self.consumer.last_error and amqp != "connected":
            data["amqp_error"] = self.consumer.last_error
        scan_errors = {b: s.scan_error for b, s in self.engine.buckets.items() if s.scan_error}
        if scan_errors:  # first scans failing and being retried
            data["status"] = "degraded"
            data["scan_errors"] = scan_errors
        return reply(request, data)

    async def prom(self, request: web.Request):
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
