"""S3 at a distance: toxiproxy on loopback in front of an S3 endpoint, adding a round trip
and a bandwidth per connection, proven by a probe before it is used.

Every benchmark of the project runs MinIO on loopback (a round trip of ~0.1 ms); a site's
S3 is tens of ms away. ``Toxiproxy`` starts the pinned toxiproxy server that
scripts/bootstrap.sh installs (``$DELVEFS_BIN/toxiproxy-server``, v2.5.0) on a free loopback
port and drives it by its HTTP API; ``Toxiproxy.link`` makes one proxy (a free loopback
port) in front of an endpoint with the distance set:

* first a **bandwidth** toxic on each direction (``bandwidth_mb`` MB/s, 10^6 bytes, per
  connection; toxiproxy's ``rate`` is in KB/s), then a **latency** toxic on each direction
  (``latency_ms`` each way: a request and its answer pay ``2 × latency_ms`` more). The
  order matters: toxiproxy's latency toxic buffers 1,024 chunks of 32 KiB, so in front of
  the bandwidth toxic it would read up to 32 MiB ahead from the server, and a GET the
  client abandons early (a ranged read, a cancelled download) would still pull that much
  through MinIO and the proxy. Behind the bandwidth toxic it holds only what the link
  already carried. (A chunk's latency counts from when the proxy read it, so a long
  transfer arrives ~``latency_ms`` after its bandwidth allows, as on a real link.)
* connection set-up is not delayed (toxics act on bytes): a new TCP connection costs no
  round trip here, where a real one costs one (and TLS one or two more).

``Link.probe`` proves the distance: ``count`` HEAD requests on one kept-alive connection
through the proxy and straight to the endpoint; the median difference is the added round
trip, which must be within ``max(tolerance_ms, 25 %)`` of ``2 × latency_ms`` (else
``DistanceError``). Benchmarks print the probe and run it before each measured run.

``CountingProxy`` counts the requests a client makes: toxiproxy keeps no request log, so a
benchmark chains delvefs/devtools/faultproxy.py (a TCP proxy that logs each HTTP/1.1
request: method, path, status, start and end) in front of a link, in a process of its own
(the benchmark's threads and GIL stay out of the data path), one per client measured, so
that each client's requests are its own (a handler's or another client's never mix in).
``critical_path`` turns a log into the round trips that follow one another.

``python -m delvefs.devtools.distance link URL --latency 15`` puts a proxy in front of URL
and prints its address and probe until Ctrl-C (for trying a client by hand).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .localservices import ServiceError, _stop_group, _tail, _wait_for, free_port, minio_bin_dir

TOXIPROXY_VERSION = "v2.5.0"      # scripts/bootstrap.sh's TOXIPROXY_VERSION
LOOPBACK = "127.0.0.1"


class DistanceError(RuntimeError):
    """The probe measured a round trip other than the one the link was set to add."""


def toxiproxy_binary() -> Path:
    return minio_bin_dir() / "toxiproxy-server"


def _host_port(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url if "//" in url else f"//{url}")
    host, port = u.hostname or LOOPBACK, u.port or (443 if u.scheme == "https" else 80)
    if host not in (LOOPBACK, "localhost"):
        raise ValueError(f"only loopback endpoints: {url}")
    return LOOPBACK, port


@dataclass
class Probe:
    """One probe of a link: median round trips (ms) straight to the endpoint and through the
    link, and the difference, against the round trip the link should add."""

    direct_ms: float
    via_ms: float
    expected_ms: float
    count: int

    @property
    def added_ms(self) -> float:
        return self.via_ms - self.direct_ms

    def __str__(self) -> str:
        return (f"probe: {self.count} HEADs, median round trip {self.via_ms:.2f} ms through the link, "
                f"{self.direct_ms:.2f} ms direct: +{self.added_ms:.2f} ms (set: +{self.expected_ms:.1f} ms)")


def round_trips(url: str, count: int, path: str = "/minio/health/live", timeout: float = 30) -> list[float]:
    """Seconds of each of ``count`` HEAD requests of ``path`` on one kept-alive connection to
    ``url`` (one request before them opens the connection, not counted)."""
    host, port = _host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        times = []
        for i in range(count + 1):
            t = time.perf_counter()
            conn.request("HEAD", path)
            r = conn.getresponse()
            r.read()
            if i:
                times.append(time.perf_counter() - t)
            if r.getheader("connection", "").lower() == "close":
                conn.close()
        return times
    finally:
        conn.close()


@dataclass
class Link:
    """A toxiproxy proxy in front of ``upstream`` with its distance set (``Toxiproxy.link``)."""

    server: "Toxiproxy"
    name: str
    upstream: str            # the endpoint's URL
    url: str                 # the proxy's URL: point clients here
    latency_ms: float
    bandwidth_mb: float

    @property
    def added_round_trip_ms(self) -> float:
        return 2 * self.latency_ms

    def probe(self, count: int = 20, path: str = "/minio/health/live", tolerance_ms: float = 2.0,
              check: bool = True) -> Probe:
        """Measure the added round trip (module docstring); ``check``: raise
        ``DistanceError`` when it is off by more than ``max(tolerance_ms, 25 %)``."""
        direct = statistics.median(round_trips(self.upstream, count, path))
        via = statistics.median(round_trips(self.url, count, path))
        p = Probe(direct * 1e3, via * 1e3, self.added_round_trip_ms, count)
        allowed = max(tolerance_ms, 0.25 * p.expected_ms)
        if check and abs(p.added_ms - p.expected_ms) > allowed:
            raise DistanceError(f"{self.name}: {p}; off by more than {allowed:.1f} ms")
        return p

    def toxics(self) -> list[dict]:
        """The link's toxics as toxiproxy reports them, in the order they apply."""
        return self.server.api("GET", f"/proxies/{self.name}/toxics")

    def remove(self) -> None:
        self.server.api("DELETE", f"/proxies/{self.name}")

    def describe(self) -> str:
        bw = f"{self.bandwidth_mb:g} MB/s per connection each way, then " if self.bandwidth_mb else ""
        return (f"toxiproxy {TOXIPROXY_VERSION} {self.url} -> {self.upstream}: {bw}"
                f"{self.latency_ms:g} ms each way (+{self.added_round_trip_ms:g} ms a round trip)")


