"""Big writes and dbench in an eager mount: the kernel's writeback cache against FUSE
passthrough writes (``--eager -o passthrough=rw``), beside local disk and the floor, pinned
and unpinned, in one run.

    .venv/bin/python -m benchmarks.bench_eager_writes [--big-mib 1024] [--dbench-seconds 20]
                                                      [--cpus both|pinned|unpinned]

Rows: ``dd bs=1M`` of ``--big-mib`` MiB until it closes (eager: the file is journaled, not in
S3 yet), then ``delvefs sync`` until S3 has it; a re-read of the file just written (the
whole copy is in the cache: passthrough serves it); dbench's stock load (2 clients,
``--dbench-seconds``) in MB/s as dbench reports it. The floor is benchmarks/floorfs.py with
the writeback cache (what FUSE itself costs a writer); its reads return no real bytes, so
it has no re-read row. The ratios are against local disk (above 1: slower than local disk
for times, as fast for throughputs below 1).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from .bench_mount import RESULTS, log
from .bench_tree import Delve, services, timed
from .mounting import CPU_MODES, FloorMount, add_cpu_option, cpu_mode, cpu_modes

VARIANTS = (("eager", ("--eager",)),
            ("eager_rw", ("--eager", "-o", "passthrough=rw")))
LOAD_FILE = "/usr/share/dbench/client.txt"


def dd(src: Path, dst: Path) -> float:
    return timed("dd", f"if={src}", f"of={dst}", "bs=1M")


def reread(path: Path) -> float:
    return timed("dd", f"if={path}", "of=/dev/null", "bs=1M")


def dbench(where: Path, seconds: int) -> float | None:
    """dbench's throughput (MB/s) with 2 clients, None when it failed."""
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["dbench", "-c", LOAD_FILE, "-D", str(where), "-t", str(seconds), "2"],
                       capture_output=True, text=True)
    m = re.search(r"Throughput ([\d.]+) MB/sec", r.stdout)
    if r.returncode or m is None:
        log(f"dbench in {where}: exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-300:]}")
        return None
    return float(m.group(1))


def run_mode(work: Path, delve: Delve, src: Path, args, res: dict) -> None:
    local = work / "local"
    local.mkdir(exist_ok=True)
    res["local_dd_s"] = dd(src, local / "big.bin")
    res["local_reread_s"] = reread(local / "big.bin")
    (local / "big.bin").unlink()
    res["local_dbench"] = dbench(local / "dbench", args.dbench_seconds)
    log(f"local: dd {res['local_dd_s']:.2f} s, re-read {res['local_reread_s']:.2f} s, "
        f"dbench {res['local_dbench']} MB/s")
    with FloorMount(work / "floor-mnt", "--writeback") as floor:
        res["floor_dd_s"] = dd(src, floor / "big.bin")
        log(f"floor (writeback cache): dd {res['floor_dd_s']:.2f} s")
    for name, extra in VARIANTS:
        mp = delve.mount(*extra)
        try:
            d = mp / "eager"
            res[f"{name}_dd_s"] = dd(src, d / f"{name}.bin")
            res[f"{name}_sync_s"] = delve.sync()[0]
            res[f"{name}_reread_s"] = reread(d / f"{name}.bin")
            res[f"{name}_dbench"] = dbench(d / f"dbench-{name}", args.dbench_seconds)
            t = time.perf_counter()
            subprocess.run(["rm", "-rf", str(d / f"dbench-{name}"), str(d / f"{name}.bin")], check=True)
            delve.sync()
            log(f"{name}: dd {res[f'{name}_dd_s']:.2f} s, sync {res[f'{name}_sync_s']:.2f} s, "
                f"re-read {res[f'{name}_reread_s']:.2f} s, dbench {res[f'{name}_dbench']} MB/s "
                f"(cleanup {time.perf_counter() - t:.1f} s)")
        finally:
            delve.umount()


def table(res: dict) -> str:
    def s(v):
        return "—" if v is None else f"{v:.2f} s"

    def r(v, ref):
        return "—" if v is None or not ref else f"{ref / v:.2f}×"
    lines = ["| | local disk | floor (writeback cache) | eager (writeback cache) | eager, passthrough=rw |",
             "|---|---|---|---|---|"]
    lines.append(f"| dd {res['big_mib']} MiB until close | {s(res['local_dd_s'])} | {s(res['floor_dd_s'])} | "
                 f"{s(res['eager_dd_s'])} | {s(res['eager_rw_dd_s'])} |")
    lines.append(f"| speed ÷ local disk (dd) | 1.00× | {r(res['floor_dd_s'], res['local_dd_s'])} | "
                 f"{r(res['eager_dd_s'], res['local_dd_s'])} | {r(res['eager_rw_dd_s'], res['local_dd_s'])} |")
    lines.append(f"| + `delvefs sync` (S3 has it) | — | — | {s(res['eager_sync_s'])} | {s(res['eager_rw_sync_s'])} |")
    lines.append(f"| re-read of the file just written | {s(res['local_reread_s'])} | — | "
                 f"{s(res['eager_reread_s'])} | {s(res['eager_rw_reread_s'])} |")
    lines.append(f"| speed ÷ local disk (re-read) | 1.00× | — | {r(res['eager_reread_s'], res['local_reread_s'])} | "
                 f"{r(res['eager_rw_reread_s'], res['local_reread_s'])} |")

    def mb(v):
        return "failed" if v is None else f"{v:.1f} MB/s"
    lines.append(f"| dbench, 2 clients | {mb(res['local_dbench'])} | — | {mb(res['eager_dbench'])} | "
                 f"{mb(res['eager_rw_dbench'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--dbench-seconds", type=int, default=20)
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    results = {}
    with services("bench-eager-") as (work, env, client, handler):
        src = work / "src.bin"
        with open(src, "wb") as f:
            block = open("/dev/urandom", "rb").read(1 << 20)
            for _ in range(args.big_mib):
                f.write(block)
        for mode in cpu_modes(args.cpus):
            log(f"--- {CPU_MODES[mode]}")
            here = work / mode
            here.mkdir()
            res = results[mode] = {"big_mib": args.big_mib}
            with cpu_mode(mode):
                run_mode(here, Delve(env, here, handler.url), src, args, res)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "eager-writes.json"
    out.write_text(json.dumps(results, indent=2))
    log(f"results: {out}")
    for mode in results:
        print(f"\n{CPU_MODES[mode]}:\n")
        print(table(results[mode]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
