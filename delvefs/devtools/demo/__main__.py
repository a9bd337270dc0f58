"""``python -m delvefs.devtools.demo [run|init|subscriber|publish]`` — see delvefs/devtools/demo/__init__.py.

``run`` (the default, what ``make demo`` calls) starts everything on this machine:
MinIO and RabbitMQ (unless AWS_ENDPOINT_URL and DELVEFS_AMQP_URL point at existing
ones), the event handler (unless DELVEFS_HANDLER_URL is set), the subscribers, then
publishes and prints the summary, and tears everything down in reverse.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..localservices import LocalServices, free_port
from . import roles


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the event handler exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        time.sleep(0.1)
    raise RuntimeError(f"the event handler at {url} is not healthy after {timeout:.0f} s")


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args) -> int:
    # SIGTERM (a `timeout`, a CI runner giving up) tears down like Ctrl-C: nothing stays running
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.ExitStack() as stack:
        base = Path(args.workdir) if args.workdir else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="delvefs-demo-")))
        base.mkdir(parents=True, exist_ok=True)
        env = os.environ
        if not (env.get("AWS_ENDPOINT_URL") and env.get("DELVEFS_AMQP_URL")):
            roles.log("demo", "starting MinIO and RabbitMQ on loopback")
            services = stack.enter_context(LocalServices(base / "services"))
            env.update(services.env())
            roles.log("demo", f"MinIO {services.minio.endpoint}, RabbitMQ {services.rabbit.url}")
        if not env.get("DELVEFS_HANDLER_URL"):
            env["DELVEFS_HANDLER_TOKEN"] = env.get("DELVEFS_HANDLER_TOKEN") or secrets.token_hex(16)
            listen = f"127.0.0.1:{free_port()}"
            handler_log = stack.enter_context(open(base / "handler.log", "ab"))
            handler = subprocess.Popen([*roles.DELVEFS, "eventhandler", "--state-dir", str(base / "handler"),
                                        "--listen", listen], stdout=handler_log, stderr=subprocess.STDOUT)
            stack.callback(stop, handler)
            env["DELVEFS_HANDLER_URL"] = f"http://{listen}"
            wait_healthy(env["DELVEFS_HANDLER_URL"], handler)
            roles.log("demo", f"event handler on {env['DELVEFS_HANDLER_URL']} (log: {base / 'handler.log'})")
        roles.init()
        subscribers = []
        for worker in range(1, args.workers + 1):
            proc = subprocess.Popen([sys.executable, "-m", "delvefs.devtools.demo", "subscriber", "--worker", str(worker),
                                     "--workdir", str(base / f"worker-{worker}"), "--seed", str(args.seed)])
            stack.callback(stop, proc)
            subscribers.append(proc)
        # Publishing starts at once: a backlog lands before the subscribers watch
        # (`watch --existing` covers it), the rest while they run.
        code = roles.publish(args.workers, args.files, args.reads, args.seed, args.interval, args.timeout,
                             args.backlog)
        roles.log("demo", "tearing down")
        return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m delvefs.devtools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role")

    def publish_options(p):
        p.add_argument("--workers", type=int, default=3)
        p.add_argument("--files", type=int, default=12)
        p.add_argument("--reads", type=int, default=2000, help="reads per FASTQ file")
        p.add_argument("--seed", type=int, default=42)
        p.add_argument("--interval", type=float, default=0.3, help="seconds between uploads")
        p.add_argument("--timeout", type=float, default=300, help="seconds to wait for all alignments")
        p.add_argument("--backlog", type=int, default=None,
                       help="files published before the subscribers run (default: a third)")

    p = sub.add_parser("run", help="everything on this machine (default)")
    publish_options(p)
    p.add_argument("--workdir", help="keep state here instead of a temp dir")
    sub.add_parser("init", help="create the buckets and wire their notifications")
    p = sub.add_parser("subscriber", help="mount a worker's views, align what appears")
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--workdir", default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1)
    p = sub.add_parser("publish", help="upload reads, wait for the alignments, print the summary")
    publish_options(p)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.role in (None, "run"):
        if args.role is None:
            args = build_parser().parse_args(["run", *(argv or sys.argv[1:])])
        return run(args)
    if args.role == "init":
        return roles.init()
    if args.role == "subscriber":
        workdir = Path(args.workdir or f"/tmp/delvefs-demo/worker-{args.worker}")
        return roles.subscriber(args.worker, workdir, args.seed, args.threads)
    return roles.publish(args.workers, args.files, args.reads, args.seed, args.interval, args.timeout,
                         args.backlog)


if __name__ == "__main__":
    sys.exit(main())