class Toxiproxy:
    """The toxiproxy server on a free loopback port (``with Toxiproxy(dir) as t:``); its log
    in ``log_dir``. Stopped, with every proxy, at the end of the block."""

    def __init__(self, log_dir: Path | None = None, binary: Path | None = None):
        self.binary = Path(binary) if binary else toxiproxy_binary()
        self.port = free_port()
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.gettempdir())
        self.proc: subprocess.Popen | None = None
        self.links: list[Link] = []

    @property
    def api_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"toxiproxy-{self.port}.log"

    def start(self, timeout: float = 30) -> "Toxiproxy":
        if not self.binary.exists():
            raise ServiceError(f"{self.binary} missing: run scripts/bootstrap.sh (builds toxiproxy "
                               f"{TOXIPROXY_VERSION})")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # warn: its info level logs every connection
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LOG_LEVEL": "warn"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "-host", LOOPBACK, "-port", str(self.port)],
                                         env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        _wait_for(self._answers, timeout, f"toxiproxy on {self.api_url}", self.proc, self.log_path)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/version", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.api_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read()
        except urllib.error.HTTPError as exc:
            raise ServiceError(f"toxiproxy {method} {path}: {exc.code} {exc.read()[:300]!r}") from None
        return json.loads(text) if text.strip() else None

    def link(self, upstream: str, latency_ms: float, bandwidth_mb: float = 0, name: str | None = None,
             port: int = 0) -> Link:
        """A proxy on a free loopback port (or ``port``) in front of ``upstream`` (a loopback
        URL), with the bandwidth toxics added before the latency toxics (module docstring)."""
        host, up_port = _host_port(upstream)
        name = name or f"link{len(self.links) + 1}"
        made = self.api("POST", "/proxies", {"name": name, "listen": f"{LOOPBACK}:{port}",
                                             "upstream": f"{host}:{up_port}", "enabled": True})
        listen_port = int(made["listen"].rsplit(":", 1)[1])
        toxics = []
        if bandwidth_mb:
            toxics += [{"name": f"bandwidth_{s}", "type": "bandwidth", "stream": s, "toxicity": 1.0,
                        "attributes": {"rate": max(1, round(bandwidth_mb * 1000))}}
                       for s in ("upstream", "downstream")]
        if latency_ms:
            if latency_ms != int(latency_ms):
                raise ValueError(f"toxiproxy's latency is whole milliseconds, not {latency_ms}")
            toxics += [{"name": f"latency_{s}", "type": "latency", "stream": s, "toxicity": 1.0,
                        "attributes": {"latency": int(latency_ms), "jitter": 0}}
                       for s in ("upstream", "downstream")]
        for toxic in toxics:      # in this order: toxiproxy applies a stream's toxics as added
            self.api("POST", f"/proxies/{name}/toxics", toxic)
        scheme = urllib.parse.urlsplit(upstream).scheme or "http"
        link = Link(self, name, upstream, f"{scheme}://{LOOPBACK}:{listen_port}", latency_ms, bandwidth_mb)
        self.links.append(link)
        return link

    def close(self) -> None:
        _stop_group(self.proc)
        self.proc = None

    def __enter__(self) -> "Toxiproxy":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    def log_tail(self) -> str:
        return _tail(self.log_path)


