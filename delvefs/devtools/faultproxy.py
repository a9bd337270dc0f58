"""A TCP proxy on loopback that injects faults between an S3 client and MinIO, switchable
at run time, and logs the HTTP/1.1 requests that pass it.

Tests point a mount's ``AWS_ENDPOINT_URL`` at :attr:`FaultProxy.url` and switch modes
while it works:

* ``pass_through()`` — forward bytes unchanged (the start mode);
* ``down()`` — refuse new connections (the port is closed) and reset every open one, as a
  crashed server would; ``pass_through()`` listens on the same port again;
* ``slow(latency, bandwidth)`` — each chunk (at most 64 KiB) waits ``latency`` seconds
  before it is forwarded, and each direction of a connection carries at most
  ``bandwidth`` bytes/s;
* ``reset(after_bytes, probability, limit, direction)`` — reset connections (RST) once
  they have carried ``after_bytes`` more bytes (in one direction or both); with
  ``probability`` only that share of them, drawn from a seeded random generator; with
  ``limit`` at most that many, then it passes again.
  Connections open at the switch count from the switch on (kept-alive ones too);
* ``hold(text)`` — a request whose bytes contain ``text`` (e.g. part of its key) is logged
  but never forwarded: its connection waits until the mode changes, then is reset (a
  client killed meanwhile never had it carried out); everything else passes.

:attr:`FaultProxy.log` holds one :class:`Request` per HTTP request seen (method, path,
query, selected headers, the status answered or ``None`` when the connection was cut
first), so a test can assert "this PUT was sent once" or "no PUT after that time".
Parsing never affects forwarding: a stream it cannot parse is forwarded and no longer
logged.

``python -m delvefs.devtools.faultproxy TARGET_PORT`` runs one in the foreground (pass
mode) for trying things by hand.
"""
from __future__ import annotations

import contextlib
import random
import selectors
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass

CHUNK = 64 * 1024
# headers worth asserting on in S3 traffic (lower case)
LOGGED_HEADERS = ("content-length", "if-match", "if-none-match", "x-amz-copy-source",
                  "x-amz-decoded-content-length", "range", "expect", "x-amz-tagging",
                  "content-type", "connection")


@dataclass
class Request:
    connection: int
    method: str
    path: str             # URL-decoded, without the query
    query: str
    headers: dict[str, str]
    started: float        # time.time() when its request line arrived
    status: int | None = None   # None: no (complete) answer; the connection was cut first
    finished: float | None = None

    @property
    def key(self) -> str:
        """The object key of a path-style S3 request (``/bucket/key``), '' for a bucket."""
        return self.path.lstrip("/").partition("/")[2]

    @property
    def bucket(self) -> str:
        return self.path.lstrip("/").partition("/")[0]


@dataclass
class _Mode:
    name: str = "pass"
    latency: float = 0.0
    bandwidth: float | None = None
    after_bytes: int = 0
    direction: str = "both"
    probability: float | None = None
    limit: int | None = None
    text: bytes = b""          # hold: what a held request contains
    generation: int = 0


class _HttpParser:
    """Incremental HTTP/1.1 message framing: heads and bodies (Content-Length or chunked).
    ``feed`` returns the heads completed by the data: (start line, headers dict)."""

    def __init__(self, responses: bool, methods: list[str] | None = None):
        self.responses = responses
        self.methods = methods      # for responses: the methods of requests not answered yet
        self.buf = b""
        self.body_left = 0          # bytes of a Content-Length body still to skip
        self.chunked = False        # in a chunked body: buf holds what follows
        self.to_close = False       # a response body that lasts until the connection closes
        self.broken = False

    def feed(self, data: bytes) -> list[tuple[str, dict[str, str]]]:
        if self.broken or self.to_close:
            return []
        heads = []
        try:
            while data:
                if self.body_left:
                    n = min(self.body_left, len(data))
                    self.body_left -= n
                    data = data[n:]
                    continue
                self.buf += data
                data = b""
                if self.chunked:
                    data, done = self._chunks()
                    if not done:
                        return heads
                    continue
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > 1 << 20:
                        raise ValueError("head too long")
                    return heads
                head, data, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4:], b""
                line, *fields = head.split("\r\n")
                headers = {}
                for f in fields:
                    name, _, value = f.partition(":")
                    headers[name.strip().lower()] = value.strip()
                heads.append((line, headers))
                self._frame(line, headers)
                if self.to_close:
                    return heads
        except (ValueError, IndexError, UnicodeDecodeError):
            self.broken = True
        return heads

    def _frame(self, line: str, headers: dict[str, str]) -> None:
        if self.responses:
            status = int(line.split()[1])
            if status < 200:
                return                              # 100 Continue: the real answer follows
            method = self.methods.pop(0) if self.methods else "GET"
            if method == "HEAD" or status in (204, 304):
                return
        if headers.get("transfer-encoding", "").lower() == "chunked":
            self.chunked = True
        elif "content-length" in headers:
            self.body_left = int(headers["content-length"])
        elif self.responses:
            self.to_close = True

    def _chunks(self) -> tuple[bytes, bool]:
        """Consume whole chunks from buf; (data after the body, whether the body ended)."""
        while True:
            end = self.buf.find(b"\r\n")
            if end < 0:
                return b"", False
            size = int(self.buf[:end].split(b";")[0], 16)
            if size == 0:               # the last chunk: optional trailers, an empty line
                if self.buf.startswith(b"\r\n", end + 2):
                    after = self.buf[end + 4:]
                else:
                    trailers_end = self.buf.find(b"\r\n\r\n", end + 2)
                    if trailers_end < 0:
                        return b"", False
                    after = self.buf[trailers_end + 4:]
                self.buf, self.chunked = b"", False
                return after, True
            if len(self.buf) < end + 2 + size + 2:
                return b"", False
            self.buf = self.buf[end + 2 + size + 2:]


