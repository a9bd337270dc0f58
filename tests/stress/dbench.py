"""dbench's stock load inside a writable view of a real mount, several times in a row.

    python -m tests.stress.dbench --mode eager --runs 5 --seconds 60 --clients 4

dbench (Debian's package; its stock load file /usr/share/dbench/client.txt) creates,
writes, renames, deletes and re-creates many files under the same names, like a file
server's clients. One mount of the stress tier's view ``data`` (tests/stress/stack.py) on
private MinIO + RabbitMQ + event handler serves every run; run N works in data/run-N/.
A run is clean when dbench exits 0 and prints no failed operation, `delvefs sync` exits 0,
and what the mount shows under data/run-N/ is what S3 holds there, byte for byte. After
the last run `delvefs umount` must print nothing (no file left unuploaded, no conflict
copy), and a fresh mount must show what S3 holds. The exit status is 1 when a run was not
clean; the work directory (printed) keeps dbench's output and the mount's log.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .stack import stack, views
from .trees import differences, local_tree, s3_tree

LOAD_FILE = "/usr/share/dbench/client.txt"
# dbench's lines of an operation whose outcome differed from the load file's expectation
FAILED = re.compile(r"failed|error|ERROR|Input/output|No such file", re.IGNORECASE)
# its own start-up, not the mount's: without SysV semaphores its clients start unsynchronised
HARMLESS = re.compile(r"failed to create barrier semaphore")


def log(msg: str) -> None:
    print(f"[dbench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.stress.dbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["default", "eager"], default="default")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=60, help="dbench -t (default 60)")
    ap.add_argument("--clients", type=int, default=4, help="dbench's client count (default 4)")
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument("--mount-options", metavar="OPT[,OPT...]",
                    help="-o options of the mount dbench runs in, e.g. passthrough=rw")
    ap.add_argument("--work-dir", help="default: a new temporary directory")
    return ap.parse_args(argv)


def one_run(mounts, mp: Path, n: int, args, work: Path) -> list[str]:
    findings: list[str] = []
    where = mp / "data" / f"run-{n}"
    where.mkdir()
    out_path = work / f"dbench-{n}.out"
    t = time.monotonic()
    with open(out_path, "w") as out:
        r = subprocess.run(["dbench", "-c", LOAD_FILE, "-D", str(where), "-t", str(args.seconds),
                            str(args.clients)], stdout=out, stderr=subprocess.STDOUT,
                           timeout=args.seconds * 10 + 300)
    text = out_path.read_text(errors="replace")
    throughput = re.findall(r"Throughput ([\d.]+ MB/sec)", text)
    log(f"run {n}: dbench exit {r.returncode} in {time.monotonic() - t:.0f} s, "
        f"{throughput[-1] if throughput else 'no throughput line'}")
    if r.returncode != 0:
        findings.append(f"run {n}: dbench exited {r.returncode}")
    bad = [line for line in text.splitlines() if FAILED.search(line) and not HARMLESS.search(line)]
    if bad:
        findings.append(f"run {n}: dbench reported {len(bad)} failed operation(s), e.g. " + " | ".join(bad[:5]))
    s = mounts.run("sync", str(mp), timeout=600)
    if s.returncode != 0:
        findings.append(f"run {n}: delvefs sync exited {s.returncode}: {(s.stdout + s.stderr).strip()[-800:]}")
    shown, unreadable = local_tree(str(where))
    in_s3, s3_unreadable = s3_tree(mounts.s3, mounts.bucket, f"data/run-{n}/")
    for path, reason in sorted({**unreadable, **s3_unreadable}.items()):
        findings.append(f"run {n}: unreadable {path}: {reason}")
    findings += [f"run {n}: {line}" for line in differences(in_s3, shown, "mount vs S3")]
    log(f"run {n}: {len(shown)} files shown, {len(in_s3)} in S3, {len(findings)} finding(s)")
    return findings


def main(argv=None) -> int:
    args = parse(argv)
    if shutil.which("dbench") is None:
        print("dbench is not installed (Debian: apt-get install dbench)", file=sys.stderr)
        return 2
    work = Path(args.work_dir or tempfile.mkdtemp(prefix=f"delvefs-dbench-{args.mode}-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"mode {args.mode}, {args.runs} runs of dbench -t {args.seconds} {args.clients}; work dir {work}")
    findings: list[str] = []
    with stack(work) as mounts:
        mp = mounts.mount(views(mounts.bucket, args.ttl), *(["--eager"] if args.mode == "eager" else []),
                          *(["-o", args.mount_options] if args.mount_options else []))
        clean = 0
        for n in range(1, args.runs + 1):
            found = one_run(mounts, mp, n, args, work)
            clean += not found
            findings += found
        u = mounts.umount(mp, check=False)
        if u.returncode != 0 or (u.stdout + u.stderr).strip():
            findings.append(f"delvefs umount exited {u.returncode}: {(u.stdout + u.stderr).strip()[-1500:]}")
        in_s3, _ = s3_tree(mounts.s3, mounts.bucket, "data/")
        fresh_mp = mounts.mount(views(mounts.bucket, args.ttl))
        deadline = time.monotonic() + args.ttl + 20
        while True:
            fresh, _ = local_tree(str(fresh_mp / "data"))
            if fresh == in_s3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        mounts.umount(fresh_mp, check=False)
        findings += differences(in_s3, fresh, "fresh mount vs S3")
    print(f"\n=== dbench mode {args.mode}: {clean} of {args.runs} runs clean, {len(findings)} finding(s) ===")
    print(f"work dir: {work}")
    for f in findings:
        print(f"FOUND {f}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