@contextlib.contextmanager
def distance(upstream: str, latency_ms: float, bandwidth_mb: float = 0, log_dir: Path | None = None,
             probe: bool = True):
    """A link at ``latency_ms`` each way in front of ``upstream`` (probed first, unless not
    ``probe``), its server stopped at the end: ``with distance(url, 15, 100) as link:``."""
    with Toxiproxy(log_dir) as server:
        link = server.link(upstream, latency_ms, bandwidth_mb)
        if probe:
            link.probe()
        yield link


@dataclass
class Logged:
    """One request a ``CountingProxy`` saw (faultproxy's ``Request``, as numbers)."""

    method: str
    path: str
    query: str
    status: int | None
    started: float
    finished: float | None
    connection: int


def critical_path(requests: list[Logged]) -> int:
    """The most requests of ``requests`` that followed one another, each started after the
    one before had its answer: a lower bound of the round trips an operation waited for
    one by one (greedily by end time: the longest chain of non-overlapping intervals)."""
    chain, free_at = 0, float("-inf")
    for r in sorted(requests, key=lambda r: r.finished if r.finished is not None else r.started):
        if r.started >= free_at:
            chain += 1
            free_at = r.finished if r.finished is not None else r.started
    return chain


def by_method(requests: list[Logged]) -> str:
    """``"3 GET, 1 HEAD"``: the requests counted by method, most first."""
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.method] = counts.get(r.method, 0) + 1
    return ", ".join(f"{n} {m}" for m, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


class CountingProxy:
    """faultproxy.py in front of ``upstream`` (a loopback URL) in a child process: point one
    client at ``url``; ``take()`` returns the requests logged since the last ``take`` (the
    child answers on its pipes: one line asked, one JSON line answered)."""

    def __init__(self, upstream: str):
        _host_port(upstream)      # loopback only
        self.upstream = upstream
        self.proc = subprocess.Popen([sys.executable, "-m", "delvefs.devtools.distance", "count", upstream],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.close()
            raise ServiceError(f"counting proxy to {upstream} did not start ({line!r})")
        self.url = line

    def take(self) -> list[Logged]:
        self.proc.stdin.write("take\n")
        self.proc.stdin.flush()
        return [Logged(*row) for row in json.loads(self.proc.stdout.readline())]

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self) -> "CountingProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _serve_count(upstream: str) -> int:
    """The child of ``CountingProxy``: its URL on stdout, then a log per "take"."""
    from .faultproxy import FaultProxy
    with FaultProxy(_host_port(upstream)) as proxy:
        print(proxy.url, flush=True)
        for line in sys.stdin:
            if line.strip() != "take":
                continue
            with proxy._lock:
                taken, proxy.log[:] = list(proxy.log), []
            rows = [(r.method, r.path, r.query, r.status, r.started, r.finished, r.connection) for r in taken]
            print(json.dumps(rows), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m delvefs.devtools.distance",
                                description="S3 at a distance: toxiproxy links and counting proxies on loopback")
    sub = p.add_subparsers(dest="command", required=True)
    lk = sub.add_parser("link", help="a link at a distance in front of URL; its probe every 10 s until Ctrl-C")
    lk.add_argument("upstream", help="e.g. http://127.0.0.1:9000 (MinIO)")
    lk.add_argument("--latency", type=int, default=15, help="ms each way (default 15)")
    lk.add_argument("--bandwidth", type=float, default=100, help="MB/s per connection each way (0: none)")
    lk.add_argument("--probe-path", default="/minio/health/live")
    ct = sub.add_parser("count", help="(CountingProxy's child) a logging proxy to URL, its log on request")
    ct.add_argument("upstream")
    args = p.parse_args(argv)
    if args.command == "count":
        return _serve_count(args.upstream)
    with Toxiproxy() as server:
        link = server.link(args.upstream, args.latency, args.bandwidth)
        print(link.describe(), flush=True)
        try:
            while True:
                print(link.probe(path=args.probe_path, check=False), flush=True)
                time.sleep(10)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
