"""The fault proxy of the write-path fault tests (delvefs/devtools/faultproxy.py), in front
of a small local HTTP/1.1 server: forwarding, the request log, down, reset, slow."""
from __future__ import annotations

import http.client
import http.server
import socket
import threading

import pytest

from delvefs.devtools.faultproxy import FaultProxy


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"     # kept-alive connections, as S3 clients use them

    def log_message(self, *args):
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        self._answer(200, self.server.store.get(path, b"") * (2 if "double" in path else 1))

    def do_HEAD(self):
        self._answer(200 if self.path in self.server.store else 404, self.server.store.get(self.path, b""))

    def do_PUT(self):
        self.server.store[self.path] = self._body()
        self._answer(200, b"")

    def do_DELETE(self):
        self.server.store.pop(self.path, None)
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.store = {}
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def proxy(server):
    with FaultProxy(("127.0.0.1", server.server_address[1]), seed=7) as p:
        yield p


def connect(proxy) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)


def call(conn, method, path, body=None, headers=None) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    r = conn.getresponse()
    return r.status, r.read()


def test_pass_forwards_and_logs_each_request_with_its_status(proxy, server):
    conn = connect(proxy)
    data = bytes(range(256)) * 1000
    assert call(conn, "PUT", "/b/some%20key", data, {"If-Match": '"e1"'})[0] == 200
    assert call(conn, "HEAD", "/b/some%20key") == (200, b"")
    assert call(conn, "GET", "/b/some%20key?x=1") == (200, data)
    assert call(conn, "GET", "/b/some%20key") == (200, data)
    # a chunked request body is framed too: the request after it is seen
    conn.putrequest("PUT", "/b/chunked")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"5\r\nhello\r\n0\r\n\r\n")
    assert conn.getresponse().read() == b""
    assert call(conn, "DELETE", "/b/chunked")[0] == 204
    conn.close()
    assert server.store["/b/some%20key"] == data
    log = proxy.requests()
    assert [(r.method, r.key, r.status) for r in log] == [
        ("PUT", "some key", 200), ("HEAD", "some key", 200), ("GET", "some key", 200),
        ("GET", "some key", 200), ("PUT", "chunked", 200), ("DELETE", "chunked", 204)]
    assert log[0].headers["if-match"] == '"e1"' and log[0].headers["content-length"] == str(len(data))
    assert log[2].query == "x=1" and log[0].bucket == "b"
    assert len({r.connection for r in log}) == 1                       # one kept-alive connection
    assert [r.key for r in proxy.requests("PUT", since=log[1].started)] == ["chunked"]


def test_down_refuses_and_cuts_then_passes_on_the_same_port(proxy, server):
    conn = connect(proxy)
    assert call(conn, "PUT", "/b/k", b"v")[0] == 200
    port = proxy.port
    proxy.down()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        call(conn, "GET", "/b/k")                    # the kept-alive connection was cut
    proxy.pass_through()
    assert proxy.port == port
    assert call(connect(proxy), "GET", "/b/k") == (200, b"v")


def test_reset_after_bytes_cuts_a_body_and_limit_lets_later_ones_pass(proxy, server):
    conn = connect(proxy)
    assert call(conn, "GET", "/b/none")[0] == 200            # kept alive across the switch
    proxy.reset(after_bytes=10_000, limit=1)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        call(conn, "PUT", "/b/big", b"x" * 100_000)
    assert "/b/big" not in server.store
    assert proxy.requests("PUT")[0].status is None            # cut before its answer
    conn = connect(proxy)
    assert call(conn, "PUT", "/b/big", b"x" * 100_000)[0] == 200   # the limit was one reset
    assert proxy.resets == 1 and server.store["/b/big"] == b"x" * 100_000


def test_reset_of_the_answer_only_leaves_the_request_carried_out(proxy, server):
    proxy.reset(direction="down", limit=1)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        call(connect(proxy), "PUT", "/b/done", b"applied")
    assert server.store["/b/done"] == b"applied"            # the server did it; no one heard
    assert [r.status for r in proxy.requests("PUT")] == [None]
    with pytest.raises(ValueError):
        proxy.reset(direction="sideways")


def test_reset_with_probability_is_seeded(server):
    def outcomes(seed: int) -> list[bool]:
        with FaultProxy(("127.0.0.1", server.server_address[1]), seed=seed) as p:
            p.reset(probability=0.5)
            result = []
            for _ in range(16):
                try:
                    result.append(call(connect(p), "GET", "/b/x")[0] == 200)
                except (ConnectionError, http.client.HTTPException):
                    result.append(False)
            return result
    first = outcomes(3)
    assert first == outcomes(3) and 0 < first.count(False) < 16


def test_slow_still_forwards_byte_exact(proxy, server):
    server.store["/b/double"] = b"y" * 50_000
    proxy.slow(latency=0.01, bandwidth=2_000_000)
    assert call(connect(proxy), "GET", "/b/double") == (200, b"y" * 100_000)
    proxy.pass_through()
    assert proxy.mode == "pass"
