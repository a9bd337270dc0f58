"""HTTP/1.1 to the event handler over kept-alive ``http.client`` connections: about 0.1 ms
of Python a request where httpx spent ~1 ms. The handler clients
(delvefs/client/handler/api.py) speak to the handler only through it.

:class:`HttpClient` is the client of one handler URL, with a pool of idle connections to
it (:class:`delvefs.shared.connpool.ConnectionPool`, as the S3 client's; at most
``max_idle`` kept); a pool per base URL. It offers the part of httpx.Client's
interface the handler clients and the tests' own requests use (``request``, ``get``,
``post``, ``delete``, ``stream``, ``build_request`` + ``send``), answering a
:class:`Response` (``status_code``, ``headers``, ``content``, ``text``, ``json()``,
``iter_lines()``, ``raise_for_status()``, ``close()``).

Calls block: the mount makes them in worker threads (``trio.to_thread.run_sync`` under a
limiter, never on its trio loop), the other clients in their own thread.

Failures to get an answer raise a :class:`TransportError`: :class:`ConnectFailed` (no
connection: nothing was sent; a connect timeout too), :class:`ConnectionLost` (the
connection broke while the request went out or the answer came in, or the answer was not
HTTP), :class:`TimedOut` (no byte within the timeout). An idle connection the server has
closed is noticed before reuse and dropped; an idempotent request whose reused connection
turns out closed as it is sent goes once more, on a new connection.

Thread safety: an :class:`HttpClient` may be used by any number of threads at once. Its
pool is thread-safe, and a connection serves one request at a time:
taken out of the pool for it, put back only once its answer has been read to the end
(closed otherwise). A :class:`Response` belongs to the thread that reads it.
"""
from __future__ import annotations

import codecs
import contextlib
import http.client
import json as jsonlib
import re
import ssl
import urllib.parse
from collections.abc import Iterator

from delvefs.shared.connpool import STALE, ConnectionPool

# requests that may go twice: sending one again on a fresh connection is safe
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_LINE_END = re.compile(r"\r\n|\r|\n")
# characters a path keeps as they are (httpx's choice; "%": escapes made by the caller stay)
_PATH_SAFE = "/%!$&'()*+,;=:@"
READ_SIZE = 64 * 1024  # bytes asked of the socket at once when streaming


class TransportError(Exception):
    """No (complete) answer from the server."""


class ConnectFailed(TransportError):
    """No connection could be made (refused, unreachable, TLS refused, connect timeout)."""


class ConnectionLost(TransportError):
    """The connection broke during the exchange, or the answer was not HTTP/1.1."""


class TimedOut(TransportError):
    """The server sent nothing within the read timeout."""


class StatusError(Exception):
    """:meth:`Response.raise_for_status` of an answer that is not 2xx."""

    def __init__(self, response: "Response"):
        super().__init__(f"HTTP {response.status_code} for {response.request_line}")
        self.response = response


def _lost(exc: BaseException, what: str) -> TransportError:
    """The TransportError an exception of an exchange means."""
    if isinstance(exc, TimeoutError):
        return TimedOut(f"{what}: no answer within the timeout")
    return ConnectionLost(f"{what}: {type(exc).__name__}: {exc}")


def _seconds(timeout) -> float | None:
    """A timeout in seconds; an object with ``read`` (an httpx.Timeout some tests pass) gives that."""
    return getattr(timeout, "read", timeout)


