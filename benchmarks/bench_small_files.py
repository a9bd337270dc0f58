"""Small files through a mount: what a close costs beyond one PUT (default mode), and what a
workflow engine's bookkeeping files cost in eager mode with and without the write-back
delay — pinned to CPU 0 and unpinned (``--cpus``), one table each.

    .venv/bin/python -m benchmarks.bench_small_files [--files 300] [--rounds 6] [--size 100]
                                                     [--jobs 40] [--job-seconds 0.5]
                                                     [--write-backs 0,2] [--only closes,markers]
                                                     [--cpus both|pinned|unpinned]

``closes`` (docs/PERFORMANCE.md, *Small files*): one after the other, ``open(O_CREAT |
O_TRUNC)`` + ``write`` of ``--size`` bytes + ``close`` of a new file in a default-mode
mount (close uploads), against boto3 ``put_object`` of the same bytes from this process (its
client made before the clock starts, as the mount's is), taking turns in ``--rounds``
batches so that a change of the machine's load hits both alike. Then the same for
overwriting each file again (``O_TRUNC`` of an object the mount uploaded). The mount's own
metrics (``--metrics-addr``) count its S3 requests by operation and its FUSE requests by
operation with the time the mount spent on each: per close, they list what a close asks S3
and the kernel asks the mount.

``markers``: a workflow engine's jobs in an eager mount (``--eager``), one after the other:
create an empty marker, ``--job-seconds`` of work (no request to the mount), write a small
metadata file, remove the marker (Snakemake's ``.snakemake/incomplete`` and
``.snakemake/metadata``). For each ``--write-backs`` value, the S3 requests per job (after
``delvefs sync``) and how long after its close a metadata file was in S3 (a HEAD every
20 ms from this process: the delay another mount's reader sees, its event delay not
counted).

``snakemake``: a real Snakemake (``--snakemake BIN``; by default the pipeline benchmark's
own venv, installed when missing: never a project dependency) runs ``--jobs`` jobs of
``--job-cpu`` seconds of CPU each, ``--cores 2``, in an eager mount (its working directory,
``.snakemake/`` too), for each ``--write-backs`` value: the PUTs by kind (Snakemake's
``incomplete`` markers, its ``metadata``, other ``.snakemake`` files, the outputs) and the
DELETEs, read from the mount's debug log, after ``delvefs sync``.

MinIO, RabbitMQ and the handler are started fresh in a temporary directory.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.devtools.localservices import LocalServices, free_port
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import DELVEFS, RESULTS, log
from .mounting import CPU_MODES, add_cpu_option, cpu_mode, cpu_modes

BUCKET = "bench-small"
PARTS = ("closes", "markers", "snakemake")
SNAKEFILE = """
JOBS = {jobs}
rule all:
    input: expand("out/{{i}}.txt", i=range(JOBS))
rule job:
    output: "out/{{i}}.txt"
    shell: "python3 -c 'import time; t = time.process_time(); exec(\\"while time.process_time() - t < {cpu}: pass\\")' && echo {{wildcards.i}} > {{output}}"
"""


def metrics(port: int) -> dict[tuple[str, str], float]:
    """(sample name, its ``request`` or ``op`` label) -> value, of the mount's metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = re.match(r'(\w+)\{([^}]*)\} (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        label = labels.get("request") or labels.get("op") or ""
        if "le" in labels:
            continue
        out[(m.group(1), label)] = float(m.group(3))
    return out


def delta(after: dict, before: dict, name: str) -> dict[str, float]:
    return {label: v - before.get((n, label), 0.0) for (n, label), v in after.items()
            if n == name and v - before.get((n, label), 0.0)}


@contextlib.contextmanager
def mount(env, work: Path, handler_url: str, name: str, *extra: str):
    """A DelveFS mount of view ``w`` (keys ``<work's name>-NAME/*``) with its metrics on a
    free port: (the view's directory, the port)."""
    views = work / f"views-{name}.yaml"
    views.write_text(f"w:\n  bucket: {BUCKET}\n  object: \"{work.name}-{name}/*\"\n  ttl: 60s\n")
    mp = work / f"mnt-{name}"
    mp.mkdir()
    port = free_port()
    r = subprocess.run([DELVEFS, "mount", str(views), str(mp), "--cache-dir", str(work / f"cache-{name}"),
                        "--handler", handler_url, "--metrics-addr", f"127.0.0.1:{port}", *extra],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    try:
        os.listdir(mp / "w")
        yield mp, port
    finally:
        subprocess.run([DELVEFS, "umount", str(mp)], env=env, check=False)
        if mounted_fstype(str(mp)):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])


