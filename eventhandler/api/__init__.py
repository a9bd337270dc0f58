"""The HTTP API (aiohttp), as documented in docs/API.md. Runs on the asyncio loop of the
main thread; LevelDB reads of more than a few records go to the default executor so the
loop stays responsive. Long polls and streams sleep on a per-bucket asyncio.Event that the
engine's writer threads set through ``loop.call_soon_threadsafe`` after each commit.

Every ``/v1`` request is made by a principal (its bearer token, eventhandler/auth.py) and
reads only what that principal holds a grant for: a view while a grant of its bucket covers
its root, an object while one covers its key. A view or object it may not read is answered
like an unknown one (404), or 403 "proof_expired" when its grant has lapsed. Malformed
requests are 4xx before anything is read or streamed.

The routes, by concern: views and objects (``views``), work-queue groups (``groups``),
shards (``shards``), operators' (``operations``); what they share: ``core`` (the caller,
its grants, this shard's buckets) and ``common`` (errors, encoding, parameters).
"""
from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse

import aiohttp
from aiohttp import web

from .. import groups as wg
from ..auth import Authenticator, Grants
from ..feed import ChangeFeed
from .common import MAX_BODY, ApiError, Hub, log, reply
from .core import ApiCore
from .groups import GroupRoutes
from .operations import OperationRoutes
from .shards import ShardRoutes
from .views import ViewRoutes


class Api:
    def __init__(self, engine, consumer, metrics, auth: Authenticator, grants: Grants,
                 s3_endpoint: str | None, *, proof_timeout: float = 10.0, groups: "wg.Groups",
                 sharding=None):
        self.core = ApiCore(engine, consumer, metrics, auth, grants, s3_endpoint,
                            proof_timeout=proof_timeout, groups=groups, sharding=sharding)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_BODY)
        views, groups = ViewRoutes(self.core), GroupRoutes(self.core)
        shards, operations = ShardRoutes(self.core), OperationRoutes(self.core)
        router = app.router
        router.add_post("/v1/views", views.register)
        router.add_get("/v1/views/log", views.view_log)
        router.add_delete("/v1/views/{id}", views.unregister)
        router.add_post("/v1/proofs", views.prove)
        router.add_get("/v1/views/{id}/objects", views.list_objects)
        router.add_get("/v1/views/{id}/changes", views.changes)
        router.add_get("/v1/views/{id}/stream", views.stream)
        router.add_post("/v1/views/{id}/groups/{group}/members", groups.group_join)
        router.add_delete("/v1/views/{id}/groups/{group}/members/{member}", groups.group_leave)
        router.add_post("/v1/views/{id}/groups/{group}/claim", groups.group_claim)
        router.add_post("/v1/views/{id}/groups/{group}/renew", groups.group_renew)
        router.add_post("/v1/views/{id}/groups/{group}/done", groups.group_done)
        router.add_get("/v1/views/{id}/groups/{group}", groups.group_status)
        router.add_get("/v1/objects/{bucket}/{key:.+}", views.lookup)
        router.add_post("/v1/objects/wait", views.wait_objects)
        router.add_post("/v1/reconcile", operations.reconcile)
        router.add_get("/v1/status", operations.status)
        router.add_get("/v1/shards", shards.shards)
        router.add_post("/v1/shards/handoff", shards.handoff)
        router.add_get("/healthz", operations.health)
        router.add_get("/metrics", operations.prom)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app) -> None:
        core = self.core
        core.hub = Hub(asyncio.get_running_loop(), ChangeFeed(core.engine))
        core.engine.add_listener(core.hub.changed)
        ca = os.environ.get("AWS_CA_BUNDLE")  # the store's CA, as for the S3 clients
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=ca) if ca else True)
        core.session = aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=core.proof_timeout))

    async def _cleanup(self, app) -> None:
        if self.core.session:
            await self.core.session.close()

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        try:
            try:  # the query as the client sent it: undecodable text is an error, not U+FFFD
                urllib.parse.parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True,
                                       errors="strict")
            except UnicodeDecodeError:
                raise ApiError(400, "bad_request", "the query string is not valid UTF-8") from None
            if request.path.startswith("/v1/"):
                request["principal"] = self.core.principal(request)
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
