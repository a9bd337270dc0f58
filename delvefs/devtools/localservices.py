"""Real MinIO and RabbitMQ on free loopback ports in temp directories.

Used by the test suite, the demo, the benchmarks and developers
(``python -m delvefs.devtools.localservices`` starts both and prints their environment).
Nothing here is a mock: the pinned MinIO built by scripts/bootstrap.sh and
Debian's rabbitmq-server, wired so that MinIO publishes bucket notifications to
RabbitMQ's ``delvefs`` fanout exchange (target id ``PRIMARY``).

Every service is a context manager that waits until it is healthy and on exit
stops its whole process group, also when the block raised.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..shared.config import DEFAULT_EXCHANGE

def minio_bin_dir() -> Path:
    """Where the bootstrap installed MinIO (``DELVEFS_BIN``, default ~/.cache/delvefs/bin)."""
    return Path(os.environ.get("DELVEFS_BIN") or Path.home() / ".cache/delvefs/bin")
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
ACCESS_KEY = "delvefs-admin"
SECRET_KEY = "delvefs-secret-key"
NOTIFY_TARGET_ID = "PRIMARY"


class ServiceError(RuntimeError):
    """A local service could not be started; the message says which and why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(check, timeout: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    """Until ``check()``; a server that never gets there (or an interrupt meanwhile) is
    stopped: no process outlives a failed start."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(f"{what} exited with {proc.returncode} while starting; "
                                   f"log {log}:\n{_tail(log)}")
            if check():
                return
            time.sleep(0.1)
        raise ServiceError(f"{what} not ready after {timeout:.0f} s; log {log}:\n{_tail(log)}")
    except BaseException:
        _stop_group(proc)
        raise


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop_group(proc: subprocess.Popen | None, timeout: float = 15) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def amqp_handshake_ok(host: str, port: int) -> bool:
    """True when an AMQP 0-9-1 broker answers the protocol header with Connection.Start."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            frame = s.recv(7)
            return len(frame) == 7 and frame[0] == 1  # frame type METHOD
    except OSError:
        return False


class _ServiceProcess:
    """The life cycle both servers share: ``start`` (theirs) runs ``proc``; stopping ends
    its process group; a restart keeps the same port and data."""

    proc: subprocess.Popen | None

    def stop(self) -> None:
        _stop_group(self.proc)

    def restart(self, timeout: float = 60) -> None:
        self.stop()
        self.start(timeout)

    def kill(self) -> None:
        """SIGKILL the process group, as a crash or the OOM killer would (``start`` again
        keeps the same port and data)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class RabbitMQ(_ServiceProcess):
    """A private RabbitMQ node. Debian's broker runs as user ``rabbitmq`` when we are root:
    its config, mnesia and log directories then belong to that user, in a directory of
    their own under the system's temp dir (``node_dir``, linked from ``base_dir/node``),
    not below ``base_dir``: a private temp tree (pytest's ``/tmp/pytest-of-root``, which
    every pytest session that starts makes 0700 again) would lock the broker out of its
    own files while it runs. ``close`` stops it and removes that directory."""

    base_dir: Path
    port: int = field(default_factory=free_port)
    dist_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    node_dir: Path | None = None

    def _node_dir(self, user: str | None) -> Path:
        if self.node_dir is None:
            if user is None:
                self.node_dir = self.base_dir
            else:
                self.node_dir = Path(tempfile.mkdtemp(prefix=f"delvefs-rabbitmq-{self.port}-"))
                shutil.chown(self.node_dir, user, user)
                link = self.base_dir / "node"
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
                link.symlink_to(self.node_dir)
        return self.node_dir

    def close(self) -> None:
        self.stop()
        if self.node_dir is not None and self.node_dir != self.base_dir:
            shutil.rmtree(self.node_dir, ignore_errors=True)
        self.node_dir = None

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "startup.log"

    def start(self, timeout: float = 60) -> "RabbitMQ":
        if not os.path.exists(RABBITMQ_SERVER):
            raise ServiceError(f"{RABBITMQ_SERVER} missing: run scripts/bootstrap.sh (Debian rabbitmq-server)")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        user = group = extra_groups = None
        home = str(self.base_dir)
        if os.geteuid() == 0:
            user = group = "rabbitmq"
            extra_groups = []  # drop root's groups: the group bits of root-owned temp dirs must not apply
            home = pwd.getpwnam(user).pw_dir  # holds the Erlang cookie
        node_dir = self._node_dir(user)
        conf = node_dir / "rabbitmq.conf"
        conf.write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"
            "disk_free_limit.absolute = 50MB\n"
        )
        plugins = node_dir / "enabled_plugins"
        plugins.write_text("[].\n")
        for sub in ("mnesia", "log"):
            (node_dir / sub).mkdir(exist_ok=True)
        if user is not None:
            for path in node_dir.iterdir():
                if not path.is_symlink():
                    shutil.chown(path, user, user)
        node = f"delvefs{self.port}@localhost"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(conf),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_MNESIA_BASE": str(node_dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(node_dir / "log"),
            "RABBITMQ_PID_FILE": str(node_dir / "rabbit.pid"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(node_dir / "advanced.config"),
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [RABBITMQ_SERVER], env=env, user=user, group=group, extra_groups=extra_groups,
                cwd=node_dir,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _wait_for(lambda: amqp_handshake_ok("127.0.0.1", self.port), timeout,
                  f"RabbitMQ on 127.0.0.1:{self.port}", self.proc, self.log_path)
        return self



@dataclass
class MinIO(_ServiceProcess):
    """A private MinIO server whose AMQP notification target points at ``amqp_url``.

    ``queue_dir``: when set, MinIO persists events on disk while the broker is
    unreachable (no loss) at the price of delivery latency (docs/ARCHITECTURE.md).
    ``publisher_confirms``: MinIO waits for the broker to confirm each event (on by default:
    an event the broker accepted but did not keep is then a failed send, not a silent loss).
    """

    data_dir: Path
    amqp_url: str
    exchange: str = DEFAULT_EXCHANGE
    queue_dir: Path | None = None
    publisher_confirms: bool = True
    port: int = field(default_factory=free_port)
    console_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def notify_arn(self) -> str:
        return f"arn:minio:sqs::{NOTIFY_TARGET_ID}:amqp"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"minio-{self.port}.log"

    def env(self) -> dict[str, str]:
        """The standard client environment for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "DELVEFS_NOTIFY_ARN": self.notify_arn,
        }

    def start(self, timeout: float = 60) -> "MinIO":
        binary = minio_bin_dir() / "minio"
        if not binary.exists():
            raise ServiceError(f"{binary} missing: run scripts/bootstrap.sh (builds the pinned MinIO)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        t = NOTIFY_TARGET_ID
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.data_dir.parent),
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            f"MINIO_NOTIFY_AMQP_ENABLE_{t}": "on",
            f"MINIO_NOTIFY_AMQP_URL_{t}": self.amqp_url,
            f"MINIO_NOTIFY_AMQP_EXCHANGE_{t}": self.exchange,
            f"MINIO_NOTIFY_AMQP_EXCHANGE_TYPE_{t}": "fanout",
            f"MINIO_NOTIFY_AMQP_ROUTING_KEY_{t}": "",
            f"MINIO_NOTIFY_AMQP_DURABLE_{t}": "on",
            f"MINIO_NOTIFY_AMQP_DELIVERY_MODE_{t}": "2",
            # this MinIO's name for publisher_confirms ("PUBLISHER_CONFIRMS" would be ignored)
            f"MINIO_NOTIFY_AMQP_PUBLISHING_CONFIRMS_{t}": "on" if self.publisher_confirms else "off",
        }
        if self.queue_dir is not None:
            self.queue_dir.mkdir(parents=True, exist_ok=True)
            env[f"MINIO_NOTIFY_AMQP_QUEUE_DIR_{t}"] = str(self.queue_dir)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(binary), "server", str(self.data_dir), "--quiet",
                 "--address", f"127.0.0.1:{self.port}",
                 "--console-address", f"127.0.0.1:{self.console_port}"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _wait_for(self._healthy, timeout, f"MinIO on {self.endpoint}", self.proc, self.log_path)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False



