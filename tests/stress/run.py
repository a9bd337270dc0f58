"""Stress a writable view of a real DelveFS mount and compare it byte for byte.

    python -m tests.stress.run --seconds 90 --mode default --seed 1

Private MinIO + RabbitMQ + event handler, one mount of a view `data` (object "data/*").
For ``--seconds``: ``--workers`` processes run seeded random operations on their own
directories of the view, each mirrored on a local directory (tests/stress/workload.py),
with a share on names all of them share; another S3 client writes beside them under
data/outside/ and checks that the mount converges to it (tests/stress/outside.py); in the
middle the handler is stopped and started again on its state. Then `delvefs sync`, the
live mount read whole, `delvefs umount`, and three comparisons with the local reference:
what S3 holds (list + GET), what the mount showed before the unmount, what a fresh mount
(a new cache directory) reads. Every difference is reported with its path, expected size
and digest and actual ones; the exit status is 1 when anything was found.
Everything (logs of the workers, the handler, the mounts; report.json) stays in the work
directory the report names.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import sys
import tempfile
import time
from pathlib import Path

from . import workload
from .outside import OutsideWriter
from .stack import another_client, mount_logs, stack, views
from .trees import differences, differing_ranges, digest, local_tree, s3_tree

OUTSIDE = "outside"
SHARED = "shared"
# lines of a mount's or the handler's log worth reading after a run
LOG_PATTERN = re.compile(r"Traceback|ERROR|CRITICAL|WARNING|unexpected|conflict|(?<!0 )failed", re.IGNORECASE)


def log(msg: str) -> None:
    print(f"[stress {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.stress.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=90, help="how long the workers run (default 90)")
    ap.add_argument("--seed", type=int, help="replays a run (default: a new one, printed)")
    ap.add_argument("--mode", choices=["default", "eager"], default="default",
                    help="eager: the mount's --eager flag")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--ops", type=int, help="operations per worker at most (a replay of the same length)")
    ap.add_argument("--without", default="", metavar="OP[,OP...]",
                    help="operations the workers leave out (e.g. a bug already known that would "
                         "drown the others): " + ", ".join(workload.OPERATIONS))
    ap.add_argument("--weights", default="", metavar="OP=N[,OP=N...]",
                    help="other weights of operations than the workload's (e.g. rename=30,create=20 "
                         "for many names renamed away and created again)")
    ap.add_argument("--shared-share", type=float, default=0.1,
                    help="share of each worker's operations on names all workers share (default 0.1)")
    ap.add_argument("--no-outside", action="store_true", help="no outside S3 writer")
    ap.add_argument("--queue-dir", action="store_true",
                    help="MinIO sends its events from a queue dir: the handler's news comes seconds "
                         "after the mount's own changes (and its older states after newer local ones)")
    ap.add_argument("--handler-restart-at", type=float, default=0.5,
                    help="when to stop the handler, as a share of --seconds (negative: never)")
    ap.add_argument("--handler-down", type=float, default=4.0, help="seconds the handler stays stopped")
    ap.add_argument("--ttl", type=float, default=1.0, help="the view's ttl")
    ap.add_argument("--mount-options", metavar="OPT[,OPT...]",
                    help="-o options of the live mount, e.g. passthrough=rw")
    ap.add_argument("--converge-timeout", type=float,
                    help="how long the mount may take to show an outside change (default ttl + 20 s "
                         "+ --handler-down)")
    ap.add_argument("--hang-timeout", type=float, default=180,
                    help="a worker still running this long after --seconds is reported hung and killed")
    ap.add_argument("--work-dir", help="default: a new directory under $TMPDIR")
    args = ap.parse_args(argv)
    unknown = [op for op in args.without.split(",") if op and op not in workload.OPERATIONS]
    if unknown:
        ap.error(f"--without: no operation {', '.join(unknown)}")
    try:
        args.weights = weights(args.weights)
    except ValueError as exc:
        ap.error(f"--weights: {exc}")
    return args


def weights(text: str) -> dict[str, int]:
    """``OP=N,...`` -> {op: N}, each a workload operation."""
    out = {}
    for item in filter(None, text.split(",")):
        op, _, n = item.partition("=")
        if op not in workload.OPERATIONS or not n.isdigit():
            raise ValueError(f"{item!r}: want OP=N, OP one of {', '.join(workload.OPERATIONS)}")
        out[op] = int(n)
    return out


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.seed = args.seed if args.seed is not None else random.randrange(1, 10**6)
        self.eager = args.mode == "eager"
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix=f"delvefs-stress-{self.seed}-{args.mode}-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.reference = self.work / "reference"
        self.findings: list[str] = []
        self.categories: dict[str, list[str]] = {}  # kind of mismatch -> where
        self.report: dict = {"seed": self.seed, "mode": args.mode, "seconds": args.seconds,
                             "workers": args.workers, "work_dir": str(self.work),
                             "replay": self.replay_command(), "times": {}}

    def replay_command(self) -> str:
        a = self.args
        words = ["python -m tests.stress.run", f"--seed {self.seed}", f"--mode {a.mode}",
                 f"--seconds {a.seconds:g}", f"--workers {a.workers}"]
        if a.ops:
            words.append(f"--ops {a.ops}")
        if a.without:
            words.append(f"--without {a.without}")
        if a.weights:
            words.append("--weights " + ",".join(f"{op}={n}" for op, n in a.weights.items()))
        if a.queue_dir:
            words.append("--queue-dir")
        if a.mount_options:
            words.append(f"--mount-options {a.mount_options}")
        if a.no_outside:
            words.append("--no-outside")
        if a.handler_restart_at != 0.5:
            words.append(f"--handler-restart-at {a.handler_restart_at:g}")
        return " ".join(words)

    def timed(self, what: str, start: float) -> None:
        self.report["times"][what] = round(time.monotonic() - start, 2)

    def find(self, line: str) -> None:
        self.findings.append(line)
        log(f"FOUND {line}")

    # --- the run ---

    def main(self) -> int:
        log(f"seed {self.seed}, mode {self.args.mode}, {self.args.workers} workers, "
            f"{self.args.seconds:g} s; work dir {self.work}")
        log(f"replay: {self.report['replay']}")
        start = time.monotonic()
        with stack(self.work, self.args.queue_dir) as mounts:
            self.mounts, self.handler, self.s3, self.bucket = mounts, mounts.handler, mounts.s3, mounts.bucket
            self.mp = self.mounts.mount(views(self.bucket, self.args.ttl),
                                        *(["--eager"] if self.eager else []),
                                        *(["-o", self.args.mount_options] if self.args.mount_options else []))
            self.timed("setup", start)
            self.stress()
            self.finish()
        self.timed("total", start)
        self.report["findings"] = self.findings
        self.report["mismatch_kinds"] = self.categories
        (self.work / "report.json").write_text(json.dumps(self.report, indent=1))
        self.print_report()
        return 1 if self.findings else 0

    def stress(self) -> None:
        a = self.args
        data = self.mp / "data"
        (data / SHARED).mkdir()
        self.reference.mkdir()
        deadline = time.time() + a.seconds
        outside = None
        if not a.no_outside:
            outside = OutsideWriter(
                another_client(self.mounts), self.bucket, f"data/{OUTSIDE}/",
                str(data / OUTSIDE), seed=self.seed, deadline=deadline, eager=self.eager,
                converge_timeout=a.converge_timeout or a.ttl + 20 + a.handler_down,
                log_path=str(self.work / "outside.log"))
            outside.start()
        spawn = multiprocessing.get_context("spawn")
        workers = []
        for i in range(a.workers):
            config = {"index": i, "seed": self.seed, "mount_dir": str(data / f"w{i}"),
                      "ref_dir": str(self.reference / f"w{i}"), "shared_dir": str(data / SHARED),
                      "shared_share": a.shared_share, "deadline": deadline, "max_ops": a.ops,
                      "without": [op for op in a.without.split(",") if op], "weights": a.weights,
                      "log_path": str(self.work / f"worker{i}.log"),
                      "result_path": str(self.work / f"worker{i}.json")}
            p = spawn.Process(target=workload.main, args=(config,), name=f"worker{i}")
            p.start()
            workers.append((p, config))
        started = time.monotonic()
        if a.handler_restart_at >= 0:
            self.restart_handler(started + a.seconds * a.handler_restart_at)
        self.results = [self.join(p, config, deadline) for p, config in workers]
        if outside is not None:
            outside.join(max(0.0, deadline - time.time()) + outside.converge_timeout * 2 + 60)
            self.report["outside"] = outside.result() if not outside.is_alive() else {"hung": True}
            if outside.is_alive():
                self.find("the outside writer did not finish (a mount read hangs?): see outside.log")
            self.outside_model = dict(outside.model)
            for f in outside.findings:
                self.find(f"outside writer: {json.dumps(f)}")
            if outside.crash:
                self.find(f"outside writer crashed:\n{outside.crash}")
        else:
            self.outside_model = {}
        self.timed("workload", started)

    def restart_handler(self, at: float) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        t = time.monotonic()
        code = self.handler.stop()
        log(f"handler stopped (exit {code}); down for {self.args.handler_down:g} s")
        time.sleep(self.args.handler_down)
        self.handler.start()
        self.report["handler_restart"] = {"exit_code": code, "restarted_after_s": round(time.monotonic() - t, 2)}
        log("handler started again on its state")

    def join(self, p, config: dict, deadline: float) -> dict:
        p.join(max(0.0, deadline - time.time()) + self.args.hang_timeout)
        if p.is_alive():
            last = tail(Path(config["log_path"]))
            self.find(f"worker {config['index']} hung (still running {self.args.hang_timeout:g} s after "
                      f"the deadline); its last operation: {last}")
            p.kill()
            p.join(30)
            return {"index": config["index"], "hung": True, "last_op": last}
        try:
            result = json.loads(Path(config["result_path"]).read_text())
        except (OSError, ValueError) as exc:
            self.find(f"worker {config['index']} left no result (exit {p.exitcode}): {exc}")
            return {"index": config["index"], "exitcode": p.exitcode}
        if result.get("crash"):
            self.find(f"worker {result['index']} crashed at {json.dumps(result.get('last_op'))}:\n{result['crash']}")
        for m in result["mismatches"]:
            kind = self.categories.setdefault(category(m), [])
            kind.append(f"worker {result['index']} op {m['n']}")
            self.find(f"worker {result['index']} op {m['n']} {m['op']} {m.get('path')!s}: mount "
                      f"{short(m['mount'])} vs reference {short(m['reference'])} — {json.dumps(m)[:600]}")
        for e in result["shared_errors"]:
            self.find(f"worker {result['index']} shared-name op {e['n']} {e['op']} {e['path']}: {e['error']}")
        return result

    # --- the end: sync, unmount, compare ---

    def finish(self) -> None:
        t = time.monotonic()
        r = self.mounts.run("sync", str(self.mp), timeout=600)
        self.timed("sync", t)
        self.report["sync"] = {"exit": r.returncode, "output": (r.stdout + r.stderr)[-3000:]}
        if r.returncode != 0:
            self.find(f"delvefs sync exited {r.returncode}: {(r.stdout + r.stderr).strip()[-1500:]}")

        expected, ignored = self.expected()
        t = time.monotonic()
        live, live_unreadable = local_tree(str(self.mp / "data"))
        self.timed("read_live_mount", t)

        t = time.monotonic()
        r = self.mounts.umount(self.mp, check=False)
        self.timed("umount", t)
        self.report["umount"] = {"exit": r.returncode, "output": (r.stdout + r.stderr)[-3000:]}
        if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
            self.find(f"delvefs umount exited {r.returncode}: {(r.stdout + r.stderr).strip()[-1500:]}")

        t = time.monotonic()
        in_s3, s3_unreadable = s3_tree(self.s3, self.bucket, "data/")
        self.timed("read_s3", t)

        # a fresh mount lists what the handler knows: the last uploads' events may still be
        # on their way, so it gets the staleness bound to show what S3 holds
        t = time.monotonic()
        fresh_mp = self.mounts.mount(views(self.bucket, self.args.ttl))
        deadline = time.monotonic() + self.args.ttl + 20
        while True:
            fresh, fresh_unreadable = local_tree(str(fresh_mp / "data"))
            if fresh == in_s3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.mounts.umount(fresh_mp, check=False)
        self.timed("read_fresh_mount", t)

        def own(tree: dict) -> dict:
            return {p: e for p, e in tree.items() if not p.startswith(SHARED + "/")}

        def shared(tree: dict) -> dict:
            return {p: e for p, e in tree.items() if p.startswith(SHARED + "/")}

        for where, tree, unreadable in (("S3", in_s3, s3_unreadable), ("live mount", live, live_unreadable),
                                        ("fresh mount", fresh, fresh_unreadable)):
            for path, reason in sorted(unreadable.items()):
                self.find(f"{where}: unreadable {path}: {reason}")
            for line in differences(expected, own(tree), where, ignore=ignored):
                self.find(line + (self.where_it_differs(line) if where == "S3" else ""))
        # the shared names have no model: S3 is the truth the mounts must show
        for where, tree in (("live mount", live), ("fresh mount", fresh)):
            for line in differences(shared(in_s3), shared(tree), f"{where} vs S3 (shared names)"):
                self.find(line)
        self.report["files"] = {"expected": len(expected), "tainted": len(ignored), "s3": len(in_s3),
                                "live_mount": len(live), "fresh_mount": len(fresh),
                                "shared_in_s3": len(shared(in_s3))}
        self.report["logs"] = {name: notable_lines(path) for name, path in self.logs().items()}

    def where_it_differs(self, line: str) -> str:
        """For a worker's file whose S3 object differs from its reference: the byte ranges."""
        match = re.match(r"S3: differs (w\d+/\S+):", line)
        if not match:
            return ""
        path = match.group(1)
        try:
            want = (self.reference / path).read_bytes()
            got = self.s3.get_object(Bucket=self.bucket, Key=f"data/{path}")["Body"].read()
        except Exception as exc:  # noqa: BLE001 — a detail of a finding, not a finding
            return f" (could not compare: {exc})"
        return f"; {differing_ranges(want, got)}"

    def expected(self) -> tuple[dict, set[str]]:
        """What data/ must hold: each worker's reference and the outside writer's objects;
        and the paths the comparison skips (changed by an operation whose outcomes differed)."""
        expected, ignored = {}, set()
        for result in self.results:
            i = result["index"]
            files, _ = local_tree(str(self.reference / f"w{i}"))
            expected.update({f"w{i}/{p}": e for p, e in files.items()})
            if result.get("hung") or result.get("crash") or "unknown" not in result:
                ignored.update(f"w{i}/{p}" for p in workload.NAMES)  # its state is unknown
                ignored.update(p for p in self.every_path() if p.startswith(f"w{i}/"))
            else:
                # a name only a read disagreed on keeps its expected content: compared
                ignored.update(f"w{i}/{p}" for p in result["unknown"])
        expected.update({f"{OUTSIDE}/{n}": digest(b) for n, b in self.outside_model.items()})
        return expected, ignored

    def every_path(self) -> set[str]:
        try:
            return set(s3_tree(self.s3, self.bucket, "data/")[0])
        except Exception:  # noqa: BLE001 — only widens what is skipped
            return set()

    def logs(self) -> dict[str, Path]:
        return {"handler": self.handler.log_path, **mount_logs(self.work)}

    def print_report(self) -> None:
        rep = self.report
        print(f"\n=== stress seed {self.seed} mode {self.args.mode}: {len(self.findings)} finding(s) ===")
        print(f"replay: {rep['replay']}")
        print(f"work dir: {self.work}")
        print(f"times (s): {json.dumps(rep['times'])}")
        for r in self.results:
            print(f"worker {r['index']}: {r.get('ops')} ops, {len(r.get('mismatches', []))} mismatches, "
                  f"tainted {r.get('tainted', [])}, of which not compared {r.get('unknown', [])}"
                  + (" HUNG" if r.get("hung") else ""))
        if "outside" in rep:
            print(f"outside writer: {json.dumps(rep['outside'].get('counts'))}, convergence "
                  f"{json.dumps(rep['outside'].get('convergence_seconds'))}")
        if "files" in rep:
            print(f"files: {json.dumps(rep['files'])}")
        for name, lines in rep.get("logs", {}).items():
            if lines:
                print(f"--- notable lines of the {name} log ({len(lines)}, first 15) ---")
                print("\n".join(lines[:15]))
        for f in self.findings:
            print(f"FOUND {f}")
        if self.categories:
            print("--- mismatches by kind ---")
            for kind, where in sorted(self.categories.items(), key=lambda kv: -len(kv[1])):
                print(f"{len(where):4d}  {kind}  (e.g. {', '.join(where[:3])})")


