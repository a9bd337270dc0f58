"""The routes of views and objects (docs/API.md): proofs, registering and unregistering
views, the registration log, listings, changes (a long poll) and the change stream, and
object lookups."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import urllib.parse

import orjson
from aiohttp import web

from rulesets.model import View

from ..auth import GRANTED, valid_bucket
from ..feed import stream_text
from ..tracking import READY, bucket_glob_message, bucket_is_glob
from .common import (DEFAULT_LIMIT, MAX_LIMIT, MAX_VERSION, MAX_VIEW_NAME, MAX_VIEWS, VIEW_ID, ApiError,
                     float_arg, int_arg, key_arg, log, read_body, reply, version_arg)
from .core import Routes

log = logging.getLogger("delvefs.eventhandler")

INLINE_OBJECTS = 200  # objects of a listing read on the event loop (~1 µs each)
FENCE_WAIT = 10.0  # longest a `fresh` listing waits for the events the broker held


async def wait_event(ev: asyncio.Event, seconds: float) -> bool:
    """Whether ``ev`` was set within ``seconds``: waited in the calling task (wait_for's
    task for every wait cost a thousand streams more than their writes)."""
    try:
        async with asyncio.timeout(seconds):
            await ev.wait()
        return True
    except TimeoutError:
        return False


class ViewRoutes(Routes):
    async def prove(self, request: web.Request):
        """Fresh proofs for grants that are about to expire (or were lost)."""
        body = await read_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "bad_request", 'body must be {"proof": {bucket: URL or [URL, ...]}}')
        pairs = self.core.proof_urls(body.get("proof"))
        if not pairs:
            raise ApiError(400, "bad_request", "no proof in the request")
        proofs = await self.core.accept_proofs(request["principal"], pairs)
        for p in proofs:  # a mount renewing its proofs uses its views
            self.core.engine.touch_covered(request["principal"], p.bucket, p.prefix)
        log.info("%s renewed its proofs for %s", request["principal"],
                 ", ".join(sorted({p.bucket for p in proofs})))
        return reply(request, {"grants": [{"bucket": p.bucket, "prefix": p.prefix, "until": p.until}
                                          for p in proofs]})

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
            self.core.owned(bucket)
            try:  # the root every key of the view starts with: what a proof must cover
                root = View.from_filter_spec(name, v["spec"]).root
            except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
                raise ApiError(400, "invalid_view", f"view {name!r}: invalid spec: {exc}") from None
            views.append((name, v["spec"]))
            roots.append((bucket, root))
        await self.core.accept_proofs(principal, self.core.proof_urls(body.get("proof")))
        for bucket, root in dict.fromkeys(roots):
            if self.core.grants.status(principal, bucket, root) != GRANTED:
                raise ApiError(403, "forbidden", f"no valid proof for bucket {bucket!r}, prefix {root!r}: "
                               "send a presigned ListObjectsV2 URL of that prefix (or of a prefix of "
                               "it), bound to you, made with your credentials", bucket=bucket)
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(None, functools.partial(self.core.engine.register, views,
                                                                     principal=principal))
        except ValueError as exc:
            raise ApiError(400, "invalid_view", str(exc)) from None
        log.info("%s (client %r) registered %s", principal, str(body.get("client"))[:200],
                 [(v["name"], v["id"]) for v in out])
        for v in out:
            self.core.registered(v["id"], f"{principal}/{str(body.get('client'))[:200]}")
        return reply(request, {"views": out})

    async def unregister(self, request: web.Request):
        """Drop the caller's registration of a view; the view is forgotten with the last one."""
        vid = request.match_info["id"]
        if not VIEW_ID.fullmatch(vid):
            raise ApiError(400, "bad_request", "a view id is 16 lowercase hex digits")
        unknown = ApiError(404, "not_found", f"no view {vid} registered by you")
        # a view of a bucket another shard owns: its registrations are the owner's to drop
        self.core.follow_moved_view(request["principal"], vid, unknown)
        forgotten = await asyncio.get_running_loop().run_in_executor(
            None, self.core.engine.unregister, vid, request["principal"])
        if forgotten is None:
            raise unknown
        return reply(request, {"id": vid, "forgotten": forgotten})

    async def view_log(self, request: web.Request):
        """The registration log (registered, unregistered, forgotten), of the views whose
        bucket and root the caller holds a grant for."""
        after = int_arg(request, "after", 0, 0, MAX_VERSION)
        entries = await asyncio.get_running_loop().run_in_executor(None, self.core.engine.view_log, after)
        principal = request["principal"]
        readable = [e for e in entries if self.core.grants.status(principal, e["bucket"], e["root"]) == GRANTED]
        for e in readable:  # who else uses a view is theirs to know
            if e["principal"] not in (None, principal):
                e["principal"] = "(another principal)"
        return reply(request, {"entries": readable})

    async def list_objects(self, request: web.Request):
        info = self.core.view(request)
        limit = int_arg(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, clamp=True)
        after = request.query.get("after") or None
        if after is not None:
            key_arg(after, "after")
        if after is None and request.query.get("fresh") == "1":
            # a mount's first listing: after what the broker held when it asked, so it shows
            # every object whose PUT returned before (MinIO publishing synchronously)
            if not await self.core.fence(FENCE_WAIT):
                log.info("listing view %s without a fence (the broker is not being consumed, "
                         "or its backlog took over %.0f s)", info.id, FENCE_WAIT)
        await self.core.wait_ready(info, float_arg(request, "wait", 30.0, 300.0))
        engine = self.core.engine
        # the first objects on the loop (a small view's whole listing, without two thread
        # switches), the rest of a long page in a worker thread; the page keeps the first
        # part's version (a listing may show changes after its version: see list_view)
        page = engine.list_view(info, after, min(limit, INLINE_OBJECTS))
        if page["next"] is not None and limit > INLINE_OBJECTS:
            rest = await asyncio.get_running_loop().run_in_executor(
                None, engine.list_view, info, page["next"], limit - len(page["objects"]))
            page["objects"] += rest["objects"]
            page["next"] = rest["next"]
        return reply(request, page)

    async def changes(self, request: web.Request):
        info = self.core.view(request)
        if not request.query.get("since"):
            raise ApiError(400, "bad_request", "since=V is required (the version of your listing)")
        since = version_arg(request.query["since"], "since")
        limit = int_arg(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT, clamp=True)
        wait = float_arg(request, "wait", 0.0, 60.0)
        await self.core.wait_ready(info, 30.0 if wait else 0.0)
        deadline = time.monotonic() + wait
        grant_end = self.core.grants.until(request["principal"], info.bucket, info.view.root)
        while True:
            self.core.owned(info.bucket)  # (woken by a handoff of the bucket: 421)
            ev = self.core.hub.event(info.bucket)
            res = await self.core.read_changes(info, since, limit)
            if res["changes"] or res["more"]:
                return reply(request, res)
            # a long poll waits no longer than the grant lasts
            left = min(deadline - time.monotonic(), grant_end - time.time())
            if left <= 0:
                return reply(request, res)
            since = max(since, res["version"])
            await wait_event(ev, left)

    async def stream(self, request: web.Request):
        info = self.core.view(request)
        principal = request["principal"]
        since = version_arg(request.headers.get("Last-Event-ID") or request.query.get("since"),
                         "since (or Last-Event-ID)")
        await self.core.wait_ready(info, 30.0)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        feed = self.core.hub.feed
        feed.open(info.bucket)
        try:
            while True:
                # the stream lasts as long as the grant (renewed by the client's proofs)
                left = self.core.grants.until(principal, info.bucket, info.view.root) - time.time()
                if left <= 0:
                    return resp
                if not self.core.serves(info.bucket):  # handed off (which woke this stream)
                    await resp.write(self.core.moved_event(info.bucket))
                    return resp
                ev = feed.event(info)
                try:  # from the feed's memory (shared by the streams), else the store
                    text, version, more = feed.encoded(info, since, 1000) or self._stream_chunk(info, since)
                    self.core.check_since(info, since)  # after the read, as read_changes
                except ApiError as exc:  # outside the change log
                    data = orjson.dumps({"version": exc.extra["version"]})
                    await resp.write(b"event: resync\ndata: " + data + b"\n\n")
                    return resp
                if text:
                    await resp.write(text)
                since = max(since, version)
                if more:
                    continue
                if not await wait_event(ev, min(15.0, left)):
                    await resp.write(b": keepalive\n\n")
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:  # the 200 is sent: end the stream; the client reconnects
            if self.core.serves(info.bucket):
                log.exception("change stream of view %s failed", info.id)
            else:  # the bucket went while its changes were read
                await resp.write(self.core.moved_event(info.bucket))
        finally:
            feed.close(info.bucket)
        return resp

    def _stream_chunk(self, info, since: int) -> tuple[bytes, int, bool]:
        res = self.core.engine.changes(info, since, 1000)
        return stream_text(res["changes"]), res["version"], res["more"]

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
        return bucket, key_arg(key, "the key")

    async def lookup(self, request: web.Request):
        bucket, key = self._object_path(request)
        principal = request["principal"]
        self.core.owned(bucket)
        unknown = ApiError(404, "not_found", f"no object {bucket}/{key} known to the handler "
                           "(or none that you may read)")
        self.core.authorize(principal, bucket, key, unknown)
        obj = self.core.engine.lookup(bucket, key)
        if obj is None:
            raise unknown
        by_id = self.core.engine.views_by_id
        obj["views"] = [vid for vid in obj["views"] if vid in by_id and self.core.readable(principal, by_id[vid])]
        return reply(request, obj)

    async def wait_objects(self, request: web.Request):
        """``POST /v1/objects/wait``: returns once this handler's record of each object is
        the version named (an ETag; null: the key gone), or a newer one, or after ``wait``
        seconds; ``pending`` names what it still lacks. What a mount's ``delvefs sync``
        waits for, so that a mount started afterwards lists what it wrote.

        A key still missing after ``CHECK_AFTER`` seconds is asked of S3 once
        (``Engine.check_keys``): its event may have been lost (an object store that
        restarted sends none for its first moments' PUTs), and what S3 has is applied."""
        body = await read_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("bucket"), str) \
                or not isinstance(body.get("objects"), list):
            raise ApiError(400, "bad_request", 'body must be {"bucket", "objects": [{"key", "etag", '
                           '"since"}], "wait": seconds}')
        bucket, wanted = body["bucket"], body["objects"]
        if not valid_bucket(bucket):
            raise ApiError(400, "bad_request", f"{bucket[:80]!r} is no valid bucket name")
        if len(wanted) > MAX_WAITED_OBJECTS:
            raise ApiError(400, "bad_request", f"at most {MAX_WAITED_OBJECTS} objects in one request")
        for w in wanted:
            if not isinstance(w, dict) or not isinstance(w.get("key"), str) \
                    or not isinstance(w.get("etag"), (str, type(None))) \
                    or not isinstance(w.get("since", 0), (int, float)):
                raise ApiError(400, "bad_request", 'each object must be {"key": str, "etag": str or '
                               'null, "since": epoch seconds}')
            key_arg(w["key"], "a key")
        wait = body.get("wait", 30)
        if not isinstance(wait, (int, float)) or not 0 <= wait < float("inf"):
            raise ApiError(400, "bad_request", "wait must be a number of seconds, 0 or more")
        self.core.owned(bucket)
        principal = request["principal"]
        for w in wanted:  # a key the caller may not list: as if the handler had no record
            self.core.authorize(principal, bucket, w["key"], ApiError(
                404, "not_found", f"no object {bucket}/{w['key']} that you may read"))
        deadline = time.monotonic() + min(float(wait), MAX_OBJECT_WAIT)
        engine, hub = self.core.engine, self.core.hub
        loop = asyncio.get_running_loop()
        check_at = time.monotonic() + check_after()
        while True:
            woken = hub.event(bucket)  # taken before the check: a commit after it wakes us
            wanted = await loop.run_in_executor(None, _still_missing, engine, bucket, wanted)
            now = time.monotonic()
            left = deadline - now
            if not wanted or left <= 0:
                break
            if check_at is not None and now >= check_at:
                check_at = None  # once a request: S3 is asked for what the events did not bring
                bs = engine.buckets.get(bucket)
                if bs is not None and bs.state == READY:
                    try:
                        await loop.run_in_executor(None, engine.check_keys, bucket,
                                                   [w["key"] for w in wanted])
                    except Exception as exc:  # noqa: BLE001 — S3 away: keep waiting for events
                        log.warning("checking %d waited-for keys of %s in S3 failed: %s",
                                    len(wanted), bucket, exc)
                    continue
            await wait_event(woken, min(left, 0.25, max(0.0, check_at - now) if check_at else 0.25))
        return reply(request, {"pending": [{"key": w["key"], "etag": w.get("etag"), "seen": w["seen"]}
                                           for w in wanted]})


MAX_WAITED_OBJECTS = 1000
MAX_OBJECT_WAIT = 120.0


def check_after(env=os.environ) -> float:
    """Seconds a waited-for key may be missing before S3 is asked for it
    (``DELVEFS_WAIT_CHECK_AFTER``, default 2: an event normally arrives well within it)."""
    return float(env.get("DELVEFS_WAIT_CHECK_AFTER") or 2.0)


def _still_missing(engine, bucket: str, wanted: list[dict]) -> list[dict]:
    """The objects of ``wanted`` whose version the handler's record is not yet, each with
    ``seen``: the ETag the handler has (null: none). A record newer than the change
    (written after its ``since`` by someone else) counts as having it."""
    missing = []
    for w in wanted:
        rec = engine.lookup(bucket, w["key"])
        etag = w.get("etag")
        if rec is None:
            if etag is None:
                continue
        elif rec["etag"] == etag or float(rec.get("mtime") or 0) > float(w.get("since") or 0) + 1.0:
            continue
        missing.append({**w, "seen": None if rec is None else rec["etag"]})
    return missing
