"""The one client of the event handler's HTTP API (docs/API.md).

Two layers:

- *Requests* (delvefs/client/handler/endpoints.py): one function per endpoint describes a
  request as an :class:`ApiRequest`, which also reads the answer. No I/O.
- *Clients* (here) send them: :class:`HandlerClient` (the mount, on trio: each request
  goes in a worker thread, so none blocks the loop) and :class:`SyncHandlerClient`
  (blocking: ``delvefs watch``, group members, ``delvefs shards``/``status``, the tests'
  and benchmarks' ``HandlerProcess``). Both offer the operations of
  :class:`HandlerOperations` and speak HTTP/1.1 through :class:`HttpClient`
  (delvefs/client/handler/http.py: kept-alive ``http.client`` connections, one pool per
  handler URL). The mount's client times each round trip by the request's ``kind``
  (``round_trips``: the mount's metrics).

A client may be given several handler URLs (comma-separated: the active handler and its
standbys, eventhandler/standby.py). It sends to the one that answered last; on a
connection failure or a 503 "standby" answer it tries the next, and sticks with the first
that answers (:class:`Failover`).

Given a shard map instead (``NAME=URL,...``, delvefs/shared/shards.py), a client sends each
request to the shard that owns its bucket (a view's requests: the bucket it was registered
with), each shard with its own failover; a registration or proofs of several shards' buckets
are split. A shard answering 421 "misdirected" sends its map along: the client takes it and
sends the request again, to the owner. A change stream ended by the ``moved`` event (its
bucket was handed to another shard) is followed the same way (:meth:`SyncHandlerClient.follow`).

Listings and changes are requested as msgpack, other answers as JSON. Errors:
:class:`HandlerUnavailable` (cannot reach it / 5xx, e.g. 503 "scanning"), :class:`Resync`
(410: the version is older than the change log: list again), :class:`HandlerError`
(any other refusal: 400, 401, 403, 404 ...; ``status`` and ``code`` say which).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Iterator

from delvefs.shared.config import handler_ca, handler_urls
from delvefs.shared.histogram import Timings
from delvefs.shared.shards import ShardMap
from .endpoints import (
    ApiRequest,
    HandlerError,
    HandlerUnavailable,
    Misdirected,
    Resync,
    api_error,
    changes_request,
    decoded_body,
    group_claim_request,
    group_done_request,
    group_give_back_request,
    group_join_request,
    group_leave_request,
    group_renew_request,
    group_status_request,
    handoff_request,
    health_request,
    list_request,
    lookup_request,
    metrics_request,
    needs_proof,
    proofs_request,
    register_request,
    shards_request,
    status_request,
    stream_changes,
    stream_request,
    unreachable,
    unregister_request,
    view_bucket,
    wait_objects_request,
)
from .http import ConnectFailed, ConnectionLost, HttpClient, Response, TransportError

# what callers use: the clients, and the errors their operations raise
__all__ = ["HandlerClient", "SyncHandlerClient", "HandlerOperations", "HandlerError",
           "HandlerUnavailable", "Misdirected", "Resync"]


FAILOVER_ERRORS = (ConnectFailed, ConnectionLost)


def is_standby(resp: Response) -> bool:
    """The answer of a handler standing by (its body read)."""
    if resp.status_code != 503:
        return False
    body = decoded_body(resp)
    return isinstance(body, dict) and body.get("error") == "standby"


class Failover:
    """A client's handler URLs, in the order given, and the one it uses (``current``)."""

    def __init__(self, urls: str | list[str]):
        self.urls = handler_urls(urls)
        self.current = 0

    def attempts(self) -> "Attempts":
        return Attempts(self)

    def use(self, index: int) -> None:
        """The handler at ``urls[index]`` answered: requests start there from now on."""
        self.current = index


class Attempts:
    """One request's way through the handler URLs, from the current one on: iterate the
    URLs; report each failure (:meth:`failed`) or response (:meth:`answered`, true for the
    one to use); without one, :meth:`outcome` is the last standby answer or raises."""

    def __init__(self, failover: Failover):
        self.failover = failover
        n = len(failover.urls)
        self.order = [(failover.current + i) % n for i in range(n)]
        self.index = failover.current
        self.failures: list[str] = []
        self.standby: Response | None = None

    def __iter__(self) -> Iterator[str]:
        for self.index in self.order:
            yield self.failover.urls[self.index]

    def failed(self, url: str, exc: TransportError) -> None:
        """Go on to the next URL, or raise when this failure is not one to move on after."""
        if len(self.order) == 1 or not isinstance(exc, FAILOVER_ERRORS):
            raise unreachable(url, exc) from exc
        self.failures.append(f"{url}: {type(exc).__name__}: {exc}")

    def answered(self, resp: Response) -> bool:
        """True when ``resp`` is the answer (the handler becomes the current one); False
        for a standby's, after which the next URL is tried."""
        if len(self.order) > 1 and is_standby(resp):
            self.standby = resp
            self.failures.append(f"{self.failover.urls[self.index]}: standby")
            return False
        self.failover.use(self.index)
        return True

    def outcome(self) -> Response:
        if self.standby is not None:
            return self.standby
        raise HandlerUnavailable("no event handler answers: " + "; ".join(self.failures))