def _query_value(value) -> str:
    """A parameter value as httpx writes it (true/false, None as empty)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def _target(url: str) -> str:
    """A path (and query) as a request line may carry it: spaces, non-ASCII and other
    characters percent-encoded (UTF-8)."""
    path, mark, query = url.partition("?")
    return urllib.parse.quote(path, safe=_PATH_SAFE) + mark + urllib.parse.quote(query, safe=_PATH_SAFE + "?")


def _query(params: dict | None) -> str:
    pairs = []
    for name, value in (params or {}).items():
        for one in value if isinstance(value, (list, tuple)) else (value,):
            pairs.append((name, _query_value(one)))
    return urllib.parse.urlencode(pairs)


class Request:
    """One request, ready to go: ``target`` is the path with its query."""

    __slots__ = ("method", "target", "headers", "body", "timeout")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes | None,
                 timeout: float):
        self.method, self.target, self.headers = method, target, headers
        self.body, self.timeout = body, timeout


class Response:
    """An answer: its status and headers at once; its body read by :meth:`read` (done
    already unless streamed), or piece by piece by :meth:`iter_bytes` / :meth:`iter_lines`.
    Its connection goes back to the pool once the body has been read to the end; ``close``
    gives it up before that."""

    def __init__(self, raw: http.client.HTTPResponse, request_line: str, release):
        self.status_code = raw.status
        self.headers = raw.headers  # case-insensitive: .get("content-type"), ["Last-Event-ID"]
        self.request_line = request_line
        self._raw = raw
        self._release = release  # release(reusable: bool), called once
        self._content: bytes | None = None

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def content(self) -> bytes:
        return self.read()

    @property
    def encoding(self) -> str:
        """The charset the Content-Type names, if Python knows it; else UTF-8."""
        charset = self.headers.get_content_charset()
        try:
            return codecs.lookup(charset).name if charset else "utf-8"
        except LookupError:
            return "utf-8"

    @property
    def text(self) -> str:
        return self.content.decode(self.encoding, errors="replace")

    def json(self):
        return jsonlib.loads(self.content)

    def raise_for_status(self) -> "Response":
        if not self.is_success:
            raise StatusError(self)
        return self

    def read(self) -> bytes:
        """The whole body (read once)."""
        if self._content is None:
            try:
                self._content = self._raw.read()
            except (OSError, http.client.HTTPException) as exc:
                self._done(False)
                raise _lost(exc, self.request_line) from exc
            self._done(True)
        return self._content

    def iter_bytes(self) -> Iterator[bytes]:
        """The body in the pieces it arrives in (a piece as soon as it is there)."""
        if self._content is not None:
            if self._content:
                yield self._content
            return
        try:
            while data := self._raw.read1(READ_SIZE):
                yield data
            self._raw.read()  # b"": marks the body read to its end
        except (OSError, http.client.HTTPException) as exc:
            self._done(False)
            raise _lost(exc, self.request_line) from exc
        self._content = b""  # consumed
        self._done(True)

    def iter_lines(self) -> Iterator[str]:
        """The body's lines (without their ends: \\n, \\r\\n or \\r), each as soon as it is complete."""
        decoder = codecs.getincrementaldecoder(self.encoding)(errors="replace")
        pending = ""
        for data in self.iter_bytes():
            pending += decoder.decode(data)
            # a last "\r" may be half of "\r\n": held back with the unfinished line
            held = "\r" if pending.endswith("\r") else ""
            *lines, pending = _LINE_END.split(pending[:len(pending) - len(held)])
            pending += held
            yield from lines
        pending += decoder.decode(b"", final=True)
        if pending:
            lines = _LINE_END.split(pending)
            yield from lines[:-1] if lines[-1] == "" else lines

    def close(self) -> None:
        """Done with it: a body not read to its end closes the connection."""
        if self._release is not None:
            self._done(self._raw.isclosed())

    def _done(self, complete: bool) -> None:
        release, self._release = self._release, None
        if release is None:
            return
        reusable = complete and self._raw.isclosed() and not self._raw.will_close
        if not reusable:
            self._raw.close()
        release(reusable)