def category(m: dict) -> str:
    """A mismatch's kind, without its numbers: the report groups mismatches by it."""
    op, mount, ref = m["op"], m["mount"], m["reference"]
    if isinstance(mount, list) and isinstance(ref, list) and mount and isinstance(mount[0], list):
        steps = sorted({a[0] for a, b in zip(mount, ref) if a != b})
        return f"{op}: step(s) {'/'.join(steps)} differ"

    def shape(v) -> str:
        if v is None:
            return "ok"
        if isinstance(v, str):
            return v
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], int):
            return "bytes"
        return "size" if isinstance(v, int) else type(v).__name__

    where = " (descriptor of an unlinked or replaced file)" if "handle" in m and m.get("path") is None else ""
    if shape(mount) == shape(ref) == "bytes":
        return f"{op}: {'other size' if mount[0] != ref[0] else 'same size, other bytes'}{where}"
    if shape(mount) == shape(ref):
        return f"{op}: other {shape(mount)}{where}"
    return f"{op}: mount {shape(mount)}, reference {shape(ref)}{where}"


def short(value) -> str:
    text = json.dumps(value)
    return text if len(text) < 200 else text[:200] + "..."


def tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(none)"


def notable_lines(path: Path, limit: int = 200) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:400] for line in lines if LOG_PATTERN.search(line)][:limit]


def main(argv=None) -> int:
    return Run(parse(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