def combine_health(answers):
    """One health answer of several shards' (see :meth:`HandlerOperations.health`)."""
    if not isinstance(answers, dict) or "status" in answers:
        return answers
    statuses = [a.get("status") for a in answers.values()]
    return {"status": "ok" if all(st == "ok" for st in statuses) else "degraded", "shards": answers}


def run_plan(plan, send):
    """Drive an operation's plan with ``send(shard, request)`` (blocking)."""
    try:
        step = next(plan)
        while True:
            try:
                outcome = send(*step)
            except Misdirected as exc:
                outcome = exc
            step = plan.send(outcome)
    except StopIteration as done:
        return done.value


# ----------------------------------------------------------------- clients

# seconds; a listing held while the handler's first scan runs may take up to half the timeout
ROUND_TRIP_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


# requests of the mount's client at once (each in a worker thread, on a connection of its own)
MAX_CONNECTIONS = 16


def _http_options(base_url: str, token: str | None, timeout: float) -> dict:
    """The options of one handler URL's :class:`HttpClient` (connect timeout: its default,
    5 s). httpx.Client takes the same: a test may give a client one over a mock transport."""
    return {"base_url": base_url,
            "headers": {"Authorization": f"Bearer {token}"} if token else {},
            # plain http: no TLS context with the CA bundle loaded (~60 ms at every mount)
            "verify": _tls_verify(base_url),
            "timeout": timeout}


def _tls_verify(base_url: str):
    """``verify``: none for http; for https $DELVEFS_HANDLER_CA, else the default CAs."""
    if base_url.lower().startswith("http://"):
        return False
    ca = handler_ca()
    if not ca:
        return True
    import ssl
    return ssl.create_default_context(cafile=ca)


