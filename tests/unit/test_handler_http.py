"""The handler clients' HTTP/1.1 (delvefs/client/handler/http.py) against a real local
server (``http.server`` in a thread): connections kept alive and reused, a connection the
server closed dropped or the request sent again, timeouts as HandlerUnavailable, chunked
bodies read as they arrive, failover to the next handler URL, TLS with the handler CA, and
the mount's client on trio (requests in worker threads, several at once)."""
from __future__ import annotations

import http.server
import json
import queue
import select
import shutil
import socket
import ssl
import subprocess
import threading

import msgpack
import pytest
import trio

from delvefs.client.handler.http import ConnectionLost, HttpClient, TimedOut
from delvefs.client.handler.api import HandlerClient, HandlerUnavailable, Resync, SyncHandlerClient


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # headers and body go in separate writes
    server: "Server"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.answer()

    def do_DELETE(self) -> None:
        self.answer()

    def answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests_here = getattr(self, "requests_here", 0) + 1
        self.server.seen(self, body)
        path = self.path.split("?", 1)[0]
        if self.server.standby:
            return self.send_json(503, {"error": "standby", "message": "another handler is active"})
        if path == "/close-on-reuse" and self.requests_here > 1:
            self.close_connection = True  # as a server whose keep-alive timeout just ran out
            return None
        if path == "/slow" or (path == "/healthz" and self.server.hold_health.is_set()):
            self.server.released.wait(30)
        if path.endswith("/stream"):
            return self.send_stream()
        if path.endswith("/objects"):
            return self.send_body(200, msgpack.packb({"version": 7, "objects": [{"key": "a"}], "next": None}),
                                  "application/msgpack")
        if path.endswith("/changes"):
            return self.send_json(410, {"error": "resync", "version": 3})
        self.send_json(200, {"status": "ok", "port": self.client_address[1], "path": self.path})

    def send_json(self, status: int, body: dict) -> None:
        self.send_body(status, json.dumps(body).encode(), "application/json")

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_stream(self) -> None:
        """A chunked body: each piece the test puts on ``server.pieces`` (None ends it)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while (piece := self.server.pieces.get(timeout=30)) is not None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, tls: ssl.SSLContext | None = None, standby: bool = False):
        super().__init__(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server_address[1]}"
        self.standby = standby
        self.requests: list[tuple[str, str, int, dict, bytes]] = []  # method, path, port, headers, body
        self.connections: dict[int, socket.socket] = {}  # client port -> the server's socket
        self.hold_health = threading.Event()  # /healthz waits for `released`
        self.released = threading.Event()
        self.pieces: queue.Queue = queue.Queue()
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def seen(self, handler: Handler, body: bytes) -> None:
        port = handler.client_address[1]
        self.connections[port] = handler.connection
        self.requests.append((handler.command, handler.path, port, dict(handler.headers), body))

    def paths(self) -> list[str]:
        return [path for _method, path, *_ in self.requests]

    def stop(self) -> None:
        self.released.set()
        self.pieces.put(None)
        self.shutdown()
        self.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def client(server):
    with HttpClient(server.url, timeout=10) as c:
        yield c


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_kept_alive_connection_carries_the_next_requests(server, client):
    ports = {client.get("/healthz").json()["port"] for _ in range(5)}
    assert len(ports) == 1 and client.connections_made == 1
    r = client.post("/v1/proofs", json={"proof": {"b": "u"}}, params={"flag": True, "n": 2})
    assert r.status_code == 200 and r.json()["port"] in ports
    method, path, _port, headers, body = server.requests[-1]
    assert (method, path) == ("POST", "/v1/proofs?flag=true&n=2")
    assert json.loads(body) == {"proof": {"b": "u"}} and headers["Content-Type"] == "application/json"
    client.get("/v1/objects/b/a b+c/\u00fc%2F.txt")  # spaces and non-ASCII encoded, escapes kept
    assert server.requests[-1][1] == "/v1/objects/b/a%20b+c/%C3%BC%2F.txt"


def test_an_idle_connection_the_server_closed_is_dropped_before_reuse(server, client):
    port = client.get("/healthz").json()["port"]
    server.connections[port].shutdown(socket.SHUT_RDWR)
    idle = client._pool._idle[0].sock
    assert select.select([idle], [], [], 10)[0], "the client's socket never saw the close"
    for method in ("GET", "POST"):  # a POST too: nothing was sent on the dead connection
        assert client.request(method, "/healthz").status_code == 200
    assert client.connections_made == 2


def test_an_idempotent_request_on_a_connection_closed_under_it_goes_once_more(server, client):
    client.get("/healthz")
    r = client.get("/close-on-reuse")  # the server reads it on the kept connection, then closes
    assert r.status_code == 200
    assert server.paths() == ["/healthz", "/close-on-reuse", "/close-on-reuse"]
    assert client.connections_made == 2


def test_a_post_on_a_connection_closed_under_it_is_not_sent_again(server, client):
    client.get("/healthz")
    with pytest.raises(ConnectionLost):
        client.post("/close-on-reuse", json={})
    assert server.paths() == ["/healthz", "/close-on-reuse"]


def test_a_timeout_is_handler_unavailable_and_the_connection_is_not_reused(server):
    server.hold_health.set()
    with SyncHandlerClient(server.url, timeout=10) as api:
        with pytest.raises(HandlerUnavailable, match="TimedOut"):
            api.health(timeout=0.2)
        with pytest.raises(TimedOut):
            api.http.get("/slow", timeout=0.2)
        server.hold_health.clear()
        server.released.set()  # the held requests end; their connections were given up
        assert api.health()["status"] == "ok"
        assert api.http.connections_made == 3


def test_a_chunked_body_is_read_as_it_arrives(server, client):
    with client.stream("GET", "/v1/views/v/stream") as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        server.pieces.put(b"id: 1\ndata: {}\n\n")
        assert [next(lines), next(lines), next(lines)] == ["id: 1", "data: {}", ""]
        # line ends split across pieces, and a character split across them
        for piece in (b"a\r", b"\nb", b"\xc3", b"\xa9\r", b"c\n", b"\n", b"tail"):
            server.pieces.put(piece)
        server.pieces.put(None)
        assert list(lines) == ["a", "b\u00e9", "c", "", "tail"]
    client.get("/healthz")  # the stream read to its end left its connection reusable
    assert client.connections_made == 1


def test_a_stream_left_unread_closes_its_connection(server, client):
    with client.stream("GET", "/v1/views/v/stream") as resp:
        server.pieces.put(b"data: {}\n\n")
        assert next(resp.iter_lines()) == "data: {}"
    server.pieces.put(None)
    client.get("/healthz")
    assert client.connections_made == 2


def test_follow_yields_the_changes_of_a_stream_as_they_come(server):
    with SyncHandlerClient(server.url, "tok") as api:
        changes = api.follow("0123456789abcdef", 4)
        server.pieces.put(b'id: 5\ndata: {"v": 5, "op": "put", "key": "k"}\n\n')
        assert next(changes)["key"] == "k"
        server.pieces.put(b'event: resync\ndata: {"version": 9}\n\n')
        with pytest.raises(Resync):
            next(changes)
    _method, path, _port, headers, _body = server.requests[-1]
    assert path == "/v1/views/0123456789abcdef/stream?since=4"
    assert headers["Last-Event-ID"] == "4" and headers["Authorization"] == "Bearer tok"


def test_answers_are_decoded_and_refusals_raised(server):
    with SyncHandlerClient(server.url) as api:
        page = api.list_page("0123456789abcdef", None)
        assert page == {"version": 7, "objects": [{"key": "a"}], "next": None}
        with pytest.raises(Resync) as exc:
            api.changes("0123456789abcdef", 1)
        assert exc.value.version == 3


def test_failover_past_a_dead_url_and_a_standby(server):
    standby = Server(standby=True)
    try:
        dead = f"http://127.0.0.1:{closed_port()}"
        with SyncHandlerClient(f"{dead},{standby.url},{server.url}") as api:
            assert api.health()["status"] == "ok"
            assert api.url == server.url
        assert len(standby.requests) == 1
        with SyncHandlerClient(f"{dead},{standby.url}") as api:  # no active handler: the standby's answer
            with pytest.raises(HandlerUnavailable) as exc:
                api.health()
            assert exc.value.code == "standby"
        with SyncHandlerClient(dead) as api:
            with pytest.raises(HandlerUnavailable, match="ConnectFailed"):
                api.health()
    finally:
        standby.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a certificate")
def test_tls_with_the_handler_ca(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = Server(tls=tls)
    try:
        monkeypatch.setenv("DELVEFS_HANDLER_CA", str(cert))
        with SyncHandlerClient(server.url) as api:
            assert [api.health()["status"] for _ in range(3)] == ["ok"] * 3
            assert api.http.connections_made == 1
        monkeypatch.delenv("DELVEFS_HANDLER_CA")
        with SyncHandlerClient(server.url) as api:  # not a CA this client trusts
            with pytest.raises(HandlerUnavailable, match="ConnectFailed"):
                api.health()
    finally:
        server.stop()


def test_the_mount_client_sends_from_many_tasks_without_blocking_its_loop(server):
    server.hold_health.set()

    async def main():
        async with HandlerClient(server.url, "tok", timeout=10) as api:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(api.health)  # held by the server until released
                while not any(path == "/healthz" for path in server.paths()):
                    await trio.sleep(0.01)
                # the loop goes on: other requests are answered meanwhile, several at once
                pages = []

                async def list_one():
                    pages.append(await api.list_page("0123456789abcdef", None))
                async with trio.open_nursery() as listing:
                    for _ in range(8):
                        listing.start_soon(list_one)
                assert len(pages) == 8
                server.released.set()
            return api.round_trips
    round_trips = trio.run(main)
    assert round_trips.times["list"].count == 8 and round_trips.times["health"].count == 1
    assert len({port for _method, _path, port, _headers, _body in server.requests}) <= 16


def test_a_cancelled_request_does_not_wait_for_its_answer(server):
    server.hold_health.set()

    async def main():
        async with HandlerClient(server.url, timeout=30) as api:
            with trio.move_on_after(0.1) as scope:
                await api.health()
            return scope.cancelled_caught
    assert trio.run(main)
    server.released.set()