class _Connection:
    def __init__(self, proxy: "FaultProxy", number: int, client: socket.socket):
        self.proxy, self.number, self.client = proxy, number, client
        self.upstream: socket.socket | None = None
        self.cut = threading.Event()
        self.generation = -1
        self.budget: int | None = None      # bytes until a reset; None: not doomed
        self.pending: list[Request] = []
        self.methods: list[str] = []
        self.requests = _HttpParser(responses=False)
        self.responses = _HttpParser(responses=True, methods=self.methods)

    def run(self) -> None:
        try:
            self.upstream = socket.create_connection(self.proxy.target, timeout=5)
        except OSError:
            _reset(self.client)         # as the real server: no one there
            self.proxy._forget(self)
            return
        for s in (self.client, self.upstream):
            s.settimeout(0.2)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sel = selectors.DefaultSelector()
        sel.register(self.client, selectors.EVENT_READ, (self.upstream, True))
        sel.register(self.upstream, selectors.EVENT_READ, (self.client, False))
        try:
            while not self.cut.is_set():
                for key, _ in sel.select(0.05):
                    try:
                        data = key.fileobj.recv(CHUNK)
                    except (socket.timeout, BlockingIOError):
                        continue
                    if not data:
                        return
                    if not self._forward(data, *key.data):
                        return
        except OSError:
            pass
        finally:
            sel.close()
            self._close()

    def _forward(self, data: bytes, to: socket.socket, upward: bool) -> bool:
        """Apply the mode, log what goes through, send; False once the connection is to end."""
        mode = self.proxy._mode_for(self)
        counted = mode.direction == "both" or (mode.direction == "up") == upward
        if mode.name == "reset" and self.budget is not None and counted:
            if len(data) > self.budget:
                # carry exactly the budget (however the bytes were chunked), then reset
                carried = data[:self.budget]
                self.budget = 0
                if carried:
                    self._observe(carried, upward)
                    with contextlib.suppress(OSError):
                        to.sendall(carried)
                self.cut.set()
                return False
            self.budget -= len(data)
        if mode.name == "hold" and upward and mode.text in data:
            self._observe(data, upward)
            while not self.cut.wait(0.05) and self.proxy._mode_for(self) is mode:
                pass
            self.cut.set()
            return False
        if mode.name == "slow":
            delay = mode.latency + (len(data) / mode.bandwidth if mode.bandwidth else 0.0)
            if delay and self.cut.wait(delay):
                return False
        self._observe(data, upward)
        view = memoryview(data)
        while view:
            if self.cut.is_set():
                return False
            try:
                n = to.send(view)
            except socket.timeout:
                continue
            view = view[n:]
        return True

    def _observe(self, data: bytes, upward: bool) -> None:
        try:
            self._parse(data, upward)
        except (ValueError, IndexError):        # not HTTP as expected: forward, log no more
            self.requests.broken = self.responses.broken = True

    def _parse(self, data: bytes, upward: bool) -> None:
        if upward:
            for line, headers in self.requests.feed(data):
                method, target, _ = line.split(" ", 2)
                parsed = urllib.parse.urlsplit(target)
                request = Request(self.number, method, urllib.parse.unquote(parsed.path),
                                  parsed.query, {h: headers[h] for h in LOGGED_HEADERS if h in headers},
                                  time.time())
                self.pending.append(request)
                self.methods.append(method)
                self.proxy._record(request)
        else:
            for line, _ in self.responses.feed(data):
                status = int(line.split()[1])
                if status >= 200 and self.pending:
                    request = self.pending.pop(0)
                    request.status, request.finished = status, time.time()

    def _close(self) -> None:
        reset = self.cut.is_set()
        for s in (self.client, self.upstream):
            if s is not None and reset:
                _reset(s)
            elif s is not None:
                s.close()
        self.proxy._forget(self)