class HandlerOperations:
    """The API's operations, written once for both clients: each returns what the
    client's ``_run`` returns — the answer in :class:`SyncHandlerClient`, an awaitable
    of it in :class:`HandlerClient`. Each operation is a *plan* (a generator): it yields
    (shard, request) pairs and is sent back each answer or :class:`Misdirected` error."""

    MAX_REROUTES = 3  # 421 answers followed for one request (a map in motion settles fast)

    def __init__(self, base_url: str | list[str], token: str | None = None, *, timeout: float = 20.0):
        self.shards = ShardMap.parse(base_url)
        self.failovers = {name: Failover(urls) for name, urls in self.shards.shards.items()}
        self.timeout = timeout
        self.token = token
        self.clients: dict = {}  # handler URL -> its HttpClient (its pool of connections)
        self.view_buckets: dict[str, str] = {}  # view id -> its bucket (where its requests go)

    def _new_client(self, options: dict) -> HttpClient:
        return HttpClient(**options, max_idle=MAX_CONNECTIONS)

    def client(self, url: str) -> HttpClient:
        """The client of one handler URL (made at its first use)."""
        if url not in self.clients:
            self.clients[url] = self._new_client(_http_options(url, self.token, self.timeout))
        return self.clients[url]

    @property
    def failover(self) -> Failover:
        """The first shard's failover (the only one without a map)."""
        return next(iter(self.failovers.values()))

    @property
    def http(self) -> HttpClient:
        """The client of the current handler URL (base URL and token set), for requests of
        one's own (``get``, ``post``, ``stream`` ... as httpx.Client's)."""
        return self.client(self.url)

    @property
    def base_url(self) -> str:
        """Every handler URL, comma-separated, in the order given, or the shard map (what
        ``delvefs watch`` gets through a view directory's ``user.delvefs.view``)."""
        return self.shards.text()

    @property
    def url(self) -> str:
        """The handler URL requests go to first (of the first shard)."""
        return self.failover.urls[self.failover.current]

    def serving(self, bucket: str) -> tuple[str | None, str]:
        """(shard, URL): the shard whose handler serves ``bucket`` by this client's map (None
        without a map) and the URL its requests go to first (the one that answered last)."""
        shard = self.shards.owner(bucket)
        failover = self.failovers[shard]
        return (shard if self.shards.sharded else None), failover.urls[failover.current]

    def know_view(self, view_id: str, bucket: str) -> None:
        """Send the requests of view ``view_id`` to the owner of ``bucket``."""
        self.view_buckets[view_id] = bucket

    def shard_of(self, request: ApiRequest) -> str:
        """The shard a request goes to: the owner of its bucket (or its view's), else the first."""
        bucket = request.bucket or self.view_buckets.get(request.view)
        return self.shards.owner(bucket) if bucket is not None else next(iter(self.shards.shards))

    def learn(self, exc: Misdirected) -> None:
        """Take the map a shard sent with its 421."""
        try:
            fresh = ShardMap.from_json(exc.body)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise exc from None
        if fresh == self.shards:
            raise exc  # it names an owner our map already has: nothing to follow
        self.shards = fresh
        for name, urls in fresh.shards.items():
            if name not in self.failovers or self.failovers[name].urls != urls:
                self.failovers[name] = Failover(urls)

    def _reroute(self, exc: Misdirected, request: ApiRequest, shard: str) -> None:
        """After ``request`` sent to ``shard`` was answered ``exc``: take its map, unless
        the request's owner changed meanwhile anyway; raises ``exc`` when there is no
        other owner to send it to."""
        try:
            self.learn(exc)
        except Misdirected:
            if self.shard_of(request) == shard:
                raise

    def _one(self, request: ApiRequest):
        """The plan of a request to one shard: sent again to the owner a 421 names."""
        for _ in range(self.MAX_REROUTES):
            shard = self.shard_of(request)
            outcome = yield shard, request
            if not isinstance(outcome, Misdirected):
                return outcome
            self._reroute(outcome, request, shard)
        raise outcome

    def _split(self, items: list, bucket_of, build, merge):
        """The plan of a request about several buckets: one request per owning shard
        (``build(items)``), its answers merged (``merge(items, [(indices, answer), ...])``)."""
        answers: list[tuple[list[int], object]] = []
        pending = list(range(len(items)))
        for _ in range(self.MAX_REROUTES + 1):
            groups: dict[str, list[int]] = {}
            for i in pending:
                groups.setdefault(self.shards.owner(bucket_of(items[i])), []).append(i)
            pending = []
            for shard, group in groups.items():
                outcome = yield shard, build([items[i] for i in group])
                if isinstance(outcome, Misdirected):
                    self.learn(outcome)
                    pending += group
                else:
                    answers.append((group, outcome))
            if not pending:
                return merge(items, answers)
        raise outcome

    def _every_shard(self, request: ApiRequest):
        """The plan of a request to every shard: its answer, or {shard: answer} when sharded."""
        answers = {}
        for shard in list(self.shards.shards):
            outcome = yield shard, request
            if isinstance(outcome, Misdirected):
                raise outcome
            answers[shard] = outcome
        return answers if self.shards.sharded else next(iter(answers.values()))

    def _call(self, request: ApiRequest):
        return self._run(self._one(request))

    def _run(self, plan, combine=None):
        raise NotImplementedError

    def health(self, *, timeout: float | None = None):
        """``{"status", "amqp", "views", "buckets", ...}`` (no token needed); sharded, the
        worst status of the shards' and ``"shards": {name: answer}``."""
        return self._run(self._every_shard(health_request(timeout)), combine_health)

    def register(self, client: str, views: list[dict], proof: dict[str, str]):
        """``views``: [{"name", "spec"}] -> [{"name", "id", "version"}] (in their order)."""
        def build(part):
            buckets = {view_bucket(v) for v in part}
            return register_request(client, part, {b: u for b, u in proof.items() if b in buckets})

        def merge(items, parts):
            answers = [None] * len(items)
            for group, answer in parts:  # each shard answers its views in their order
                for i, one in zip(group, answer):
                    answers[i] = one
                    self.know_view(one["id"], view_bucket(items[i]))
            return answers
        if not views:
            return self._call(register_request(client, views, proof))
        return self._run(self._split(views, lambda v: view_bucket(v) or "", build, merge))

    def unregister(self, view_id: str):
        """``{"id", "forgotten"}``, or None when the handler holds no registration of it."""
        return self._call(unregister_request(view_id))

    def prove(self, proof: dict[str, str | list[str]]):
        """Renew this principal's grants: -> [{"bucket", "prefix", "until"}]."""
        if not self.shards.sharded:
            return self._call(proofs_request(proof))
        buckets = list(proof)
        return self._run(self._split(
            buckets, lambda b: b, lambda part: proofs_request({b: proof[b] for b in part}),
            lambda items, parts: [g for _group, grants in parts for g in grants]))

    def list_page(self, view_id: str, after: str | None, limit: int = 50000, *,
                  hold: bool = True, fresh: bool = False):
        """``{"version", "objects", "next"}``. While the bucket's first scan runs, the handler
        holds the request (``hold``) up to half this client's timeout, else answers 503
        "scanning" at once. ``fresh``: a first page that reflects every event the handler's
        broker held when it was asked (docs/API.md)."""
        # held: answered 503 "scanning" well before this client would give up waiting
        return self._call(list_request(view_id, after, limit, wait=self.timeout / 2 if hold else 0,
                                       fresh=fresh))

    def wait_objects(self, bucket: str, objects: list[dict], wait: float):
        """The objects of ``objects`` ([{"key", "etag" or None, "since"}], at most 1,000)
        whose version the handler has not seen after up to ``wait`` seconds, each with
        ``seen`` (the ETag it has, or None)."""
        return self._call(wait_objects_request(bucket, objects, wait))

    def changes(self, view_id: str, since: int, limit: int = 50000, wait: float = 0):
        """``{"version", "changes", "more"}``; raises :class:`Resync`."""
        return self._call(changes_request(view_id, since, limit, wait))

    def lookup(self, bucket: str, key: str):
        """The handler's record of one object, or None."""
        return self._call(lookup_request(bucket, key))

    def group_join(self, view_id: str, group: str, member: str, **options):
        """See :func:`group_join_request`."""
        return self._call(group_join_request(view_id, group, member, **options))

    def group_leave(self, view_id: str, group: str, member: str):
        return self._call(group_leave_request(view_id, group, member))

    def group_claim(self, view_id: str, group: str, member: str, n: int = 1, wait: float = 20.0):
        """See :func:`group_claim_request`."""
        return self._call(group_claim_request(view_id, group, member, n, wait))

    def group_renew(self, view_id: str, group: str, member: str):
        return self._call(group_renew_request(view_id, group, member))

    def group_done(self, view_id: str, group: str, member: str, key: str, ok: bool = True,
                   error: str | None = None):
        return self._call(group_done_request(view_id, group, member, key, ok, error))

    def group_give_back(self, view_id: str, group: str, member: str, key: str, reason: str):
        """Return a claimed file unworked: given out again, no attempt counted."""
        return self._call(group_give_back_request(view_id, group, member, key, reason))

    def group_status(self, view_id: str, group: str):
        return self._call(group_status_request(view_id, group))

    def metrics(self):
        """The Prometheus text (sharded: {shard: text})."""
        return self._run(self._every_shard(metrics_request()))

    def status(self):
        """``GET /v1/status`` (see :func:`status_request`; sharded: {shard: answer})."""
        return self._run(self._every_shard(status_request()))

    def shard_maps(self):
        """``GET /v1/shards`` of each shard (unsharded: the handler's answer)."""
        return self._run(self._every_shard(shards_request()))

    def handoff(self, bucket: str, to: str, proof: dict[str, str], *, shard: str):
        """Tell ``shard`` that ``bucket`` is placed on shard ``to`` (``delvefs shards move``)."""
        def plan():
            outcome = yield shard, handoff_request(bucket, to, proof)
            if isinstance(outcome, Misdirected):
                raise outcome
            return outcome
        return self._run(plan())


