"""``python -m delvefs.devtools.demo [run|init|aligner|align|publish]`` — see delvefs/devtools/demo/__init__.py.

``run`` (the default, what ``make demo`` calls) starts everything on this machine:
MinIO and RabbitMQ (unless AWS_ENDPOINT_URL and DELVEFS_AMQP_URL point at existing
ones), the event handler (unless DELVEFS_HANDLER_URL is set), the pool of aligners (one
work-queue group; the first to take its ``--kill-at``-th file is SIGKILLed holding it),
then publishes, checks that every sample was aligned exactly once, prints the summary,
and tears everything down in reverse (also on Ctrl-C or SIGTERM).
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
from .aligner import align, aligner
from .publisher import publish


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


def stop_aligner(proc: subprocess.Popen, workdir: Path) -> None:
    stop(proc)
    roles.unmount(workdir / "mnt")  # the killed one's mount outlives it (the daemon has its own session)


def run(args) -> int:
    # SIGTERM (a `timeout`, a CI runner giving up) tears down like Ctrl-C: nothing stays running.
    # (SIGINT too where a shell started the demo with it ignored.)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
                                        "--listen", listen], stdout=handler_log, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # Ctrl-C is the demo's: it stops the handler last
            stack.callback(stop, handler)
            env["DELVEFS_HANDLER_URL"] = f"http://{listen}"
            wait_healthy(env["DELVEFS_HANDLER_URL"], handler)
            roles.log("demo", f"event handler on {env['DELVEFS_HANDLER_URL']} (log: {base / 'handler.log'})")
            # for a look from another shell: `. BASE/handler.env; delvefs status --handler`
            handler_env = base / "handler.env"
            handler_env.touch(mode=0o600)
            handler_env.write_text(f"export DELVEFS_HANDLER_URL={env['DELVEFS_HANDLER_URL']} "
                                   f"DELVEFS_HANDLER_TOKEN={env['DELVEFS_HANDLER_TOKEN']}\n")
            roles.log("demo", f"the group from another shell: . {handler_env}; delvefs status --handler")
        roles.init()
        journals = base / "journals"
        aligners = {}
        for n in range(1, args.aligners + 1):
            name, workdir = f"aligner-{n}", base / f"aligner-{n}"
            # a session of its own: the kill takes its process group, not the demo's
            proc = subprocess.Popen([sys.executable, "-m", "delvefs.devtools.demo", "aligner", "--name", name,
                                     "--workdir", str(workdir), "--journals", str(journals), "--seed", str(args.seed),
                                     "--lease", str(args.lease), "--kill-at", str(args.kill_at)],
                                    start_new_session=True)
            stack.callback(stop_aligner, proc, workdir)
            aligners[name] = proc
        # Publishing starts at once: a backlog lands before the group exists (the members'
        # `--existing` covers it), the rest while it runs.
        code = publish(args.aligners, args.files, args.reads, args.seed, args.interval, args.timeout,
                       args.backlog, args.run, journals, base / "publisher")
        if args.kill_at and not killed_as_planned(aligners, roles.killed_marker(journals, args.run)):
            code = 1
        roles.log("demo", "tearing down")
        return code


def killed_as_planned(aligners: dict[str, subprocess.Popen], marker: Path) -> bool:
    """The one aligner that was to be killed died of SIGKILL; the others still run."""
    victim = marker.read_text() if marker.exists() else None
    if victim is None:
        roles.log("demo", "no aligner reached the file it was to be killed at: nothing was killed")
        return False
    ok = True
    for name, proc in aligners.items():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5 if name == victim else 0)
        expected = -signal.SIGKILL if name == victim else None
        if proc.returncode != expected:
            roles.log("demo", f"{name} {'still runs' if proc.returncode is None else f'exited with {proc.returncode}'}"
                              f" ({'killed' if name == victim else 'running'} expected)")
            ok = False
    if ok:
        roles.log("demo", f"{victim} died of SIGKILL holding a file; the other aligners still run")
    return ok


def default_run() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m delvefs.devtools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role")

    def publish_options(p):
        p.add_argument("--aligners", type=int, default=3, help="members the group needs before the live part")
        p.add_argument("--files", type=int, default=12)
        p.add_argument("--reads", type=int, default=2000, help="reads per FASTQ file")
        p.add_argument("--seed", type=int, default=42)
        p.add_argument("--interval", type=float, default=0.3, help="seconds between uploads")
        p.add_argument("--timeout", type=float, default=300, help="seconds to wait for all samples")
        p.add_argument("--backlog", type=int, default=None,
                       help="files published before the group runs (default: a third)")
        p.add_argument("--run", default=None, help="the run's name, the first part of its keys "
                                                   "(default: run-DATE-TIME)")

    def journals_option(p, **kw):
        p.add_argument("--journals", type=Path, help="directory of the aligners' journals (shared by the "
                                                     "pool and the publisher)", **kw)

    def kill_option(p):
        p.add_argument("--kill-at", type=int, default=2,
                       help="the first aligner to take its N-th file is SIGKILLed holding it (0: none)")

    p = sub.add_parser("run", help="everything on this machine (default)")
    publish_options(p)
    kill_option(p)
    p.add_argument("--lease", type=float, default=10.0, help="seconds a member holds a file unrenewed")
    p.add_argument("--workdir", help="keep state here instead of a temp dir")
    sub.add_parser("init", help="create the buckets and wire their notifications")
    p = sub.add_parser("aligner", help="mount the aligners' views, join the group, align what it hands out")
    p.add_argument("--name", required=True)
    p.add_argument("--workdir", default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--lease", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=1)
    journals_option(p, default=Path("/tmp/delvefs-demo/journals"))
    kill_option(p)
    p = sub.add_parser("align", help="(the group's command) align one file, publish its sample")
    p.add_argument("fastq", type=Path)
    p.add_argument("--aligner", required=True)
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="the output view's directory")
    p.add_argument("--threads", type=int, default=1)
    journals_option(p, required=True)
    kill_option(p)
    p = sub.add_parser("publish", help="upload reads, wait for whole samples, check, print the summary")
    publish_options(p)
    journals_option(p, default=Path("/tmp/delvefs-demo/journals"))
    p.add_argument("--workdir", type=Path, default=Path("/tmp/delvefs-demo/publisher"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.role in (None, "run"):
            if args.role is None:
                args = build_parser().parse_args(["run", *(argv or sys.argv[1:])])
            args.run = args.run or default_run()
            return run(args)
        if args.role == "init":
            return roles.init()
        if args.role == "aligner":
            workdir = Path(args.workdir or f"/tmp/delvefs-demo/{args.name}")
            return aligner(args.name, workdir, args.journals, args.seed, args.lease, args.kill_at, args.threads)
        if args.role == "align":
            return align(args.fastq, args.aligner, args.index, args.out, args.journals, args.threads,
                         args.kill_at)
        return publish(args.aligners, args.files, args.reads, args.seed, args.interval, args.timeout,
                       args.backlog, args.run or default_run(), args.journals, args.workdir)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stopped, and cleaned up on the way out
        return 130


if __name__ == "__main__":
    sys.exit(main())
