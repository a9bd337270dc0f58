"""The routes for operators (docs/API.md): health, status, Prometheus metrics, and
reconciling buckets with the store."""
from __future__ import annotations

import asyncio
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..auth import GRANTED, valid_bucket
from .common import ApiError, reply
from .core import Routes
from .groups import catch_up


class OperationRoutes(Routes):
    async def health(self, request: web.Request):
        """The status for anyone; details for a principal, about what it may read."""
        amqp = "connected" if self.core.consumer is None or self.core.consumer.connected.is_set() else "reconnecting"
        source = getattr(self.core.consumer, "kind", "amqp")  # the event source: "amqp" or "sqs"
        scan_errors = {b: s.scan_error for b, s in self.core.engine.buckets.items() if s.scan_error}
        status = "ok" if amqp == "connected" and not scan_errors else "degraded"
        if not (self.core.auth.open or request.headers.get("Authorization")):
            return reply(request, {"status": status})
        principal = self.core.principal(request)
        readable = self.core.grants.buckets(principal)
        data = {"status": status, "principal": principal, source: amqp,
                "views": sum(1 for info in self.core.engine.infos if self.core.readable(principal, info)),
                "buckets": {b: s.state for b, s in self.core.engine.buckets.items() if b in readable},
                "uptime": round(time.time() - self.core.started, 3)}
        if self.core.consumer is not None and self.core.consumer.last_error and amqp != "connected":
            data[f"{source}_error"] = self.core.consumer.last_error
        scan_errors = {b: e for b, e in scan_errors.items() if b in readable}
        if scan_errors:  # first scans failing and being retried
            data["scan_errors"] = scan_errors
        return reply(request, data)

    async def status(self, request: web.Request):
        """What the handler is doing, as far as the caller may see it (docs/API.md)."""
        principal = request["principal"]
        readable = self.core.grants.buckets(principal)
        now = time.time()
        consumer = self.core.consumer
        source = {"kind": getattr(consumer, "kind", "amqp"),
                  "state": "connected" if consumer is None or consumer.connected.is_set() else "reconnecting",
                  "queue": getattr(consumer, "queue", None),
                  "messages": self.core.metrics.queue_depth}  # waiting in the queue (None: not sampled yet)
        if consumer is not None and consumer.last_error and source["state"] != "connected":
            source["error"] = consumer.last_error
        newest = self.core.metrics.newest_event
        source["newest_event_age"] = round(now - newest, 3) if newest else None
        buckets = {}
        for name, bs in list(self.core.engine.buckets.items()):
            if name not in readable:
                continue
            b = {"state": bs.state, "scanned": bs.scanned or None}
            scan = self.core.engine.scan_progress.get(name)
            if scan is not None:
                b["listing"] = scan.report()
            if bs.scan_error:
                b["scan_error"] = bs.scan_error
            buckets[name] = b
        views = []
        by_id = self.core.engine.views_by_id
        for vid in [vid for vid in self.core.registered_by if vid not in by_id]:  # forgotten views
            del self.core.registered_by[vid]
        for info in list(self.core.engine.infos):
            if not self.core.readable(principal, info):
                continue
            clients = self.core.registered_by.get(info.id, {})
            # no names nor rules: those are the registering clients' (other principals' too)
            views.append({"id": info.id, "bucket": info.bucket, "root": info.view.root or "",
                          "ready": self.core.engine.view_ready(info), "clients": len(clients),
                          "last_registered": max(clients.values(), default=None),
                          "registrants": len(getattr(info, "principals", None) or ()),
                          "last_used": getattr(info, "used", None)})
        groups = []
        for info in list(self.core.engine.infos):
            if self.core.readable(principal, info) and self.core.engine.view_ready(info):
                for group in self.core.groups.of_view(info.id):
                    await catch_up(self.core, info, group)
                    groups.append(group.report(now))
        count, recent = self.core.metrics.dead_letters.snapshot()
        # reasons only of buckets the caller may read (or of messages naming none)
        recent = [d for d in recent if d["bucket"] is None or d["bucket"] in readable][-5:]
        watch = self.core.engine.store_watch
        store = watch.status() if watch is not None else None
        if store is not None and not store["reachable"] and not readable:
            store.pop("last_error")  # the store's address is no business of a principal without buckets
        return reply(request, {"principal": principal, "uptime": round(now - self.core.started, 3),
                               "source": source, "store": store, "buckets": buckets, "views": views,
                               "groups": groups, "dead_letters": {"count": count, "recent": recent}})

    async def prom(self, request: web.Request):
        return web.Response(body=generate_latest(self.core.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def reconcile(self, request: web.Request):
        principal = request["principal"]
        bucket = request.query.get("bucket") or None
        if bucket is not None:
            if not valid_bucket(bucket):
                raise ApiError(400, "bad_request", f"{bucket[:80]!r} is no valid bucket name")
            self.core.owned(bucket)
            unknown = ApiError(404, "not_found", f"bucket {bucket!r} is not tracked (no view names it), "
                               "or you hold no proof of list rights on all of it")
            if bucket not in self.core.engine.buckets:
                raise unknown
            self.core.authorize(principal, bucket, "", unknown)
            buckets = [bucket]
        else:  # all tracked buckets that this principal may list whole
            buckets = [b for b in self.core.engine.buckets if self.core.grants.status(principal, b, "") == GRANTED]
        loop = asyncio.get_running_loop()
        counts = {}
        for b in buckets:
            counts.update(await loop.run_in_executor(None, self.core.engine.reconcile, b))
        return reply(request, {"buckets": counts})