def write_file(path: Path, body: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
    finally:
        os.close(fd)


def closes(client, lean, env, work: Path, handler_url: str, args, res: dict) -> None:
    body = os.urandom(args.size)
    with mount(env, work, handler_url, "closes") as (mp, port):
        d = mp / "w"
        time.sleep(2)  # the mount makes its boto3 client after it is ready
        for phase in ("create", "overwrite"):
            ops = {"mount": lambda i: write_file(d / f"s-{i:05d}", body),
                   "boto3": lambda i: client.put_object(Bucket=BUCKET, Key=f"{work.name}-boto3/s-{i:05d}",
                                                        Body=body),
                   # the mount's own S3 client (delvefs.shared.s3lean) from this process
                   "lean": lambda i: lean.put_object(Bucket=BUCKET, Key=f"{work.name}-lean/s-{i:05d}",
                                                     Body=body)}
            spent = dict.fromkeys(ops, 0.0)
            n, rounds = args.files, args.rounds
            bounds = [n * r // rounds for r in range(rounds + 1)]
            names = list(ops)
            before = metrics(port)
            for r in range(rounds):
                for who in names[r % len(names):] + names[:r % len(names)]:
                    fn = ops[who]
                    t = time.perf_counter()
                    for i in range(bounds[r], bounds[r + 1]):
                        fn(i)
                    spent[who] += time.perf_counter() - t
            after = metrics(port)
            s3 = delta(after, before, "delvefs_mount_s3_requests_total")
            fuse = delta(after, before, "delvefs_mount_fuse_request_seconds_count")
            fuse_s = delta(after, before, "delvefs_mount_fuse_request_seconds_sum")
            res[phase] = {"mount_ms": 1000 * spent["mount"] / n, "boto3_ms": 1000 * spent["boto3"] / n,
                          "lean_ms": 1000 * spent["lean"] / n,
                          "s3_per_close": {k: v / n for k, v in sorted(s3.items())},
                          "fuse_per_close": {k: v / n for k, v in sorted(fuse.items())},
                          "fuse_ms_per_close": {k: 1000 * v / n for k, v in sorted(fuse_s.items())}}
            log(f"{phase}: {json.dumps(res[phase])}")


def markers(client, env, work: Path, handler_url: str, args, res: dict) -> None:
    for wb in args.write_backs:
        name = f"markers-{str(wb).replace('.', '_')}"
        with mount(env, work, handler_url, name, "--eager", "--write-back", str(wb)) as (mp, port):
            d = mp / "w"
            (d / ".snakemake").mkdir()
            time.sleep(2)
            seen: dict[str, float] = {}
            closed: dict[str, float] = {}
            stop = threading.Event()

            def watch():  # when each metadata file is in S3
                while not stop.is_set():
                    for key in [k for k in closed if k not in seen]:
                        try:
                            client.head_object(Bucket=BUCKET, Key=key)
                            seen[key] = time.monotonic()
                        except client.exceptions.ClientError:
                            pass
                    time.sleep(0.02)
            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            before = metrics(port)
            t = time.perf_counter()
            for job in range(args.jobs):
                marker = d / ".snakemake" / f"incomplete-{job}"
                write_file(marker, b"")
                time.sleep(args.job_seconds)               # the job's tool runs
                write_file(d / ".snakemake" / f"meta-{job}", b'{"job": %d, "code": "..."}' % job)
                closed[f"{work.name}-{name}/.snakemake/meta-{job}"] = time.monotonic()
                os.unlink(marker)
            jobs_s = time.perf_counter() - t
            wait_until = time.monotonic() + 60 + 2 * wb
            while len(seen) < len(closed) and time.monotonic() < wait_until:
                time.sleep(0.05)
            stop.set()
            watcher.join()
            r = subprocess.run([DELVEFS, "sync", str(mp)], env=env, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr)
            after = metrics(port)
            s3 = delta(after, before, "delvefs_mount_s3_requests_total")
            lag = sorted(seen[k] - closed[k] for k in seen)
            res[str(wb)] = {"jobs": args.jobs, "job_seconds": args.job_seconds, "jobs_s": jobs_s,
                            "s3_per_job": {k: v / args.jobs for k, v in sorted(s3.items())},
                            "in_s3_after_close_s": {"median": lag[len(lag) // 2], "max": lag[-1]}
                            if lag else None}
            log(f"write_back={wb}: {json.dumps(res[str(wb)])}")


def snakemake(client, env, work: Path, handler_url: str, args, res: dict) -> None:
    if args.snakemake is None:
        from .bench_pipeline import snakemake_venv
        args.snakemake = str(snakemake_venv())
    snakefile = work / "Snakefile"
    snakefile.write_text(SNAKEFILE.format(jobs=args.jobs, cpu=args.job_cpu))
    for wb in args.write_backs:
        name = f"smk-{str(wb).replace('.', '_')}"
        with mount(env, work, handler_url, name, "--eager", "--write-back", str(wb),
                   "--log-level", "debug") as (mp, port):
            d = mp / "w"
            time.sleep(2)
            t = time.perf_counter()
            r = subprocess.run([args.snakemake, "--snakefile", str(snakefile), "--cores", "2",
                                "--directory", str(d), "--quiet", "all"], env=env,
                               capture_output=True, text=True)
            run_s = time.perf_counter() - t
            if r.returncode:
                raise RuntimeError(r.stderr[-2000:])
            r = subprocess.run([DELVEFS, "sync", str(mp)], env=env, capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError(r.stderr)
            text = (work / f"cache-{name}" / "mount.log").read_text()
        kinds: dict[str, int] = {}
        for key in re.findall(r"S3 PUT \S+?/(\S+): done", text):
            kind = ("incomplete" if "/.snakemake/incomplete/" in key else "metadata"
                    if "/.snakemake/metadata/" in key else ".snakemake other"
                    if "/.snakemake/" in key else "outputs")
            kinds[kind] = kinds.get(kind, 0) + 1
        deleted = sum(int(n) for n in re.findall(r"S3 DeleteObjects \S+ \((\d+) keys\): done", text))
        singles = len(re.findall(r"S3 DELETE \S+: done", text))
        res[str(wb)] = {"jobs": args.jobs, "job_cpu": args.job_cpu, "run_s": run_s, "puts": kinds,
                        "deleted_keys": deleted + singles,
                        "delete_requests": len(re.findall(r"S3 DeleteObjects .*: done", text)) + singles}
        log(f"snakemake write_back={wb}: {json.dumps(res[str(wb)])}")


def table(res: dict) -> str:
    lines = []
    if "closes" in res:
        lines += ["| one file of {size} B | mount ms/close | boto3 put_object ms | lean PutObject ms "
                  "| mount / boto3 | S3 requests per close | FUSE requests per close (mount's ms) |"
                  .format(size=res["size"]), "|---|---|---|---|---|---|---|"]
        for phase, what in (("create", "new file (create, write, close)"),
                            ("overwrite", "overwrite (O_TRUNC, write, close)")):
            p = res["closes"][phase]
            s3 = ", ".join(f"{k} {v:.2f}" for k, v in p["s3_per_close"].items())
            fuse = ", ".join(f"{k} {v:.2f} ({p['fuse_ms_per_close'].get(k, 0):.2f})"
                             for k, v in p["fuse_per_close"].items())
            lines.append(f"| {what} | {p['mount_ms']:.2f} | {p['boto3_ms']:.2f} | {p['lean_ms']:.2f} | "
                         f"{p['mount_ms'] / p['boto3_ms']:.2f}× | {s3} | {fuse} |")
    if "markers" in res:
        lines += ["", "| write_back | S3 requests per job | metadata in S3 after its close (median / max) |",
                  "|---|---|---|"]
        for wb, p in res["markers"].items():
            s3 = ", ".join(f"{k} {v:.2f}" for k, v in p["s3_per_job"].items()) or "none"
            lag = p["in_s3_after_close_s"]
            lines.append(f"| {wb} s | {s3} | " + (f"{lag['median']:.2f} s / {lag['max']:.2f} s |"
                                                   if lag else "— |"))
    if "snakemake" in res:
        lines += ["", "| write_back | Snakemake run (s) | PUTs: incomplete markers / metadata / other "
                  ".snakemake / outputs | DELETE requests (keys) |", "|---|---|---|---|"]
        for wb, p in res["snakemake"].items():
            k = p["puts"]
            lines.append(f"| {wb} s | {p['run_s']:.1f} ({p['jobs']} jobs of {p['job_cpu']} s CPU) | "
                         f"{k.get('incomplete', 0)} / {k.get('metadata', 0)} / "
                         f"{k.get('.snakemake other', 0)} / {k.get('outputs', 0)} | "
                         f"{p['delete_requests']} ({p['deleted_keys']}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--job-seconds", type=float, default=0.5)
    ap.add_argument("--job-cpu", type=float, default=0.3, help="snakemake: CPU seconds of each job")
    ap.add_argument("--snakemake", default=None, help="the snakemake command (snakemake part; "
                    "default: benchmarks.bench_pipeline's venv, installed when missing)")
    ap.add_argument("--write-backs", default="0,1,2",
                    type=lambda t: [float(x) if "." in x else int(x) for x in t.split(",")])
    ap.add_argument("--only", help="comma-separated parts: " + ",".join(PARTS))
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    parts = [p for p in (args.only.split(",") if args.only else PARTS[:2]) if p in PARTS]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-small-") as d:
        work = Path(d)
        with LocalServices(work / "services") as svc:
            env = {**os.environ, **svc.env(), "DELVEFS_STATE_HOME": str(work / "state"),
                   "DELVEFS_HANDLER_TOKEN": "bench"}
            os.environ.update(svc.env())
            client = make_client(max_pool=16)
            from delvefs.shared.config import S3Settings
            from delvefs.shared.s3lean import LeanClient
            lean = LeanClient(S3Settings.from_env(os.environ))
            ensure_bucket(client, BUCKET)
            wire_notifications(client, BUCKET, svc.minio.notify_arn)
            from eventhandler.devtools import HandlerProcess
            handler = HandlerProcess(svc.env(), work / "handler-state", token="bench")
            handler.start()
            try:
                for mode in cpu_modes(args.cpus):
                    log(f"--- {CPU_MODES[mode]}")
                    res = results[mode] = {"size": args.size, "files": args.files}
                    here = work / mode
                    here.mkdir()
                    with cpu_mode(mode):
                        if "closes" in parts:
                            closes(client, lean, env, here, handler.url, args,
                                   res.setdefault("closes", {}))
                        if "markers" in parts:
                            markers(client, env, here, handler.url, args, res.setdefault("markers", {}))
                        if "snakemake" in parts:
                            snakemake(client, env, here, handler.url, args,
                                      res.setdefault("snakemake", {}))
            finally:
                handler.close()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "small-files.json"
    out.write_text(json.dumps(results, indent=2))
    log(f"results: {out}")
    for mode, res in results.items():
        print(f"\n{CPU_MODES[mode]}:\n")
        print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
