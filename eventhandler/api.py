"""The HTTP API (aiohttp), as documented in docs/API.md. Runs on the asyncio loop of the
main thread; LevelDB reads of more than a few records go to the default executor so the
loop stays responsive. Long polls and streams sleep on a per-bucket asyncio.Event that the
engine's writer threads set through ``loop.call_soon_threadsafe`` after each commit.

Every ``/v1`` request is made by a principal (its bearer token, eventhandler/auth.py) and
reads only what that principal holds a grant for: a view while a grant of its bucket covers
its root, an object while one covers its key. A view or object it may not read is answered
like an unknown one (404), or 403 "proof_expired" when its grant has lapsed. Malformed
requests are 4xx before anything is read or streamed.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import re
import ssl
import time
import urllib.parse

import aiohttp
import msgpack
import orjson
import yarl
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rulesets.model import View

from . import groups as wg
from .feed import ChangeFeed, stream_text
from .auth import (GRANTED, LAPSED, MAX_KEY_BYTES, Authenticator, Grants, Proof, ProofRefused,
                   Unauthorized, parse_proof, valid_bucket)
from .tracking import SCANNING, bucket_glob_message, bucket_is_glob

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
            self.loop.call_soon_threadsafe(self._wake, buckets)

    def _wake(self, buckets) -> None:
        self.feed.committed(buckets)
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


def _int_arg(request, name, default, lo: int, hi: int, *, clamp: bool = False) -> int:
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


def _float_arg(request, name, default, hi) -> float:
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


def _version(text: str | None, what: str) -> int:
    if text is None or not VERSION.fullmatch(text) or int(text) > MAX_VERSION:
        raise ApiError(400, "bad_request", f"{what} must be a version: an integer from 0 to 2^64-1")
    return int(text)


def _key(text: str, what: str) -> str:
    if not text or len(text.encode()) > MAX_KEY_BYTES:
        raise ApiError(400, "bad_request", f"{what} must be 1 to {MAX_KEY_BYTES} bytes of UTF-8")
    return text


class Api:
    def __init__(self, engine, consumer, metrics, auth: Authenticator, grants: Grants,
                 s3_endpoint: str | None, *, proof_timeout: float = 10.0, groups: "wg.Groups",
                 sharding=None):
        self.engine = engine
        self.groups = groups
        # this handler's shard (eventhandler/sharding.py); None: the only handler, no map
        self.sharding = sharding
        self.shard: str | None = sharding.shard if sharding is not None else None
        self.consumer = consumer
        self.metrics = metrics
        self.auth = auth
        self.grants = grants
        self.s3_endpoint = s3_endpoint
        self.proof_timeout = proof_timeout
        self.hub: Hub | None = None
        self.session: aiohttp.ClientSession | None = None
        self.started = time.time()
        # view id -> {client name: when it registered the view} (GET /v1/status: its mounts)
        self.registered_by: dict[str, dict[str, float]] = {}

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_BODY)
        app.router.add_post("/v1/views", self.register)
        app.router.add_get("/v1/views/log", self.view_log)
        app.router.add_delete("/v1/views/{id}", self.unregister)
        app.router.add_post("/v1/proofs", self.prove)
        app.router.add_get("/v1/views/{id}/objects", self.list_objects)
        app.router.add_get("/v1/views/{id}/changes", self.changes)
        app.router.add_get("/v1/views/{id}/stream", self.stream)
        app.router.add_post("/v1/views/{id}/groups/{group}/members", self.group_join)
        app.router.add_delete("/v1/views/{id}/groups/{group}/members/{member}", self.group_leave)
        app.router.add_post("/v1/views/{id}/groups/{group}/claim", self.group_claim)
        app.router.add_post("/v1/views/{id}/groups/{group}/renew", self.group_renew)
        app.router.add_post("/v1/views/{id}/groups/{group}/done", self.group_done)
        app.router.add_get("/v1/views/{id}/groups/{group}", self.group_status)
        app.router.add_get("/v1/objects/{bucket}/{key:.+}", self.lookup)
        app.router.add_post("/v1/reconcile", self.reconcile)
        app.router.add_get("/v1/status", self.status)
        app.router.add_get("/v1/shards", self.shards)
        app.router.add_post("/v1/shards/handoff", self.handoff)
        app.router.add_get("/healthz", self.health)
        app.router.add_get("/metrics", self.prom)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app) -> None:
        self.hub = Hub(asyncio.get_running_loop(), ChangeFeed(self.engine))
        self.engine.add_listener(self.hub.changed)
        ca = os.environ.get("AWS_CA_BUNDLE")  # the store's CA, as for the S3 clients
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca) if ca else True)
        self.session = aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=self.proof_timeout))

    async def _cleanup(self, app) -> None:
        if self.session:
            await self.session.close()

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        try:
            try:  # the query as the client sent it: undecodable text is an error, not U+FFFD
                urllib.parse.parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True,
                                       errors="strict")
            except UnicodeDecodeError:
                raise ApiError(400, "bad_request", "the query string is not valid UTF-8") from None
            if request.path.startswith("/v1/"):
                request["principal"] = self._principal(request)
            return await handler(request)
        except ApiError as exc:
            return reply(request, {"error": exc.code, "message": exc.message, **exc.extra}, exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return reply(request, {"error": exc.reason.lower().replace(" ", "_"), "message": exc.text or exc.reason},
                         exc.status)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:  # a bug: logged here, never a traceback to the client
            log.exception("%s %s failed", request.method, request.path)
            return reply(request, {"error": "internal", "message": "internal error (see the handler's log)"}, 500)

    def _principal(self, request: web.Request) -> str:
        try:
            return self.auth.principal(request.headers.get("Authorization"))
        except Unauthorized as exc:
            raise ApiError(401, "unauthorized", str(exc)) from None

    def _owned(self, bucket: str) -> None:
        """Returns when this handler serves ``bucket``; else 421 naming its owner."""
        if self.sharding is not None and not self.sharding.owns(bucket):
            fields = self.sharding.misdirected(bucket)
            raise ApiError(421, "misdirected", f"bucket {bucket!r} belongs to shard {fields['owner']!r} "
                           f"({', '.join(fields['urls'])}), not to shard {self.shard!r}", **fields)

    def _authorize(self, principal: str, bucket: str, key: str, unknown: ApiError) -> None:
        """Returns when ``principal`` holds a grant of ``bucket`` covering ``key``; raises
        ``unknown`` (the answer for what does not exist) when it holds none."""
        status = self.grants.status(principal, bucket, key)
        if status == GRANTED:
            return
        if status == LAPSED:
            raise ApiError(403, "proof_expired", f"your proof of list rights on bucket {bucket!r} for "
                           "this has expired: present a new one (POST /v1/proofs, or register again)",
                           bucket=bucket)
        raise unknown

    def _view(self, request):
        vid = request.match_info["id"]
        if not VIEW_ID.fullmatch(vid):
            raise ApiError(400, "bad_request", "a view id is 16 lowercase hex digits")
        unknown = ApiError(404, "not_found", f"no view {vid} that you may read (unknown id, or no "
                           "valid proof of list rights on its bucket and root: register it with one)")
        info = self.engine.views_by_id.get(vid)
        if info is None:
            raise unknown
        self._authorize(request["principal"], info.bucket, info.view.root, unknown)
        self._owned(info.bucket)  # a bucket being handed off
        self.engine.touch(info)  # in use: not forgotten (--view-ttl)
        return info

    def _readable(self, principal: str, info) -> bool:
        return self.grants.status(principal, info.bucket, info.view.root) == GRANTED

    # ---- proofs ------------------------------------------------------------------

    def _proof_urls(self, proof, *, owned: bool = True) -> list[tuple[str, str]]:
        """(bucket, URL) pairs of a request's ``proof``: {bucket: URL or [URL, ...]}, of
        buckets this shard serves (``owned``; else 421)."""
        if proof is None:
            return []
        if not isinstance(proof, dict):
            raise ApiError(400, "bad_request", "proof must map bucket -> presigned URL (or a list of them)")
        pairs = []
        for bucket, urls in proof.items():
            if not valid_bucket(bucket):
                raise ApiError(400, "bad_request", f"proof names no valid bucket: {str(bucket)[:80]!r}")
            if owned:
                self._owned(bucket)
            urls = [urls] if isinstance(urls, str) else urls
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ApiError(400, "bad_request", f"proof of bucket {bucket!r}: a URL or a list of URLs")
            pairs += [(bucket, u) for u in urls]
        if len(pairs) > MAX_PROOFS:
            raise ApiError(400, "bad_request", f"at most {MAX_PROOFS} proofs in one request")
        return pairs

    async def _accept_proofs(self, principal: str, pairs: list[tuple[str, str]]) -> list[Proof]:
        """Check and fetch each proof; record the grants of those the store answers 200.
        Raises 403 for the first refused one (the grants of the others are kept)."""
        now = time.time()
        proofs = []
        for bucket, url in dict.fromkeys(pairs):
            try:
                proofs.append(parse_proof(url, bucket=bucket, principal=principal,
                                          endpoint=self.s3_endpoint, now=now))
            except ProofRefused as exc:
                raise ApiError(403, "proof_expired" if exc.expired else "forbidden",
                               f"proof for bucket {bucket!r}: {exc}", bucket=bucket) from None
        failures = await asyncio.gather(*(self._fetch_proof(p) for p in proofs))
        for proof, failure in zip(proofs, failures):
            if failure is None:
                self.grants.add(principal, proof.bucket, proof.prefix, proof.until)
        for proof, failure in zip(proofs, failures):
            if failure is not None:
                raise ApiError(403, "forbidden", f"proof for bucket {proof.bucket!r}: {failure}",
                               bucket=proof.bucket)
        return proofs

    async def _fetch_proof(self, proof: Proof) -> str | None:
        """None when the store answers the proof with 200, else why not."""
        try:  # encoded=True: the query exactly as signed; never a redirect to elsewhere
            async with self.session.get(yarl.URL(proof.url, encoded=True), allow_redirects=False) as resp:
                status = resp.status
                await resp.content.read(65536)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return f"could not be checked with the object store: {type(exc).__name__}: {exc}"
        if status != 200:
            return (f"the object store refused it (HTTP {status}): the credentials that signed it "
                    f"cannot list prefix {proof.prefix!r}, or it expired")
        return None

    async def prove(self, request: web.Request):
        """Fresh proofs for grants that are about to expire (or were lost)."""
        body = await read_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "bad_request", 'body must be {"proof": {bucket: URL or [URL, ...]}}')
        pairs = self._proof_urls(body.get("proof"))
        if not pairs:
            raise ApiError(400, "bad_request", "no proof in the request")
        proofs = await self._accept_proofs(request["principal"], pairs)
        for p in proofs:  # a mount renewing its proofs uses its views
            self.engine.touch_covered(request["principal"], p.bucket, p.prefix)
        log.info("%s renewed its proofs for %s", request["principal"],
                 ", ".join(sorted({p.bucket for p in proofs})))
        return reply(request, {"grants": [{"bucket": p.bucket, "prefix": p.prefix, "until": p.until}
                                          for p in proofs]})

    # ---- views -------------------------------------------------------------------

    async def register(self, request: web.Request):
        principal = request["principal"]
        body = await read_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("views"), list):
            raise ApiError(400, "bad_request", 'body must be {"client", "views": [...], "proof": {...}}')
        if len(body["views"]) > MAX_VIEWS:
            raise ApiError(400, "bad_request", f"at most {MAX_VIEWS} views in one registration")
        views, roots = [], []
        for v in body["views"]:
            if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not isinstance(v.get("spec"), dict) \
                    or not 0 < len(v["name"]) <= MAX_VIEW_NAME:
                raise ApiError(400, "invalid_view", 'each view must be {"name": str (1-255 characters), '
                               '"spec": {...}}')
            name, bucket = v["name"], v["spec"].get("bucket")
            if not isinstance(bucket, str) or not bucket:
                raise ApiError(400, "invalid_view", f"view {name!r}: spec.bucket must be a bucket name")
            if bucket_is_glob(bucket):  # before the proof: a glob has no presigned URL
                raise ApiError(400, "invalid_view", bucket_glob_message(name, bucket))
            if not valid_bucket(bucket):
                raise ApiError(400, "invalid_view", f"view {name!r}: {bucket[:80]!r} is no valid bucket name")
            self._owned(bucket)
            try:  # the root every key of the view starts with: what a proof must cover
                root = View.from_filter_spec(name, v["spec"]).root
            except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
                raise ApiError(400, "invalid_view", f"view {name!r}: invalid spec: {exc}") from None
            views.append((name, v["spec"]))
            roots.append((bucket, root))
        await self._accept_proofs(principal, self._proof_urls(body.get("proof")))
        for bucket, root in dict.fromkeys(roots):
            if self.grants.status(principal, bucket, root) != GRANTED:
                raise ApiError(403, "forbidden", f"no valid proof for bucket {bucket!r}, prefix {root!r}: "
                               "send a presigned ListObjectsV2 URL of that prefix (or of a prefix of "
                               "it), bound to you, made with your credentials", bucket=bucket)
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(None, functools.partial(self.engine.register, views,
                                                                     principal=principal))
        except ValueError as exc:
            raise ApiError(400, "invalid_view", str(exc)) from None
        log.info("%s (client %r) registered %s", principal, str(body.get("client"))[:200],
                 [(v["name"], v["id"]) for v in out])
        for v in out:
            self._registered(v["id"], f"{principal}/{str(body.get('client'))[:200]}")
        return reply(request, {"views": out})

    async def unregister(self, request: web.Request):
        """Drop the caller's registration of a view; the view is forgotten with the last one."""
        vid = request.match_info["id"]
        if not VIEW_ID.fullmatch(vid):
            raise ApiError(400, "bad_request", "a view id is 16 lowercase hex digits")
        forgotten = await asyncio.get_running_loop().run_in_executor(
            None, self.engine.unregister, vid, request["principal"])
        if forgotten is None:
            raise ApiError(404, "not_found", f"no view {vid} registered by you")
        return reply(request, {"id": vid, "forgotten": forgotten})

    async def view_log(self, request: web.Request):
        """The registration log (registered, unregistered, forgotten), of the views whose
        bucket and root the caller holds a grant for."""
        after = _int_arg(request, "after", 0, 0, MAX_VERSION)
        entries = await asyncio.get_running_loop().run_in_executor(None, self.engine.view_log, after)
        principal = request["principal"]
        readable = [e for e in entries if self.grants.status(principal, e["bucket"], e["root"]) == GRANTED]
        for e in readable:  # who else uses a view is theirs to know
            if e["principal"] not in (None, principal):
                e["principal"] = "(another principal)"
        return reply(request, {"entries": readable})

    async def _wait_ready(self, info, wait: float) -> None:
        if self.engine.view_ready(info):
            return
        deadline = time.monotonic() + wait
        while not self.engine.view_ready(info):
            left = deadline - time.monotonic()
            if left <= 0:
                bs = self.engine.buckets.get(info.bucket)
                progress = {}
                if bs is not None and bs.state == SCANNING:  # (else a new view's rematch)
                    progress["listed"] = bs.scan_listed  # objects the first scan has listed so far
                    scan = self.engine.scan_progress.get(info.bucket)
                    if scan is not None:  # its rate, and the time left when a total is known
                        report = scan.report()
                        progress.update(rate=report["rate"], eta=report["eta"])
                    if bs.scan_error:
                        progress["scan_error"] = bs.scan_error  # its last attempt failed: retried
                raise ApiError(503, "scanning", f"view {info.id} is still being built (bucket scan)",
                               **progress)
            await asyncio.sleep(min(0.05, left))

    async def list_objects(self, request: web.Request):
        info = self._view(request)
        limit = _int_arg(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, clamp=True)
        after = request.query.get("after") or None
        if after is not None:
            _key(after, "after")
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
        if not request.query.get("since"):
            raise ApiError(400, "bad_request", "since=V is required (the version of your listing)")
        since = _version(request.query["since"], "since")
        limit = _int_arg(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, clamp=True)
        wait = _float_arg(request, "wait", 0.0, 60.0)
        await self._wait_ready(info, 30.0 if wait else 0.0)
        deadline = time.monotonic() + wait
        grant_end = self.grants.until(request["principal"], info.bucket, info.view.root)
        while True:
            ev = self.hub.event(info.bucket)
            res = await self._changes(info, since, limit)
            if res["changes"] or res["more"]:
                return reply(request, res)
            # a long poll waits no longer than the grant lasts
            left = min(deadline - time.monotonic(), grant_end - time.time())
            if left <= 0:
                return reply(request, res)
            since = max(since, res["version"])
            try:
                await asyncio.wait_for(ev.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def stream(self, request: web.Request):
        info = self._view(request)
        principal = request["principal"]
        since = _version(request.headers.get("Last-Event-ID") or request.query.get("since"),
                         "since (or Last-Event-ID)")
        await self._wait_ready(info, 30.0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        feed = self.hub.feed
        feed.open(info.bucket)
        try:
            while True:
                # the stream lasts as long as the grant (renewed by the client's proofs)
                left = self.grants.until(principal, info.bucket, info.view.root) - time.time()
                if left <= 0:
                    return resp
                ev = feed.event(info)
                try:  # from the feed's memory (shared by the streams), else the store
                    text, version, more = feed.encoded(info, since, 1000) or self._stream_chunk(info, since)
                    self._check_since(info, since)  # after the read, as _changes
                except ApiError as exc:  # outside the change log
                    data = orjson.dumps({"version": exc.extra["version"]})
                    await resp.write(b"event: resync\ndata: " + data + b"\n\n")
                    return resp
                if text:
                    await resp.write(text)
                since = max(since, version)
                if more:
                    continue
                try:
                    await asyncio.wait_for(ev.wait(), min(15.0, left))
                except asyncio.TimeoutError:
                    await resp.write(b": keepalive\n\n")
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # the 200 is sent: end the stream; the client reconnects
            log.exception("change stream of view %s failed", info.id)
        finally:
            feed.close(info.bucket)
        return resp

    def _stream_chunk(self, info, since: int) -> tuple[bytes, int, bool]:
        res = self.engine.changes(info, since, 1000)
        return stream_text(res["changes"]), res["version"], res["more"]

    # ---- work-queue groups (eventhandler/groups.py) ---------------------------------------

    def _group(self, request, *, create: bool = False):
        """The view (authorized as every view request) and the group named in the path;
        404 for a group that does not exist (unless ``create``: then None)."""
        info = self._view(request)
        name = request.match_info["group"]
        if not wg.NAME.fullmatch(name):
            raise ApiError(400, "bad_request", "a group name is 1 to 64 of A-Z a-z 0-9 . _ -")
        group = self.groups.get(info.id, name)
        if group is None and not create:
            raise ApiError(404, "not_found", f"no group {name!r} of view {info.id}: join it first")
        return info, name, group

    @staticmethod
    async def _group_body(request) -> dict:
        body = await read_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "bad_request", 'body must be {"member": ID, ...}')
        return body

    @staticmethod
    def _member_id(mid) -> str:
        if not isinstance(mid, str) or not wg.MEMBER.fullmatch(mid):
            raise ApiError(400, "bad_request", "member must be 1 to 128 of A-Z a-z 0-9 . _ : @ -")
        return mid

    def _member(self, request, group, mid, client: str = "") -> "wg.Member":
        member = group.member(self._member_id(mid), request["principal"], client, time.time())
        if member is None:
            raise ApiError(403, "forbidden", f"member {mid!r} of group {group.name!r} is another principal's")
        return member

    @staticmethod
    def _number(body: dict, name: str, default, lo, hi, kind=float):
        value = body.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi \
                or (kind is int and value != int(value)):
            raise ApiError(400, "bad_request", f"{name} must be a number from {lo} to {hi}")
        return kind(value)

    async def _catch_up(self, info, group, relist: bool = False) -> None:
        """Give the group the files of its view it has not seen (one catch-up at a time;
        a whole listing is read off the loop)."""
        async with group.lock:
            while relist or group.cursor != self.engine.buckets[info.bucket].committed:
                if relist or wg.needs_listing(self.engine, info, group):
                    news = await asyncio.get_running_loop().run_in_executor(
                        None, wg.read_news, self.engine, info, group, True)
                else:  # a page of changes inline, as the change stream reads it
                    news = wg.read_news(self.engine, info, group, False)
                group.feed(news)
                if not news["more"]:
                    return
                relist = False
                await asyncio.sleep(0)  # the loop's other requests between pages

    async def group_join(self, request: web.Request):
        """Join a group (made by the first join, with its lease and max_failures); with
        ``existing`` the files already in the view that the group has not seen become work."""
        info, name, group = self._group(request, create=True)
        body = await self._group_body(request)
        self._member_id(body.get("member"))  # (checked before a group is made)
        lease = self._number(body, "lease", wg.DEFAULT_LEASE, *wg.LEASE_RANGE)
        max_failures = self._number(body, "max_failures", wg.DEFAULT_MAX_FAILURES,
                                    *wg.MAX_FAILURES_RANGE, kind=int)
        await self._wait_ready(info, 30.0)
        if group is None:
            group = self.groups.get(info.id, name)  # (made meanwhile by another join)
        if group is None:
            group = self.groups.create(info.id, name, lease, max_failures,
                                       self.engine.buckets[info.bucket].committed)
            log.info("%s made group %r of view %s (lease %g s, %d attempts)", request["principal"],
                     name, info.id, lease, max_failures)
        member = self._member(request, group, body.get("member"), str(body.get("client") or "")[:200])
        await self._catch_up(info, group, relist=bool(body.get("existing")))
        return reply(request, {"group": name, "view": info.id, "member": member.id,
                               "lease": group.lease, "max_failures": group.max_failures})

    async def group_leave(self, request: web.Request):
        """A member leaves: the files it holds go to the others (the attempts not counted)."""
        _info, _name, group = self._group(request)
        member = self._member(request, group, request.match_info["member"])
        return reply(request, {"released": group.release(member.id)})

    async def group_claim(self, request: web.Request):
        """Up to ``max`` files for the member, each now in flight at it for a lease; waits
        up to ``wait`` seconds for one (a long poll)."""
        info, _name, group = self._group(request)
        body = await self._group_body(request)
        n = self._number(body, "max", 1, 1, 1000, kind=int)
        wait = self._number(body, "wait", 0.0, 0.0, 60.0)
        member = self._member(request, group, body.get("member"))
        deadline = time.monotonic() + wait
        grant_end = self.grants.until(request["principal"], info.bucket, info.view.root)
        member.waiting += 1
        try:
            while True:
                changed, released = self.hub.event(info.bucket), group.event
                await self._catch_up(info, group)
                now = time.time()
                files = group.claim(member.id, n, now)
                left = min(deadline - time.monotonic(), grant_end - now)
                if files or left <= 0 or member.id not in group.members:
                    return reply(request, {"files": files, "lease": group.lease})
                waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(released.wait())]
                # a lease that runs out meanwhile makes its file claimable
                await asyncio.wait(waits, timeout=max(0.0, min(left, group.next_expiry() - now)),
                                   return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
        finally:
            member.waiting -= 1
            member.seen = time.time()

    async def group_renew(self, request: web.Request):
        """Renew the leases of every file the member holds; answers the keys it holds
        (a file missing there was lost to another member)."""
        _info, _name, group = self._group(request)
        body = await self._group_body(request)
        member = self._member(request, group, body.get("member"))
        return reply(request, {"held": group.renew(member.id, time.time()), "lease": group.lease})

    async def group_done(self, request: web.Request):
        """The member is done with a file: ``ok`` true acknowledges it, false counts a
        failed attempt (``error``: why)."""
        _info, _name, group = self._group(request)
        body = await self._group_body(request)
        member = self._member(request, group, body.get("member"))
        key = body.get("key")
        if not isinstance(key, str):
            raise ApiError(400, "bad_request", "key must be the file's key")
        _key(key, "key")
        error = body.get("error")
        state = group.finish(member.id, key, body.get("ok") is not False,
                             error if isinstance(error, str) else None)
        return reply(request, {"key": key, "state": state})

    async def group_status(self, request: web.Request):
        info, _name, group = self._group(request)
        await self._catch_up(info, group)
        return reply(request, group.report(time.time()))

    def _object_path(self, request: web.Request) -> tuple[str, str]:
        """Bucket and key decoded strictly from the raw path (aiohttp keeps undecodable
        escapes such as %FF as text)."""
        raw = request.rel_url.raw_path[len("/v1/objects/"):]
        raw_bucket, _, raw_key = raw.partition("/")
        try:
            bucket = urllib.parse.unquote_to_bytes(raw_bucket).decode("utf-8")
            key = urllib.parse.unquote_to_bytes(raw_key).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "bad_request", "bucket and key must be percent-encoded UTF-8") from None
        if not valid_bucket(bucket):
            raise ApiError(400, "bad_request", f"{bucket[:80]!r} is no valid bucket name")
        return bucket, _key(key, "the key")

    async def lookup(self, request: web.Request):
        bucket, key = self._object_path(request)
        principal = request["principal"]
        self._owned(bucket)
        unknown = ApiError(404, "not_found", f"no object {bucket}/{key} known to the handler "
                           "(or none that you may read)")
        self._authorize(principal, bucket, key, unknown)
        obj = self.engine.lookup(bucket, key)
        if obj is None:
            raise unknown
        by_id = self.engine.views_by_id
        obj["views"] = [vid for vid in obj["views"] if vid in by_id and self._readable(principal, by_id[vid])]
        return reply(request, obj)

    async def reconcile(self, request: web.Request):
        principal = request["principal"]
        bucket = request.query.get("bucket") or None
        if bucket is not None:
            if not valid_bucket(bucket):
                raise ApiError(400, "bad_request", f"{bucket[:80]!r} is no valid bucket name")
            self._owned(bucket)
            unknown = ApiError(404, "not_found", f"bucket {bucket!r} is not tracked (no view names it), "
                               "or you hold no proof of list rights on all of it")
            if bucket not in self.engine.buckets:
                raise unknown
            self._authorize(principal, bucket, "", unknown)
            buckets = [bucket]
        else:  # all tracked buckets that this principal may list whole
            buckets = [b for b in self.engine.buckets if self.grants.status(principal, b, "") == GRANTED]
        loop = asyncio.get_running_loop()
        counts = {}
        for b in buckets:
            counts.update(await loop.run_in_executor(None, self.engine.reconcile, b))
        return reply(request, {"buckets": counts})

    # ---- operations ------------------------------------------------------------------

    async def health(self, request: web.Request):
        """The status for anyone; details for a principal, about what it may read."""
        amqp = "connected" if self.consumer is None or self.consumer.connected.is_set() else "reconnecting"
        source = getattr(self.consumer, "kind", "amqp")  # the event source: "amqp" or "sqs"
        scan_errors = {b: s.scan_error for b, s in self.engine.buckets.items() if s.scan_error}
        status = "ok" if amqp == "connected" and not scan_errors else "degraded"
        if not (self.auth.open or request.headers.get("Authorization")):
            return reply(request, {"status": status})
        principal = self._principal(request)
        readable = self.grants.buckets(principal)
        data = {"status": status, "principal": principal, source: amqp,
                "views": sum(1 for info in self.engine.infos if self._readable(principal, info)),
                "buckets": {b: s.state for b, s in self.engine.buckets.items() if b in readable},
                "uptime": round(time.time() - self.started, 3)}
        if self.consumer is not None and self.consumer.last_error and amqp != "connected":
            data[f"{source}_error"] = self.consumer.last_error
        scan_errors = {b: e for b, e in scan_errors.items() if b in readable}
        if scan_errors:  # first scans failing and being retried
            data["scan_errors"] = scan_errors
        return reply(request, data)

    MAX_REGISTRATIONS = 1000  # clients remembered per view (the oldest are forgotten)

    def _registered(self, vid: str, client: str) -> None:
        clients = self.registered_by.setdefault(vid, {})
        clients.pop(client, None)
        clients[client] = time.time()
        while len(clients) > self.MAX_REGISTRATIONS:
            del clients[next(iter(clients))]

    async def status(self, request: web.Request):
        """What the handler is doing, as far as the caller may see it (docs/API.md)."""
        principal = request["principal"]
        readable = self.grants.buckets(principal)
        now = time.time()
        consumer = self.consumer
        source = {"kind": getattr(consumer, "kind", "amqp"),
                  "state": "connected" if consumer is None or consumer.connected.is_set() else "reconnecting",
                  "queue": getattr(consumer, "queue", None),
                  "messages": self.metrics.queue_depth}  # waiting in the queue (None: not sampled yet)
        if consumer is not None and consumer.last_error and source["state"] != "connected":
            source["error"] = consumer.last_error
        newest = self.metrics.newest_event
        source["newest_event_age"] = round(now - newest, 3) if newest else None
        buckets = {}
        for name, bs in list(self.engine.buckets.items()):
            if name not in readable:
                continue
            b = {"state": bs.state, "scanned": bs.scanned or None}
            scan = self.engine.scan_progress.get(name)
            if scan is not None:
                b["listing"] = scan.report()
            if bs.scan_error:
                b["scan_error"] = bs.scan_error
            buckets[name] = b
        views = []
        by_id = self.engine.views_by_id
        for vid in [vid for vid in self.registered_by if vid not in by_id]:  # forgotten views
            del self.registered_by[vid]
        for info in list(self.engine.infos):
            if not self._readable(principal, info):
                continue
            clients = self.registered_by.get(info.id, {})
            # no names nor rules: those are the registering clients' (other principals' too)
            views.append({"id": info.id, "bucket": info.bucket, "root": info.view.root or "",
                          "ready": self.engine.view_ready(info), "clients": len(clients),
                          "last_registered": max(clients.values(), default=None),
                          "registrants": len(getattr(info, "principals", None) or ()),
                          "last_used": getattr(info, "used", None)})
        groups = []
        for info in list(self.engine.infos):
            if self._readable(principal, info) and self.engine.view_ready(info):
                for group in self.groups.of_view(info.id):
                    await self._catch_up(info, group)
                    groups.append(group.report(now))
        count, recent = self.metrics.dead_letters.snapshot()
        # reasons only of buckets the caller may read (or of messages naming none)
        recent = [d for d in recent if d["bucket"] is None or d["bucket"] in readable][-5:]
        return reply(request, {"principal": principal, "uptime": round(now - self.started, 3),
                               "source": source, "buckets": buckets, "views": views,
                               "groups": groups, "dead_letters": {"count": count, "recent": recent}})

    # ---- shards ----------------------------------------------------------------------

    async def shards(self, request: web.Request):
        """The shard map this handler serves (docs/API.md, ``GET /v1/shards``)."""
        if self.sharding is None:
            return reply(request, {"shard": None, "shards": None, "placements": {}})
        sharding = self.sharding
        readable = self.grants.buckets(request["principal"])
        owned = sorted(b for b in self.engine.buckets if b in readable and sharding.owns(b))
        return reply(request, {"shard": sharding.shard, **sharding.map.as_json(),
                               "map": sharding.map.text(), "buckets": owned,
                               "foreign_events": sharding.foreign_events})

    async def handoff(self, request: web.Request):
        """Place a bucket on shard ``to``: ``{"bucket", "to", "proof"}`` from a principal
        that may list the whole bucket, sent to every shard (``delvefs shards move``: to
        ``to`` first, its old owner last). ``to`` itself takes the bucket (it binds and
        scans it when mounts register there). Any other shard answers 421 naming ``to``
        from then on; the old owner stops receiving the bucket's events, applies what is
        queued, and forgets its views and records."""
        if self.sharding is None:
            raise ApiError(400, "bad_request", "this handler is no shard (it has no shard map)")
        body = await read_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("bucket"), str) \
                or not isinstance(body.get("to"), str):
            raise ApiError(400, "bad_request", 'body must be {"bucket", "to", "proof": {bucket: URL}}')
        bucket, to = body["bucket"], body["to"]
        if not valid_bucket(bucket):
            raise ApiError(400, "bad_request", f"{bucket[:80]!r} is no valid bucket name")
        if to not in self.sharding.map.shards:
            raise ApiError(400, "bad_request", f"no shard {to!r} in the map")
        principal = request["principal"]
        await self._accept_proofs(principal, self._proof_urls(body.get("proof"), owned=False))
        if self.grants.status(principal, bucket, "") != GRANTED:
            raise ApiError(403, "forbidden", f"handing off bucket {bucket!r} needs a proof of list "
                           "rights on all of it", bucket=bucket)
        was_owner = self.sharding.owner(bucket)
        loop = asyncio.get_running_loop()
        self.sharding.hand_off(bucket, to)  # from here on: 421 for it, unless it is ours now
        drained = {"unbound": False, "forgotten": []} if to == self.shard else \
            await loop.run_in_executor(None, self._release, bucket, to)
        log.warning("%s handed bucket %s from shard %s to shard %s", principal, bucket, was_owner, to)
        return reply(request, {"bucket": bucket, "from": was_owner, "to": to, **drained})

    def _release(self, bucket: str, to: str) -> dict:
        unbound = self.consumer.release(bucket) if hasattr(self.consumer, "release") else False
        views = self.engine.release_bucket(bucket, f"handed off to shard {to}")
        return {"unbound": unbound, "forgotten": views}

    async def prom(self, request: web.Request):
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
