"""The requests of the event handler's HTTP API (docs/API.md), without I/O: one function
per endpoint (``register_request``, ``list_request``, ...) describes a request — path,
parameters, headers, the shard it belongs to — as an :class:`ApiRequest`, which also reads
the answer: the body decoded (msgpack or JSON), the status mapped to an error
(:class:`HandlerUnavailable`, :class:`Resync`, :class:`HandlerError`). The change stream's
server-sent events are read by :func:`stream_changes`. The clients that send them:
delvefs/client/handler/api.py.
"""
from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Iterator

import msgpack

from .http import Response, TransportError


MSGPACK = "application/msgpack"
JSON = "application/json"


class HandlerError(Exception):
    def __init__(self, message: str, status: int | None = None, code: str | None = None,
                 body: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body or {}  # the error answer's fields (a 503 "scanning": its progress)


class HandlerUnavailable(HandlerError):
    pass


class Misdirected(HandlerError):
    """421: the bucket belongs to another shard; ``body`` names it and carries the map."""


class Resync(HandlerError):
    """The version asked for is older than the handler's change log: relist."""

    def __init__(self, version: int | None):
        super().__init__("resync", 410, "resync")
        self.version = version


# ----------------------------------------------------------------- requests

class ApiRequest:
    """One request of the API, and how its answer is read. (A plain class: making a
    dataclass would add ~1.5 ms to every mount's start.)"""

    __slots__ = ("method", "path", "what", "kind", "params", "body", "headers", "timeout",
                 "answer_field", "absent_is_none", "text", "bucket", "view")

    def __init__(self, method: str, path: str, what: str, kind: str, *, params: dict | None = None,
                 body: object = None, headers: dict | None = None, timeout: float | None = None,
                 answer_field: str | None = None, absent_is_none: bool = False, text: bool = False,
                 bucket: str | None = None, view: str | None = None):
        self.method, self.path = method, path
        # where a sharded client sends it: the owner of `bucket`, or of the view's bucket
        self.bucket, self.view = bucket, view
        self.what = what                  # names the request in error messages
        self.kind = kind                  # names the endpoint in the mount's metrics
        self.params = params
        self.body = body                  # sent as JSON
        self.headers = {"Accept": JSON} if headers is None else headers
        self.timeout = timeout            # else the client's
        self.answer_field = answer_field  # the answer is this field of the body
        self.absent_is_none = absent_is_none  # 404 answers None
        self.text = text                  # the answer is the body as text

    def http_args(self) -> dict:
        """The arguments of ``HttpClient.request`` / ``build_request`` for it."""
        args = {"method": self.method, "url": self.path, "params": self.params,
                "json": self.body, "headers": self.headers}
        if self.timeout is not None:
            args["timeout"] = self.timeout
        return args

    def answer(self, resp: Response):
        """The answer of a complete response, or the error it means (raised)."""
        if resp.status_code == 200:
            if self.text:
                return resp.text
            body = decoded_body(resp)
            return body[self.answer_field] if self.answer_field else body
        if resp.status_code == 404 and self.absent_is_none:
            return None
        raise api_error(self.what, resp.status_code, decoded_body(resp))


def decoded_body(resp: Response) -> object:
    """The body, decoded by its content type (msgpack, else JSON); a body that is neither
    (an error page of a proxy) as ``{"message": <its start>}``."""
    if not resp.content:
        return None
    try:
        if resp.headers.get("content-type", "").startswith(MSGPACK):
            return msgpack.unpackb(resp.content, raw=False)
        return resp.json()
    except ValueError:
        return {"message": resp.text[:200]}


def api_error(what: str, status: int, body) -> HandlerError:
    """The error a non-200 answer means (docs/API.md: ``{"error", "message"}`` bodies)."""
    body = body if isinstance(body, dict) else {}
    if status == 410:
        return Resync(body.get("version"))
    msg = f"{what}: HTTP {status} {body.get('error', '')}: {body.get('message', '')}".rstrip(": ")
    cls = HandlerUnavailable if status >= 500 else Misdirected if status == 421 else HandlerError
    return cls(msg, status, body.get("error"), body)


def unreachable(base_url: str, exc: TransportError) -> HandlerUnavailable:
    return HandlerUnavailable(f"event handler at {base_url} unreachable: {type(exc).__name__}: {exc}")


def health_request(timeout: float | None = None) -> ApiRequest:
    return ApiRequest("GET", "/healthz", "health", "health", timeout=timeout)


def metrics_request() -> ApiRequest:
    return ApiRequest("GET", "/metrics", "metrics", "metrics", headers={}, text=True)


def status_request() -> ApiRequest:
    """What the handler is doing, as far as this principal may see it: its event source
    and lag, buckets (scan progress), views, dead letters (docs/API.md, ``GET /v1/status``)."""
    return ApiRequest("GET", "/v1/status", "handler status", "status")


def register_request(client: str, views: list[dict], proof: dict[str, str]) -> ApiRequest:
    """``views``: [{"name", "spec"}]; ``proof``: {bucket: presigned ListObjectsV2 URL}."""
    return ApiRequest("POST", "/v1/views", "registering views", "register",
                      body={"client": client, "views": views, "proof": proof}, answer_field="views",
                      bucket=view_bucket(views[0]) if views else None)


def view_bucket(view) -> str | None:
    """The bucket of a view to register ({"name", "spec"}), if it names one."""
    spec = view.get("spec") if isinstance(view, dict) else None
    bucket = spec.get("bucket") if isinstance(spec, dict) else None
    return bucket if isinstance(bucket, str) else None


def unregister_request(view_id: str) -> ApiRequest:
    """Drop this principal's registration of a view (the handler forgets a view with its
    last registration); a view the handler does not hold for this principal answers None."""
    return ApiRequest("DELETE", f"/v1/views/{view_id}", f"unregistering view {view_id}", "unregister",
                      absent_is_none=True, view=view_id)


def proofs_request(proof: dict[str, str | list[str]]) -> ApiRequest:
    """Fresh proofs, ``{bucket: presigned ListObjectsV2 URL or [URL, ...]}``, renewing this
    principal's grants before they expire."""
    return ApiRequest("POST", "/v1/proofs", "presenting proofs", "proofs", body={"proof": proof},
                      answer_field="grants", bucket=next(iter(proof), None))


def needs_proof(request: ApiRequest, exc: HandlerError) -> bool:
    """Whether ``exc`` answers a view request as one the handler holds no grant for: 403
    "proof_expired", or 404 (a restart lost the grants, or a wiped state the view)."""
    return request.method == "GET" and request.path.startswith("/v1/views/") and exc.status in (403, 404)


def list_request(view_id: str, after: str | None, limit: int, wait: float | None = None,
                 fresh: bool = False) -> ApiRequest:
    """A page of the view's listing: objects with keys greater than ``after``. While the
    bucket's first scan runs the handler holds it up to ``wait`` seconds (its default: 30),
    then answers 503 "scanning". ``fresh`` (a first page): the handler first applies every
    event its broker held when it asked."""
    params = {"limit": limit}
    if wait is not None:
        params["wait"] = wait
    if fresh and after is None:
        params["fresh"] = 1
    if after is not None:
        params["after"] = after
    return ApiRequest("GET", f"/v1/views/{view_id}/objects", f"listing view {view_id}", "list",
                      params=params, headers={"Accept": f"{MSGPACK}, {JSON}"}, view=view_id)


def changes_request(view_id: str, since: int, limit: int, wait: float = 0) -> ApiRequest:
    params = {"since": since, "limit": limit}
    if wait:
        params["wait"] = wait
    return ApiRequest("GET", f"/v1/views/{view_id}/changes", f"changes of view {view_id}", "changes",
                      params=params, headers={"Accept": f"{MSGPACK}, {JSON}"}, view=view_id)


def lookup_request(bucket: str, key: str) -> ApiRequest:
    path = f"/v1/objects/{urllib.parse.quote(bucket, safe='')}/{urllib.parse.quote(key, safe='')}"
    return ApiRequest("GET", path, f"looking up {bucket}/{key}", "lookup", absent_is_none=True, bucket=bucket)


def wait_objects_request(bucket: str, objects: list[dict], wait: float) -> ApiRequest:
    """Until the handler's records of ``objects`` ([{"key", "etag" (None: deleted), "since"}])
    are those versions (or ``wait`` seconds); the answer is the list still pending."""
    return ApiRequest("POST", "/v1/objects/wait", f"waiting for the handler to see {len(objects)} "
                      f"changes of bucket {bucket}", "wait_objects",
                      body={"bucket": bucket, "objects": objects, "wait": wait},
                      timeout=wait + 10, answer_field="pending", bucket=bucket)


def stream_request(view_id: str, since: int) -> ApiRequest:
    """The change stream after version ``since``: a reconnecting client passes the last
    version it saw (``Last-Event-ID``, as browsers do; ``since`` for the first connect)."""
    return ApiRequest("GET", f"/v1/views/{view_id}/stream", f"change stream of view {view_id}", "stream",
                      params={"since": since}, view=view_id,
                      headers={"Accept": "text/event-stream", "Last-Event-ID": str(since)})


def shards_request() -> ApiRequest:
    """The shard map a handler serves, its shard and its buckets (``GET /v1/shards``)."""
    return ApiRequest("GET", "/v1/shards", "shard map", "shards")


def handoff_request(bucket: str, to: str, proof: dict[str, str]) -> ApiRequest:
    """Hand ``bucket`` to shard ``to`` (``POST /v1/shards/handoff``); sent to its owner."""
    return ApiRequest("POST", "/v1/shards/handoff", f"handing {bucket} to shard {to}", "handoff",
                      body={"bucket": bucket, "to": to, "proof": proof}, bucket=bucket)


def _group_path(view_id: str, group: str, tail: str = "") -> str:
    return f"/v1/views/{view_id}/groups/{urllib.parse.quote(group, safe='')}{tail}"


def group_join_request(view_id: str, group: str, member: str, *, existing: bool = False,
                       lease: float | None = None, max_failures: int | None = None,
                       client: str = "") -> ApiRequest:
    """Join a work-queue group of a view (the first join makes it with ``lease`` and
    ``max_failures``; later ones get its settings): ``{"group", "view", "member", "lease",
    "max_failures"}``. ``existing``: the view's files the group has not seen become work too."""
    body = {"member": member, "existing": existing, "client": client}
    if lease is not None:
        body["lease"] = lease
    if max_failures is not None:
        body["max_failures"] = max_failures
    return ApiRequest("POST", _group_path(view_id, group, "/members"), f"joining group {group}",
                      "group_join", body=body,
                      view=view_id)


def group_leave_request(view_id: str, group: str, member: str) -> ApiRequest:
    """Leave a group: the files the member holds go to the others (``{"released": n}``)."""
    return ApiRequest("DELETE", _group_path(view_id, group, f"/members/{urllib.parse.quote(member, safe='')}"),
                      f"leaving group {group}", "group_leave", view=view_id)


def group_claim_request(view_id: str, group: str, member: str, n: int, wait: float) -> ApiRequest:
    """Up to ``n`` files, each in flight at the member for a lease, waiting up to ``wait``
    seconds for one: ``{"files": [{"key", "version", "attempt", "until", "object"}], "lease"}``."""
    return ApiRequest("POST", _group_path(view_id, group, "/claim"), f"claiming files of group {group}",
                      "group_claim",
                      body={"member": member, "max": n, "wait": wait}, timeout=wait + 30, view=view_id)


def group_renew_request(view_id: str, group: str, member: str) -> ApiRequest:
    """Renew the member's leases: ``{"held": [keys], "lease"}``."""
    return ApiRequest("POST", _group_path(view_id, group, "/renew"), f"renewing leases in group {group}",
                      "group_renew",
                      body={"member": member}, view=view_id)


def group_done_request(view_id: str, group: str, member: str, key: str, ok: bool,
                       error: str | None = None) -> ApiRequest:
    """The member is done with ``key`` (``ok``: acknowledged; else a failed attempt):
    ``{"key", "state"}``."""
    return ApiRequest("POST", _group_path(view_id, group, "/done"), f"finishing {key} in group {group}",
                      "group_done",
                      body={"member": member, "key": key, "ok": ok, "error": error}, view=view_id)


def group_give_back_request(view_id: str, group: str, member: str, key: str, reason: str) -> ApiRequest:
    """Give ``key`` back to the group unworked, the attempt not counted (``done`` with
    ``give_back``): ``{"key", "state"}`` — ``pending``, or ``removed`` when the file left
    the view."""
    return ApiRequest("POST", _group_path(view_id, group, "/done"), f"giving {key} back to group {group}",
                      "group_done", body={"member": member, "key": key, "ok": False, "error": reason,
                                          "give_back": True}, view=view_id)


def group_status_request(view_id: str, group: str) -> ApiRequest:
    """A group's members, files in flight, done, failed (with the failed files) and backlog."""
    return ApiRequest("GET", _group_path(view_id, group), f"status of group {group}", "group_status",
                      view=view_id)


def stream_changes(lines: Iterable[str]) -> Iterator[dict]:
    """The changes in the lines of a change stream (server-sent events), in order;
    raises :class:`Resync` where the handler sends ``event: resync``, and
    :class:`Misdirected` (the fields of a 421: the owner, the map) where it sends ``event:
    moved`` (the view's bucket now belongs to another shard)."""
    event, data = "message", []
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "":  # end of one event
            if event == "resync":
                raise Resync(json.loads("\n".join(data)).get("version") if data else None)
            if event == "moved":
                raise api_error("change stream", 421, json.loads("\n".join(data)) if data else {})
            if data:
                yield json.loads("\n".join(data))
            event, data = "message", []
        # `id:` repeats the change's "v"; ":" lines are keepalives.


# ----------------------------------------------------------------- failover

# Failures after which a request is tried at the next handler: it was not sent, or the
# handler went away before answering (every request of the API may be repeated). Not
# timeouts: a handler that is slow still holds the state lock, so no standby would answer.