class HandlerClient(HandlerOperations):
    """The mount's client: every operation is a coroutine. ``reprove``: async (), presents
    fresh proofs (registers again) when a view request is answered as if this principal
    held no grant for it; the request is then sent once more.

    Each request goes in a worker thread, at most ``MAX_CONNECTIONS`` at once. A request
    cancelled (its trio task) is abandoned, not interrupted: its thread ends within the
    request's timeout, and its connection goes back to the pool or is closed."""

    def __init__(self, base_url: str | list[str], token: str | None = None, *, timeout: float = 20.0,
                 reprove=None):
        import trio  # here: the blocking clients' commands need not import it
        super().__init__(base_url, token, timeout=timeout)
        self.reprove = reprove
        # round trips by request kind (ApiRequest.kind), for the mount's metrics
        self.round_trips = Timings(ROUND_TRIP_BOUNDS)
        self._in_thread = functools.partial(trio.to_thread.run_sync, abandon_on_cancel=True,
                                            limiter=trio.CapacityLimiter(MAX_CONNECTIONS))

    async def aclose(self) -> None:
        for client in self.clients.values():
            client.close()

    async def __aenter__(self) -> "HandlerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _call(self, request: ApiRequest):
        try:
            return await self._run(self._one(request))
        except HandlerError as exc:
            if self.reprove is None or not needs_proof(request, exc):
                raise
        await self.reprove()
        return await self._run(self._one(request))

    async def _run(self, plan, combine=None):
        try:
            step = next(plan)
            while True:
                try:
                    outcome = await self._send(*step)
                except Misdirected as exc:
                    outcome = exc
                step = plan.send(outcome)
        except StopIteration as done:
            return done.value if combine is None else combine(done.value)

    async def _send(self, shard: str, request: ApiRequest):
        started = time.perf_counter()
        failed = True
        try:
            attempts = self.failovers[shard].attempts()
            for url in attempts:
                try:
                    resp = await self._in_thread(functools.partial(self.client(url).request,
                                                                   **request.http_args()))
                except TransportError as exc:
                    attempts.failed(url, exc)
                    continue
                if attempts.answered(resp):
                    answer = request.answer(resp)
                    failed = False
                    return answer
            answer = request.answer(attempts.outcome())
            failed = False
            return answer
        finally:
            self.round_trips.observe(request.kind, time.perf_counter() - started, failed)


