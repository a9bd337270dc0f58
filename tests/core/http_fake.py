"""The fake handler (tests/core/fakes.py) behind a real HTTP server (aiohttp), so the
mount process can be tried against docs/API.md without the real event handler.

    python -m tests.core.http_fake PORT VIEWS.yaml   # lists the views' buckets from S3
"""
from __future__ import annotations

import sys

import msgpack
from aiohttp import web

from delvefs.handler_client import Resync

from .fakes import FakeHandler


def app_for(fake: FakeHandler) -> web.Application:
    def reply(request, body, status=200):
        if "application/msgpack" in request.headers.get("Accept", ""):
            return web.Response(body=msgpack.packb(body), status=status, content_type="application/msgpack")
        return web.json_response(body, status=status)

    async def health(request):
        return web.json_response({"status": "ok"})

    async def register(request):
        body = await request.json()
        return reply(request, {"views": await fake.register(body["client"], body["views"], body["proof"])})

    async def objects(request):
        q = request.query
        return reply(request, await fake.list_page(request.match_info["id"], q.get("after"),
                                                   int(q.get("limit", 5000))))

    async def changes(request):
        q = request.query
        try:
            return reply(request, await fake.changes(request.match_info["id"], int(q["since"]),
                                                     int(q.get("limit", 5000))))
        except Resync as exc:
            return reply(request, {"error": "resync", "version": exc.version}, 410)

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/v1/views", register)
    app.router.add_get("/v1/views/{id}/objects", objects)
    app.router.add_get("/v1/views/{id}/changes", changes)
    return app


if __name__ == "__main__":
    import boto3  # noqa: F401  (through delvefs.s3)
    from delvefs import s3
    from rulesets.loader import load_views
    port, views_file = int(sys.argv[1]), sys.argv[2]
    fake = FakeHandler()
    client = s3.make_client()
    for v in load_views(views_file):
        from rulesets.globs import glob_match
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=v.bucket):
            for o in page.get("Contents", []):
                if v.object is None or glob_match(v.object, o["Key"]):
                    fake.put(v.name, o["Key"], o["Size"], o["ETag"].strip('"'), o["LastModified"].timestamp())
    web.run_app(app_for(fake), host="127.0.0.1", port=port, print=None)
