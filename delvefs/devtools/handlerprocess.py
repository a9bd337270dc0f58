"""Helpers for tests and benchmarks of the handler: run ``delvefs eventhandler`` as a real
subprocess on a free port, talk to its API, publish crafted MinIO-format events."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pika

from delvefs.devtools.localservices import free_port

from eventhandler.events import make_message

VENV_BIN = Path(sys.executable).parent


class HandlerProcess:
    def __init__(self, env: dict, state_dir: Path, *, token: str | None = "test-token",
                 queue: str | None = None, log_path: Path | None = None, extra_env: dict | None = None,
                 file_size_limit: int | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = Path(state_dir)
        self.token = token
        self.queue = queue or f"h-{uuid.uuid4().hex[:10]}"
        self.env = {**os.environ, **env, "DELVEFS_AMQP_QUEUE": self.queue,
                    "DELVEFS_RECONCILE_INTERVAL": "0", **(extra_env or {})}
        if token:
            self.env["DELVEFS_HANDLER_TOKEN"] = token
        else:
            self.env.pop("DELVEFS_HANDLER_TOKEN", None)
        self.log_path = log_path or self.state_dir.parent / f"handler-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        # RLIMIT_FSIZE for the process: writes past it fail with EFBIG (a disk that fills up)
        self.file_size_limit = file_size_limit
        self.http = httpx.Client(base_url=self.url, timeout=60,
                                 headers={"Authorization": f"Bearer {token}"} if token else {})

    def start(self, timeout: float = 30) -> "HandlerProcess":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "delvefs"), "eventhandler", "--state-dir", str(self.state_dir),
                 "--listen", f"127.0.0.1:{self.port}"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=self._limit_file_size if self.file_size_limit else None)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"handler exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/healthz", timeout=1)
                if r.status_code == 200 and r.json()["amqp"] == "connected":
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"handler not ready after {timeout} s:\n{self.log_tail()}")

    def _limit_file_size(self) -> None:  # in the child, before exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error from write(), not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_size_limit, self.file_size_limit))

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.kill()
        self.http.close()

    # API helpers
    def register(self, views: dict[str, dict], proof: dict[str, str], client: str = "test") -> httpx.Response:
        return self.http.post("/v1/views", json={
            "client": client, "views": [{"name": n, "spec": s} for n, s in views.items()],
            "proof": proof})

    def pages(self, vid: str, limit: int = 5000) -> Iterator[dict]:
        """The pages of a view's listing (GET objects, following ``next``)."""
        after = None
        while True:
            params = {"limit": limit, **({"after": after} if after else {})}
            r = self.http.get(f"/v1/views/{vid}/objects", params=params)
            r.raise_for_status()
            page = r.json()
            yield page
            if not page["next"]:
                return
            after = page["next"]

    def list_all(self, vid: str, limit: int = 5000) -> tuple[int, dict[str, dict]]:
        pages = list(self.pages(vid, limit))
        return pages[0]["version"], {o["key"]: o for p in pages for o in p["objects"]}

    def keys(self, vid: str) -> set[str]:
        return set(self.list_all(vid)[1])

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def spec(bucket: str, **rules) -> dict:
    """A filter spec as View.filter_spec() makes it."""
    from rulesets import View
    return View.from_filter_spec("x", {"bucket": bucket, **rules}).filter_spec()


class Publisher:
    """Publishes crafted MinIO-format events to the exchange, like MinIO does."""

    def __init__(self, amqp_url: str, exchange: str = "delvefs"):
        self.conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.ch = self.conn.channel()
        self.exchange = exchange
        self.ch.exchange_declare(exchange, exchange_type="fanout", durable=True)

    def publish(self, name, bucket, key, seq, **kw) -> None:
        body, headers = make_message(name, bucket, key, seq, **kw)
        self.raw(body, headers)

    def raw(self, body: bytes, headers: dict | None = None) -> None:
        self.ch.basic_publish(self.exchange, "", body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, headers=headers))

    def queue_count(self, queue: str) -> int:
        return self.ch.queue_declare(queue, durable=True, passive=True).method.message_count

    def delete_queue(self, *queues) -> None:
        """Delete handler queues and their dead-letter queues/exchanges."""
        for q in queues:
            for op in (lambda: self.ch.queue_delete(q), lambda: self.ch.queue_delete(q + ".dead"),
                       lambda: self.ch.exchange_delete(q + ".dead")):
                try:
                    if self.ch.is_closed:
                        self.ch = self.conn.channel()
                    op()
                except Exception:
                    pass

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