def _tls_context(verify) -> ssl.SSLContext:
    """The context of https connections by ``verify`` (see :class:`HttpClient`)."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    context = ssl.create_default_context()
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class HttpClient:
    """HTTP/1.1 to one base URL (``http://host:port[/path]`` or ``https://...``) with a pool
    of kept-alive connections. ``headers`` go with every request (the bearer token);
    ``verify``: for https, True (the system's CAs), an ``ssl.SSLContext`` (the handler's
    CA), or False (not verified). ``timeout``: seconds each read may wait (a request may
    give its own); ``connect_timeout``: seconds to connect. Thread-safe."""

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None, verify=True,
                 timeout: float = 20.0, connect_timeout: float = 5.0, max_idle: int = 16):
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url
        self._host, self._port = url.hostname, url.port
        self._base_path = url.path.rstrip("/")
        self._tls = _tls_context(verify) if url.scheme == "https" else None
        self.headers = {"Accept": "*/*", "User-Agent": "delvefs", **(headers or {})}
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self._pool = ConnectionPool(self._host, self._port, tls=self._tls,
                                    connect_timeout=connect_timeout, max_idle=max_idle)

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # the part of httpx.Client's interface in use

    def build_request(self, method: str, url: str, *, params: dict | None = None, json=None,
                      headers: dict[str, str] | None = None, timeout=None) -> Request:
        target = _target(self._base_path + url)
        query = _query(params)
        if query:
            target += ("&" if "?" in target else "?") + query
        all_headers = {**self.headers, **(headers or {})}
        body = None
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":")).encode()
            all_headers["Content-Type"] = "application/json"
        return Request(method, target, all_headers, body,
                       self.timeout if timeout is None else _seconds(timeout))

    def request(self, method: str, url: str, **options) -> Response:
        """The answer, its body read (``options``: those of :meth:`build_request`)."""
        return self.send(self.build_request(method, url, **options))

    def get(self, url: str, **options) -> Response:
        return self.request("GET", url, **options)

    def post(self, url: str, **options) -> Response:
        return self.request("POST", url, **options)

    def delete(self, url: str, **options) -> Response:
        return self.request("DELETE", url, **options)

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **options) -> Iterator[Response]:
        """The answer with its body unread (read it with ``iter_lines``); closed at the end."""
        response = self.send(self.build_request(method, url, **options), stream=True)
        try:
            yield response
        finally:
            response.close()

    def send(self, request: Request, *, stream: bool = False) -> Response:
        """Send ``request``; the answer once its status and headers are in, its body read
        too unless ``stream``."""
        request_line = f"{request.method} {self.base_url}{request.target}"
        fresh_only = False  # after a stale reused connection: a new one
        while True:
            conn, reused = self._checkout(fresh_only, request_line)
            try:
                conn.sock.settimeout(request.timeout)
                conn.request(request.method, request.target, request.body, request.headers)
                raw = conn.getresponse()
            except STALE as exc:
                conn.close()
                if reused and request.method in IDEMPOTENT:
                    fresh_only = True
                    continue
                raise _lost(exc, request_line) from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _lost(exc, request_line) from exc
            except BaseException:
                conn.close()
                raise
            response = Response(raw, request_line, lambda reusable, conn=conn: self._checkin(conn, reusable))
            if not stream:
                response.read()
            return response

    def close(self) -> None:
        """Close the idle connections; those in use close when their answers are done."""
        self._pool.close()

    @property
    def connections_made(self) -> int:
        """How many connections this client opened (tests look at reuse)."""
        return self._pool.connections_made

    # the pool

    def _checkout(self, fresh_only: bool, request_line: str) -> tuple[http.client.HTTPConnection, bool]:
        """(connection, reused): the most recently used idle one still open, else a new one."""
        try:
            return self._pool.take(fresh=fresh_only, check=True)
        except OSError as exc:
            raise ConnectFailed(f"{request_line}: cannot connect: {type(exc).__name__}: {exc}") from exc

    def _checkin(self, conn: http.client.HTTPConnection, reusable: bool) -> None:
        if reusable:
            self._pool.put(conn)
        else:
            conn.close()