@dataclass
class MotoServer(_ServiceProcess):
    """moto in server mode (``moto[server]``, a test dependency): S3 and SQS on one loopback
    port, with S3 delivering bucket notifications to SQS queues as AWS does — the AWS side
    of the SQS event source's tests (eventhandler/sqs.py). Accepts any credentials."""

    base_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"moto-{self.port}.log"

    def env(self) -> dict[str, str]:
        """The standard client environment for this server (S3 and SQS)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 60) -> "MotoServer":
        import importlib.util
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise ServiceError("moto[server] missing: pip install -e '.[test]'")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "MOTO_PORT": str(self.port)})
        _wait_for(self._healthy, timeout, f"moto on {self.endpoint}", self.proc, self.log_path)
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False


@dataclass
class LocalServices:
    """RabbitMQ, then MinIO publishing to it: the object store and broker of one test run."""

    base_dir: Path
    queue_dir: bool = False
    publisher_confirms: bool = True
    rabbit: RabbitMQ | None = None
    minio: MinIO | None = None

    def env(self) -> dict[str, str]:
        return {**self.minio.env(), "DELVEFS_AMQP_URL": self.rabbit.url,
                "DELVEFS_AMQP_EXCHANGE": self.minio.exchange}

    def __enter__(self) -> "LocalServices":
        self.rabbit = RabbitMQ(self.base_dir / "rabbitmq")
        self.rabbit.start()
        try:
            self.minio = MinIO(self.base_dir / "minio" / "data", self.rabbit.url,
                               queue_dir=self.base_dir / "minio" / "events" if self.queue_dir else None,
                               publisher_confirms=self.publisher_confirms)
            self.minio.start()
        except BaseException:
            self.rabbit.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.minio:
            self.minio.stop()
        if self.rabbit:
            self.rabbit.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m delvefs.devtools.localservices",
        description="Start MinIO and RabbitMQ on loopback, print their environment, run until Ctrl-C.")
    parser.add_argument("--dir", help="state directory (default: a new temp dir, removed at exit)")
    parser.add_argument("--queue-dir", action="store_true", help="let MinIO persist events while the broker is down")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        base = Path(args.dir) if args.dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="delvefs-")))
        services = stack.enter_context(LocalServices(base, queue_dir=args.queue_dir))
        for key, value in services.env().items():
            print(f"export {key}={value}")
        print("# running; Ctrl-C stops both", file=sys.stderr, flush=True)
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
