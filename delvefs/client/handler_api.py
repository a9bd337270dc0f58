"""HTTP client of the event handler's API (docs/API.md) for the FUSE client.

``httpx.AsyncClient`` on trio (via anyio): requests never block the loop. Listings and
changes are requested as msgpack. Errors: :class:`HandlerUnavailable` (cannot reach
it / 5xx), :class:`Resync` (410 on changes: list again), :class:`HandlerError` (other).
"""
from __future__ import annotations

import urllib.parse

import httpx
import msgpack

MSGPACK = "application/msgpack"


class HandlerError(Exception):
    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class HandlerUnavailable(HandlerError):
    pass


class Resync(HandlerError):
    """The version asked for is older than the handler's change log: relist."""

    def __init__(self, version: int | None):
        super().__init__("resync", 410, "resync")
        self.version = version


class HandlerClient:
    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 20.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # plain http: no TLS context with the CA bundle loaded (~60 ms at every mount)
        verify = not self.base_url.lower().startswith("http://")
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, verify=verify,
                                       timeout=httpx.Timeout(timeout, connect=5.0),
                                       limits=httpx.Limits(max_connections=16))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "HandlerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, *, params=None, json=None) -> tuple[int, object]:
        try:
            resp = await self._http.request(method, path, params=params, json=json,
                                            headers={"Accept": f"{MSGPACK}, application/json"})
        except httpx.HTTPError as exc:
            raise HandlerUnavailable(f"event handler at {self.base_url} unreachable: "
                                     f"{type(exc).__name__}: {exc}") from exc
        ctype = resp.headers.get("content-type", "")
        body: object = None
        if resp.content:
            try:
                body = (msgpack.unpackb(resp.content, raw=False) if ctype.startswith(MSGPACK)
                        else resp.json())
            except ValueError:
                body = {"message": resp.text[:200]}
        return resp.status_code, body

    def _error(self, what: str, status: int, body) -> HandlerError:
        body = body if isinstance(body, dict) else {}
        msg = f"{what}: HTTP {status} {body.get('error', '')}: {body.get('message', '')}".rstrip(": ")
        cls = HandlerUnavailable if status >= 500 else HandlerError
        return cls(msg, status, body.get("error"))

    async def health(self) -> dict:
        status, body = await self._request("GET", "/healthz")
        if status != 200:
            raise self._error("health", status, body)
        return body

    async def register(self, client: str, views: list[dict], proof: dict[str, str]) -> list[dict]:
        """``views``: [{"name", "spec"}] -> [{"name", "id", "version"}]."""
        status, body = await self._request("POST", "/v1/views",
                                           json={"client": client, "views": views, "proof": proof})
        if status != 200:
            raise self._error("registering views", status, body)
        return body["views"]

    async def list_page(self, view_id: str, after: str | None, limit: int = 50000) -> dict:
        # while the bucket's first scan runs the handler holds the request up to `wait`
        # seconds, then says 503 "scanning": well before this client would give up
        params = {"limit": limit, "wait": self.timeout / 2}
        if after is not None:
            params["after"] = after
        status, body = await self._request("GET", f"/v1/views/{view_id}/objects", params=params)
        if status != 200:
            raise self._error(f"listing view {view_id}", status, body)
        return body

    async def changes(self, view_id: str, since: int, limit: int = 50000, wait: float = 0) -> dict:
        params = {"since": since, "limit": limit}
        if wait:
            params["wait"] = wait
        status, body = await self._request("GET", f"/v1/views/{view_id}/changes", params=params)
        if status == 410:
            raise Resync((body or {}).get("version") if isinstance(body, dict) else None)
        if status != 200:
            raise self._error(f"changes of view {view_id}", status, body)
        return body

    async def lookup(self, bucket: str, key: str) -> dict | None:
        path = f"/v1/objects/{urllib.parse.quote(bucket, safe='')}/{urllib.parse.quote(key, safe='')}"
        status, body = await self._request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise self._error(f"looking up {bucket}/{key}", status, body)
        return body
