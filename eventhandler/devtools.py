"""Tools for tests and benchmarks of the handler, not part of it: run ``delvefs
eventhandler`` as a real subprocess on a free port, talk to its API (through
:mod:`delvefs.client.handler.api`), publish crafted MinIO-format events."""
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

from delvefs.client.handler.api import HandlerError, SyncHandlerClient
from delvefs.client.handler.endpoints import register_request
from delvefs.client.handler.http import Response
from delvefs.devtools.localservices import free_port
from rulesets import View

from .amqp import EventPublisher
from .events import make_message

VENV_BIN = Path(sys.executable).parent


class HandlerProcess:
    def __init__(self, env: dict, state_dir: Path, *, token: str | None = "test-token",
                 queue: str | None = None, log_path: Path | None = None, extra_env: dict | None = None,
                 file_size_limit: int | None = None, port: int | None = None,
                 tls: tuple[Path, Path] | None = None, args: tuple[str, ...] = ()):
        self.port = port or free_port()
        # tls: (certificate, key) to serve HTTPS; clients verify it with $DELVEFS_HANDLER_CA
        self.tls = tls
        self.args = tuple(args)  # more `delvefs eventhandler` flags (e.g. --sqs-queue URL)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
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
        self.api = SyncHandlerClient(self.url, token, timeout=60)
        # for tests of the API itself: requests of their own, answers as they are
        self.http = self.api.http

    def start(self, timeout: float = 30, *, standby: bool = False) -> "HandlerProcess":
        """Start the process; return once it consumes or, ``standby``, once it stands by
        (another handler holds its state directory's lock)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "delvefs"), "eventhandler", "--state-dir", str(self.state_dir),
                 "--listen", f"127.0.0.1:{self.port}",
                 *(["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])] if self.tls else []),
                 *self.args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=self._limit_file_size if self.file_size_limit else None)
        wanted = "standby" if standby else "active"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"handler exited with {self.proc.returncode}:\n{self.log_tail()}")
            role = self.role()
            if role == wanted:
                return self
            if role == "active":
                raise RuntimeError(f"handler is active, not standing by:\n{self.log_tail()}")
            time.sleep(0.05)
        raise RuntimeError(f"handler not {wanted} after {timeout} s:\n{self.log_tail()}")

    def role(self) -> str:
        """"active" (consuming), "standby" (waiting for the state lock) or "starting"
        (not answering yet, or not connected to the broker)."""
        try:
            health = self.api.health(timeout=1)
        except HandlerError as exc:
            return "standby" if exc.code == "standby" else "starting"
        source = health.get("amqp", health.get("sqs"))  # the handler's event source
        return "active" if source == "connected" else "starting"

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
        self.api.close()

    # API helpers
    def register(self, views: dict[str, dict], proof: dict[str, str], client: str = "test") -> Response:
        """The handler's response as it is: tests look at refusals too."""
        return self.api.response(register_request(
            client, [{"name": n, "spec": s} for n, s in views.items()], proof))

    def pages(self, vid: str, limit: int = 5000) -> Iterator[dict]:
        """The pages of a view's listing."""
        return self.api.pages(vid, limit)

    def list_all(self, vid: str, limit: int = 5000) -> tuple[int, dict[str, dict]]:
        return self.api.list_all(vid, limit)

    def keys(self, vid: str) -> set[str]:
        return set(self.list_all(vid)[1])

    def metric(self, name: str) -> float:
        """The sum of the metric's samples (all label sets)."""
        text = self.api.metrics()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


class HandlerGroup:
    """The handler processes of one test or benchmark: all stopped, and their queues
    deleted, at :meth:`close`."""

    def __init__(self, env: dict, amqp_url: str):
        self.env, self.amqp_url = env, amqp_url
        self.started: list[HandlerProcess] = []

    def start(self, state_dir: Path, *, standby: bool = False, **options) -> HandlerProcess:
        """A started :class:`HandlerProcess` (options: its constructor's)."""
        h = HandlerProcess(self.env, state_dir, **options)
        self.started.append(h)
        return h.start(standby=standby)

    def close(self) -> None:
        for h in self.started:
            h.close()
        pub = Publisher(self.amqp_url)
        pub.delete_queue(*{h.queue for h in self.started})
        pub.close()


def spec(bucket: str, **rules) -> dict:
    """A filter spec as View.filter_spec() makes it."""
    return View.from_filter_spec("x", {"bucket": bucket, **rules}).filter_spec()


class Publisher:
    """Publishes crafted MinIO-format events to the exchange, like MinIO does."""

    def __init__(self, amqp_url: str, exchange: str = "delvefs"):
        self.amqp = EventPublisher(amqp_url, exchange)

    def publish(self, name, bucket, key, seq, **kw) -> None:
        body, headers = make_message(name, bucket, key, seq, **kw)
        self.raw(body, headers)

    def raw(self, body: bytes, headers: dict | None = None) -> None:
        self.amqp.publish(body, headers)

    def queue_count(self, queue: str) -> int:
        return self.amqp.queue_count(queue)

    def delete_queue(self, *queues) -> None:
        """Delete handler queues and their dead-letter queues/exchanges."""
        self.amqp.delete_queues(*queues)

    def close(self) -> None:
        self.amqp.close()
