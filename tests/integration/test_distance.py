"""The benchmarks' distance to S3 (delvefs/devtools/distance.py), end to end at small scale:
the pinned toxiproxy server starts, a link in front of a loopback HTTP server forwards
bytes both ways unchanged, its toxics are the bandwidth before the latency on each stream,
the probe sees the added round trip (only "it applied": at least half of it, no timing
bound beyond that), and the server stops with its ports closed. Fails, not skips, in CI
when toxiproxy is missing (scripts/bootstrap.sh builds it)."""
from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import urllib.request

import pytest

from delvefs.devtools.distance import Toxiproxy, toxiproxy_binary
from tests.conftest import service_unavailable

pytestmark = pytest.mark.services

BODY = bytes(range(256)) * 4096    # 1 MiB


class _Echo(http.server.BaseHTTPRequestHandler):
    """HEAD: an empty answer; GET: BODY; PUT: the SHA-256 of what was sent."""

    protocol_version = "HTTP/1.1"

    def do_HEAD(self):
        self._answer(b"", head=True)

    def do_GET(self):
        self._answer(BODY)

    def do_PUT(self):
        got = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(hashlib.sha256(got).hexdigest().encode())

    def _answer(self, body: bytes, head: bool = False):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_link_forwards_bytes_adds_its_round_trip_and_stops(tmp_path, upstream):
    if not toxiproxy_binary().exists():
        service_unavailable(f"{toxiproxy_binary()} missing: run scripts/bootstrap.sh")
    with Toxiproxy(tmp_path) as server:
        link = server.link(upstream, latency_ms=10, bandwidth_mb=100)
        assert [(t["type"], t["stream"]) for t in link.toxics()] == [
            ("bandwidth", "upstream"), ("latency", "upstream"),
            ("bandwidth", "downstream"), ("latency", "downstream")]

        with urllib.request.urlopen(f"{link.url}/object", timeout=30) as r:
            assert r.read() == BODY
        sent = BODY[::-1]
        put = urllib.request.Request(f"{link.url}/object", data=sent, method="PUT")
        with urllib.request.urlopen(put, timeout=30) as r:
            assert r.read().decode() == hashlib.sha256(sent).hexdigest()

        probe = link.probe(count=10, path="/", check=False)
        assert probe.expected_ms == 20
        assert probe.added_ms >= probe.expected_ms / 2, str(probe)   # the toxic applied
        ports = (server.port, int(link.url.rsplit(":", 1)[1]))
        proc = server.proc
    assert proc.poll() is not None
    assert not any(_listening(p) for p in ports)
