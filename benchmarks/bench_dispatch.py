"""What a FUSE request costs in pyfuse3 + trio, measured on the floor (benchmarks/floorfs.py:
a do-nothing file system mounted as a DelveFS mount is), for pyfuse3 builds side by side.

    .venv/bin/python -m benchmarks.bench_dispatch [--python LABEL=PYTHON[:ENV=VALUE,...]]...
        [--repeat 5] [--getattrs 20000] [--files N] [--pin] [--profile]

Each ``--python`` is one variant: an interpreter (a venv with the pyfuse3 build to
measure) and environment variables for its floor; the default is this interpreter with
and without pyfuse3's custom I/O (``PYFUSE3_CUSTOM_IO=0``). Per variant:

  * ``getattr``: ``fstat`` of an open file in a loop, attributes cached for 0 s, so each
    call is one GETATTR round trip: microseconds per request;
  * ``untar``: bench_tree's tar (the standard library, ~2,450 files) into the floor with
    the kernel's writeback cache (as an eager mount): seconds, and (one more run with the
    handlers counted) requests reaching Python per file, by operation.

``--repeat`` runs of each, interleaved across the variants, medians reported; ``--pin``
runs the floor and the workload on CPU 0 (``taskset -c 0``). ``--profile`` runs the
getattr loop once per variant with the floor under cProfile and prints where its
process spends the time (Python-level: trio and the handlers; pyfuse3's Cython code
shows as the callers).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bench_mount import log
from .bench_tree import source_tar

# the floor with its handlers counted; the counts as JSON on fd 3's file at exit
COUNTING_FLOOR = """
import collections, functools, inspect, json, sys
from benchmarks import floorfs
calls = collections.Counter()
def counted(name, fn):
    @functools.wraps(fn)
    async def wrapper(*a, **k):
        calls[name] += 1
        return await fn(*a, **k)
    return wrapper
for name, fn in list(vars(floorfs.Floor).items()):
    if inspect.iscoroutinefunction(fn):
        setattr(floorfs.Floor, name, counted(name, fn))
out = sys.argv.pop(1)
rc = floorfs.main(sys.argv[1:])
with open(out, "w") as f:
    json.dump(dict(calls), f)
sys.exit(rc)
"""


class Variant:
    def __init__(self, spec: str):
        label, _, rest = spec.partition("=")
        python, _, env = rest.partition(":")
        self.label, self.python = label, python or sys.executable
        self.env = dict(kv.split("=", 1) for kv in env.split(",") if kv)


class Floor:
    """A mounted floor (``with``): its mountpoint; unmounted at exit."""

    def __init__(self, variant: Variant, pin: bool, *floor_args: str, counts: Path | None = None,
                 profile: Path | None = None):
        self.mp = Path(tempfile.mkdtemp(prefix="bench-dispatch-"))
        prefix = ["taskset", "-c", "0"] if pin else []
        if counts is not None:
            cmd = [variant.python, "-c", COUNTING_FLOOR, str(counts)]
        elif profile is not None:
            cmd = [variant.python, "-m", "cProfile", "-o", str(profile), "-m", "benchmarks.floorfs"]
        else:
            cmd = [variant.python, "-m", "benchmarks.floorfs"]
        env = dict(os.environ, **variant.env)
        self.proc = subprocess.Popen([*prefix, *cmd, str(self.mp), *floor_args], env=env,
                                     stdout=subprocess.PIPE, text=True)

    def __enter__(self) -> Path:
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the floor did not start: {line!r}")
        return self.mp

    def __exit__(self, *exc):
        subprocess.run(["fusermount3", "-u", str(self.mp)], check=False)
        self.proc.wait(timeout=120)
        self.mp.rmdir()


def getattr_loop(mp: Path, n: int) -> float:
    """Microseconds per fstat (one GETATTR each: attributes cached for 0 s)."""
    (mp / "f").write_bytes(b"x")
    fd = os.open(mp / "f", os.O_RDONLY)
    try:
        for _ in range(200):
            os.fstat(fd)
        t = time.perf_counter()
        for _ in range(n):
            os.fstat(fd)
        return (time.perf_counter() - t) / n * 1e6
    finally:
        os.close(fd)


def untar(mp: Path, tar: Path, pin: bool) -> float:
    (mp / "t").mkdir()
    prefix = ["taskset", "-c", "0"] if pin else []
    t = time.perf_counter()
    subprocess.run([*prefix, "tar", "-x", "-f", str(tar), "-C", str(mp / "t")], check=True)
    return time.perf_counter() - t


def files_in(tar: Path) -> int:
    import tarfile
    with tarfile.open(tar) as t:
        return sum(1 for m in t if m.isfile())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", action="append", default=[], metavar="LABEL=PYTHON[:ENV=VALUE,...]")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--getattrs", type=int, default=20000)
    ap.add_argument("--files", type=int, default=None, help="bench_tree's tar of at most N files")
    ap.add_argument("--pin", action="store_true", help="the floor and the workload on CPU 0")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    variants = [Variant(s) for s in args.python] or [
        Variant("custom I/O off=:PYFUSE3_CUSTOM_IO=0"), Variant("custom I/O on=")]
    tar = source_tar(args.files)
    nfiles = files_in(tar)

    if args.profile:
        import pstats
        for v in variants:
            prof = Path(tempfile.mkdtemp()) / "floor.prof"
            with Floor(v, args.pin, "--timeout", "0", profile=prof) as mp:
                getattr_loop(mp, args.getattrs)
            print(f"## {v.label}: the floor's process during {args.getattrs} GETATTRs "
                  "(trio, pyfuse3, the floor and epoll; not the start-up's imports)")
            pstats.Stats(str(prof), stream=sys.stdout).sort_stats("tottime").print_stats(
                r"trio/|pyfuse3|floorfs|epoll|wrapper", 20)
        return 0

    res = {v.label: {"getattr_us": [], "untar_s": []} for v in variants}
    for i in range(args.repeat):
        for v in variants:
            with Floor(v, args.pin, "--timeout", "0") as mp:
                res[v.label]["getattr_us"].append(getattr_loop(mp, args.getattrs))
            with Floor(v, args.pin, "--writeback") as mp:
                res[v.label]["untar_s"].append(untar(mp, tar, args.pin))
            log(f"{i + 1}/{args.repeat} {v.label}: getattr {res[v.label]['getattr_us'][-1]:.1f} µs, "
                f"untar {res[v.label]['untar_s'][-1]:.2f} s")
    for v in variants:
        counts = Path(tempfile.mkdtemp()) / "counts.json"
        with Floor(v, args.pin, "--writeback", counts=counts) as mp:
            untar(mp, tar, args.pin)
        calls = json.loads(counts.read_text())
        res[v.label]["calls"] = calls
        res[v.label]["calls_per_file"] = sum(calls.values()) / nfiles

    pinned = "pinned to CPU 0" if args.pin else "unpinned"
    print(f"\n{nfiles} files; medians of {args.repeat} runs, {pinned}\n")
    print("| variant | GETATTR round trip (µs) | untar (s) | requests reaching Python per file |")
    print("|---|---|---|---|")
    for v in variants:
        r = res[v.label]
        print(f"| {v.label} | {statistics.median(r['getattr_us']):.1f} | "
              f"{statistics.median(r['untar_s']):.2f} | {r['calls_per_file']:.1f} |")
    print()
    for v in variants:
        top = sorted(res[v.label]["calls"].items(), key=lambda kv: -kv[1])
        print(f"{v.label}: " + ", ".join(f"{k} {n}" for k, n in top))
    print(json.dumps(res), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
