"""What every route of the HTTP API uses (:class:`ApiCore`): the engine and the groups,
who the caller is (its bearer token, eventhandler/auth.py) and what it may read (its
grants, from the proofs it presented), which buckets this shard serves (421 for others),
and reading a view's change log as the long poll and the stream do."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import yarl
from aiohttp import web

from .. import groups as wg
from ..auth import GRANTED, LAPSED, Authenticator, Grants, Proof, ProofRefused, Unauthorized, parse_proof, valid_bucket
from ..tracking import SCANNING
from .common import MAX_PROOFS, VIEW_ID, ApiError, Hub

MAX_REGISTRATIONS = 1000  # clients remembered per view (the oldest are forgotten)


class ApiCore:
    def __init__(self, engine, consumer, metrics, auth: Authenticator, grants: Grants,
                 s3_endpoint: str | None, *, proof_timeout: float, groups: "wg.Groups", sharding):
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
        self.hub: Hub | None = None                      # made on the loop, at the app's start
        self.session: aiohttp.ClientSession | None = None  # fetches proofs; made at the start too
        self.started = time.time()
        # view id -> {client name: when it registered the view} (GET /v1/status: its mounts)
        self.registered_by: dict[str, dict[str, float]] = {}

    def principal(self, request: web.Request) -> str:
        try:
            return self.auth.principal(request.headers.get("Authorization"))
        except Unauthorized as exc:
            raise ApiError(401, "unauthorized", str(exc)) from None

    def serves(self, bucket: str) -> bool:
        return self.sharding is None or self.sharding.owns(bucket)

    def misdirected(self, bucket: str) -> ApiError:
        """The 421 about a bucket another shard owns: its owner, the owner's URLs, the map."""
        fields = self.sharding.misdirected(bucket)
        return ApiError(421, "misdirected", f"bucket {bucket!r} belongs to shard {fields['owner']!r} "
                        f"({', '.join(fields['urls'])}), not to shard {self.shard!r}", **fields)

    def owned(self, bucket: str) -> None:
        """Returns when this handler serves ``bucket``; else 421 naming its owner."""
        if not self.serves(bucket):
            raise self.misdirected(bucket)

    def moved_event(self, bucket: str) -> bytes:
        """The change stream's last event when its bucket was handed to another shard: the
        fields of the 421 a request about it gets now."""
        exc = self.misdirected(bucket)
        data = orjson.dumps({"error": exc.code, "message": exc.message, **exc.extra})
        return b"event: moved\ndata: " + data + b"\n\n"

    def authorize(self, principal: str, bucket: str, key: str, unknown: ApiError) -> None:
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

    def view(self, request):
        """The view of a request's path that its principal may read here (400, 404, 403
        "proof_expired", 421 for a view of a bucket another shard owns)."""
        vid = request.match_info["id"]
        if not VIEW_ID.fullmatch(vid):
            raise ApiError(400, "bad_request", "a view id is 16 lowercase hex digits")
        unknown = ApiError(404, "not_found", f"no view {vid} that you may read (unknown id, or no "
                           "valid proof of list rights on its bucket and root: register it with one)")
        info = self.engine.views_by_id.get(vid)
        if info is None:
            self.follow_moved_view(request["principal"], vid, unknown)
            raise unknown
        self.authorize(request["principal"], info.bucket, info.view.root, unknown)
        self.owned(info.bucket)  # a bucket being handed off
        self.engine.touch(info)  # in use: not forgotten (--view-ttl)
        return info

    def follow_moved_view(self, principal: str, vid: str, unknown: ApiError) -> None:
        """421 naming the owner when view ``vid`` is of a bucket another shard owns: a view
        known here whose bucket is being handed off, or one forgotten when its bucket was —
        to a caller holding a grant of its bucket and root (``unknown``, or 403
        "proof_expired", to others: an id tells its bucket only to who may list it).
        Returns for any other view. A view this shard never had, or forgot otherwise, names
        no bucket (its id is a hash of its spec): the caller answers it as unknown."""
        if self.sharding is None:
            return
        info = self.engine.views_by_id.get(vid)
        where = (info.bucket, info.view.root) if info is not None else self.sharding.moved_view(vid)
        if where is not None and not self.serves(where[0]):
            self.authorize(principal, *where, unknown)
            raise self.misdirected(where[0])

    def readable(self, principal: str, info) -> bool:
        return self.grants.status(principal, info.bucket, info.view.root) == GRANTED

    def proof_urls(self, proof, *, owned: bool = True) -> list[tuple[str, str]]:
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
                self.owned(bucket)
            urls = [urls] if isinstance(urls, str) else urls
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ApiError(400, "bad_request", f"proof of bucket {bucket!r}: a URL or a list of URLs")
            pairs += [(bucket, u) for u in urls]
        if len(pairs) > MAX_PROOFS:
            raise ApiError(400, "bad_request", f"at most {MAX_PROOFS} proofs in one request")
        return pairs

    async def accept_proofs(self, principal: str, pairs: list[tuple[str, str]]) -> list[Proof]:
        """Check and fetch each proof; record the grants of those the store answers 200.
        Raises 403 for the first refused one (the grants of the others are kept); 503 when
        none was refused but the store could not be asked about one (busy, unreachable:
        the client asks again later)."""
        now = time.time()
        proofs = []
        for bucket, url in dict.fromkeys(pairs):
            try:
                proofs.append(parse_proof(url, bucket=bucket, principal=principal,
                                          endpoint=self.s3_endpoint, now=now))
            except ProofRefused as exc:
                raise ApiError(403, "proof_expired" if exc.expired else "forbidden",
                               f"proof for bucket {bucket!r}: {exc}", bucket=bucket) from None
        checks = await asyncio.gather(*(self.fetch_proof(p) for p in proofs))
        for proof, (refused, why) in zip(proofs, checks):
            if why is None:
                self.grants.add(principal, proof.bucket, proof.prefix, proof.until)
        for proof, (refused, why) in sorted(zip(proofs, checks), key=lambda pc: not pc[1][0]):
            if refused:
                raise ApiError(403, "forbidden", f"proof for bucket {proof.bucket!r}: {why}",
                               bucket=proof.bucket)
            if why is not None:
                raise ApiError(503, "proof_unchecked", f"proof for bucket {proof.bucket!r}: {why}",
                               bucket=proof.bucket)
        return proofs

    async def fetch_proof(self, proof: Proof) -> tuple[bool, str | None]:
        """(refused, why): (False, None) when the store answers the proof with 200, (True,
        why) when it answers otherwise, (False, why) when it could not be asked."""
        try:  # encoded=True: the query exactly as signed; never a redirect to elsewhere
            async with self.session.get(yarl.URL(proof.url, encoded=True), allow_redirects=False) as resp:
                status = resp.status
                await resp.content.read(65536)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return False, f"could not be checked with the object store: {type(exc).__name__}: {exc}"
        if status >= 500:
            return False, f"could not be checked: the object store answered HTTP {status}"
        if status != 200:
            return True, (f"the object store refused it (HTTP {status}): the credentials that signed it "
                          f"cannot list prefix {proof.prefix!r}, or it expired")
        return False, None

    async def fence(self, wait: float) -> bool:
        """Returns once every event the broker held when called has been applied (the
        consumer's fence) and the tag fetches they started are done, or after ``wait``
        seconds; False when no fence could be set (not consuming, or an event source without
        order) or it did not pass in time."""
        request = getattr(self.consumer, "request_fence", None)
        if request is None or wait <= 0:
            return False
        loop = asyncio.get_running_loop()
        passed = loop.create_future()

        def on_passed() -> None:  # (the consumer's thread)
            loop.call_soon_threadsafe(lambda: passed.done() or passed.set_result(True))
        if not request(on_passed):
            return False
        deadline = loop.time() + wait
        try:
            async with asyncio.timeout(wait):
                await passed
        except TimeoutError:
            self.consumer.drop_fence(on_passed)
            return False
        # objects whose tags a view needs are in no view until their tags are fetched
        fetches = self.engine.tag_fetches_under_way()
        while fetches and not self.engine.tag_fetches_settled(fetches):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def wait_ready(self, info, wait: float) -> None:
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

    def check_since(self, info, since: int) -> None:
        top = self.engine.buckets[info.bucket].committed
        floor = self.engine.change_floor(info)
        if since < floor or since > top:
            raise ApiError(410, "resync", f"version {since} is outside the change log of view "
                           f"{info.id} ({floor}..{top}): list the view again", version=top)

    async def read_changes(self, info, since, limit):
        # small answers inline; the log read is bounded by `limit` relevant entries
        res = self.engine.changes(info, since, limit)
        # checked after the read: a compaction during it may have removed entries it needed
        self.check_since(info, since)
        return res

    def registered(self, vid: str, client: str) -> None:
        clients = self.registered_by.setdefault(vid, {})
        clients.pop(client, None)
        clients[client] = time.time()
        while len(clients) > MAX_REGISTRATIONS:
            del clients[next(iter(clients))]


class Routes:
    """Some of the API's routes (their handlers), on the core they share."""

    def __init__(self, core: ApiCore):
        self.core = core