class SyncHandlerClient(HandlerOperations):
    """A blocking client (``delvefs watch``, tests, benchmarks). ``http`` is the
    :class:`HttpClient` of the current handler URL (base URL and token set) for requests
    of one's own."""

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def __enter__(self) -> "SyncHandlerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def response(self, request: ApiRequest, *, stream: bool = False,
                 shard: str | None = None) -> Response:
        """The response to ``request`` as it is, whatever its status (``stream``: its body
        not read yet unless the status is not 200; close it), from its shard (see
        :meth:`shard_of`) or ``shard``."""
        attempts = self.failovers[self.shard_of(request) if shard is None else shard].attempts()
        for url in attempts:
            client = self.client(url)
            try:
                resp = client.send(client.build_request(**request.http_args()), stream=stream)
                if resp.status_code != 200 and stream:
                    resp.read()
            except TransportError as exc:
                attempts.failed(url, exc)
                continue
            if attempts.answered(resp):
                return resp
        return attempts.outcome()

    def _run(self, plan, combine=None):
        answer = run_plan(plan, lambda shard, request: request.answer(self.response(request, shard=shard)))
        return answer if combine is None else combine(answer)

    def pages(self, view_id: str, limit: int = 5000) -> Iterator[dict]:
        """The pages of the view's listing, in order."""
        after = None
        while True:
            page = self.list_page(view_id, after, limit)
            yield page
            after = page["next"]
            if not after:
                return

    def list_all(self, view_id: str, limit: int = 5000) -> tuple[int, dict[str, dict]]:
        """The version of the first page (apply changes from there) and every object of the
        view by key, in key order."""
        version, objects = None, {}
        for page in self.pages(view_id, limit):
            version = page["version"] if version is None else version
            objects.update((obj["key"], obj) for obj in page["objects"])
        return version, objects

    def follow(self, view_id: str, since: int) -> Iterator[dict]:
        """The view's changes after version ``since`` as the handler streams them, until it
        closes the stream. A stream whose bucket belongs to another shard — a 421 at its
        start, or the ``moved`` event that ends it when the bucket is handed off — is
        opened again at the owner, after the last version it gave. Raises :class:`Resync`,
        :class:`HandlerUnavailable` (the stream could not be opened or broke off) or
        :class:`HandlerError` (refused; 404 also where the new owner does not know the
        view yet: its mount registers it there)."""
        for _ in range(self.MAX_REROUTES):
            request = stream_request(view_id, since)
            shard = self.shard_of(request)
            resp = self.response(request, stream=True)
            try:
                if resp.status_code != 200:
                    raise api_error(request.what, resp.status_code, decoded_body(resp))
                for change in stream_changes(resp.iter_lines()):
                    since = max(since, change["v"])
                    yield change
                return
            except Misdirected as exc:
                self._reroute(exc, request, shard)
            except TransportError as exc:
                raise unreachable(self.url, exc) from exc
            finally:
                resp.close()
        raise HandlerError(f"{request.what}: its bucket's owner keeps changing", 421, "misdirected")