def _reset(sock: socket.socket) -> None:
    """Close with RST (linger 0), as a crashed peer's kernel would answer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class FaultProxy:
    """A fault-injecting TCP proxy to ``target`` (host, port), listening on
    ``host:port`` (port 0: a free one, kept across ``down``/``pass_through``)."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1", port: int = 0,
                 seed: int = 0):
        self.target = target
        self.host, self.port = host, port
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._mode = _Mode()
        self._connections: set[_Connection] = set()
        self._numbers = 0
        self.log: list[Request] = []
        self.resets = 0                  # connections reset by ``reset`` so far
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._closed = False

    @classmethod
    def to_url(cls, url: str, **kwargs) -> "FaultProxy":
        """A proxy to the host and port of ``url`` (e.g. MinIO's endpoint)."""
        u = urllib.parse.urlsplit(url)
        return cls((u.hostname, u.port or 80), **kwargs)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- life cycle ---

    def start(self) -> "FaultProxy":
        self._listen()
        return self

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        self._stop_listening()
        self._cut_all()

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(128)
        s.settimeout(0.1)
        self.port = s.getsockname()[1]
        self._listener = s
        self._acceptor = threading.Thread(target=self._accept, args=(s,), daemon=True,
                                          name=f"faultproxy-{self.port}")
        self._acceptor.start()

    def _stop_listening(self) -> None:
        listener, acceptor = self._listener, self._acceptor
        self._listener = self._acceptor = None
        if listener is not None:
            listener.close()
        if acceptor is not None:
            acceptor.join()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self._numbers += 1
                conn = _Connection(self, self._numbers, client)
                self._connections.add(conn)
            threading.Thread(target=conn.run, daemon=True,
                             name=f"faultproxy-{self.port}-{conn.number}").start()

    def _cut_all(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for c in connections:
            c.cut.set()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
            for r in conn.pending:
                r.finished = time.time()     # cut before its answer: status stays None

    # --- modes ---

    def _switch(self, **mode) -> None:
        with self._lock:
            self._mode = _Mode(generation=self._mode.generation + 1, **mode)

    def pass_through(self) -> None:
        """Forward everything (and listen again after ``down``)."""
        self._switch(name="pass")
        if self._listener is None and not self._closed:
            self._listen()

    def down(self) -> None:
        """Refuse new connections and reset the open ones until ``pass_through``."""
        self._switch(name="down")
        self._stop_listening()
        self._cut_all()

    def slow(self, latency: float = 0.0, bandwidth: float | None = None) -> None:
        """Delay each chunk by ``latency`` s; at most ``bandwidth`` bytes/s per direction of
        each connection."""
        self._switch(name="slow", latency=latency, bandwidth=bandwidth)
        if self._listener is None:
            self._listen()

    def reset(self, after_bytes: int = 0, probability: float | None = None,
              limit: int | None = None, direction: str = "both") -> None:
        """Reset connections once they have carried ``after_bytes`` more bytes (``direction``
        "both" together, "up" client to server only, "down" server to client only: "down"
        with 0 cuts a request the server has carried out before its answer arrives); with
        ``probability`` each connection is chosen with that probability (seeded); after
        ``limit`` chosen connections the proxy passes everything again."""
        if direction not in ("both", "up", "down"):
            raise ValueError(f"direction must be both, up or down, not {direction!r}")
        self._switch(name="reset", after_bytes=after_bytes, probability=probability,
                     limit=limit, direction=direction)
        if self._listener is None:
            self._listen()

    def hold(self, text: str) -> None:
        """Hold every request whose bytes contain ``text`` (never forwarded; reset when the
        mode changes); pass everything else."""
        self._switch(name="hold", text=text.encode())
        if self._listener is None:
            self._listen()

    @property
    def mode(self) -> str:
        return self._mode.name

    def _mode_for(self, conn: _Connection) -> _Mode:
        """The current mode; on a connection's first bytes after a switch, decides (in the
        seeded generator's order) whether a reset mode dooms it."""
        with self._lock:
            mode = self._mode
            if conn.generation != mode.generation:
                conn.generation = mode.generation
                conn.budget = None
                if mode.name == "reset" and (mode.limit is None or self.resets < mode.limit):
                    if mode.probability is None or self._random.random() < mode.probability:
                        conn.budget = mode.after_bytes
                        self.resets += 1
            return mode

    # --- the request log ---

    def _record(self, request: Request) -> None:
        with self._lock:
            self.log.append(request)

    def requests(self, method: str | None = None, key: str | None = None,
                 since: float | None = None) -> list[Request]:
        """Logged requests, optionally only of ``method``, of object ``key``, started at or
        after ``since`` (time.time())."""
        with self._lock:
            found = list(self.log)
        return [r for r in found if (method is None or r.method == method)
                and (key is None or r.key == key) and (since is None or r.started >= since)]

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()


def main(argv: list[str] | None = None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="python -m delvefs.devtools.faultproxy",
                                description="forward a loopback port to TARGET_PORT, logging HTTP requests")
    p.add_argument("target_port", type=int)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    with FaultProxy(("127.0.0.1", args.target_port), port=args.port) as proxy:
        print(f"forwarding {proxy.url} -> 127.0.0.1:{args.target_port}", flush=True)
        seen = 0
        try:
            while True:
                time.sleep(0.5)
                for r in proxy.log[seen:]:
                    print(r.method, r.path, r.status, flush=True)
                seen = len(proxy.log)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
