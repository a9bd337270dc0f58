"""Big writes, fio and dbench in an eager mount: the kernel's writeback cache against FUSE
passthrough writes (``--eager -o passthrough=rw``), beside local disk and the floor, pinned
and unpinned, in one run.

    .venv/bin/python -m benchmarks.bench_eager_writes [--big-mib 1024] [--dbench-seconds 20]
                                                      [--fio-mib N] [--fio-rand-mib 64] [--fio-repeat 3]
                                                      [--no-fio]
                                                      [--cpus both|pinned|unpinned] [--save NAME]

Rows: ``dd bs=1M`` of ``--big-mib`` MiB until it closes (eager: the file is journaled, not in
S3 yet), then ``delvefs sync`` until S3 has it; a re-read of the file just written (the
whole copy is in the cache: passthrough serves it); fio (Debian's package) writing a new
file with ``--ioengine=psync --numjobs=1 --end_fsync=0``: sequentially in 1 MiB writes
(``--fio-mib`` MiB, by default ``--big-mib``) and in random 4 KiB writes (``--fio-rand-mib``
MiB), each in MB/s until fio exits (the file closed: its wall clock, fio's start included)
and, in brackets, as fio measures its writes (its JSON output); in an eager mount each is
followed by an untimed ``delvefs sync``; ``--no-fio`` leaves the fio rows out. Each fio run
is paired with one on the local disk just before it, ``--fio-repeat`` times (the medians:
on this VM the same local fio runs at 2-7 GB/s, depending on the page cache's state); a
column's ratio is its median over its partners'. Every dd and
fio starts with no dirty page in the kernel (an untimed ``sync``, ``settled``). Then dbench's
stock load (2 clients, ``--dbench-seconds``) in MB/s as dbench reports it, once more in an
eager mount with ``-o passthrough=rw,fsync=journal`` (dbench fsyncs: there ``fsync`` returns
once the file is durable on the local disk instead of waiting for its upload). The floor is
benchmarks/floorfs.py with the writeback cache (what FUSE itself costs a writer); its reads
return no real bytes, so it has no re-read row; its dbench row is the pass-through floor
(benchmarks/pipeline/passfs.py: every request passed on to a local directory, the writeback
cache). A re-read is the median of three. In an eager mount the dd file is removed (and
that synced) before fio, as on local disk. The ratios are speed ÷
local disk (below 1: slower than local disk). A fio or dbench run that fails is a "failed"
cell, fio's error text in the results (results/eager-writes.json, or eager-writes-NAME.json
with ``--save NAME``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .bench_mount import RESULTS, log
from .bench_tree import Delve, services, timed
from .mounting import CPU_MODES, FloorMount, PassMount, add_cpu_option, cpu_mode, cpu_modes

VARIANTS = (("eager", ("--eager",)),
            ("eager_rw", ("--eager", "-o", "passthrough=rw")))
# dbench alone also with fsync returning once the file is durable on the local disk
JOURNAL_FSYNC = ("--eager", "-o", "passthrough=rw,fsync=journal")
LOAD_FILE = "/usr/share/dbench/client.txt"
# fio's two loads: (its --rw, --bs); each run writes a file of a new name
FIO_LOADS = {"seq": ("write", "1M"), "rand": ("randwrite", "4k")}
_fio_runs = itertools.count(1)


def settled() -> None:
    """Every dirty page written out (``sync``, untimed) before a timed write, so that no row
    pays for the writeback of the rows before it (on the 2-core VM a local fio of 1 GiB took
    0.42 s alone and 1.7-2.6 s with 1-3 GiB just written and kept)."""
    os.sync()


def dd(src: Path, dst: Path) -> float:
    settled()
    return timed("dd", f"if={src}", f"of={dst}", "bs=1M")


def reread(path: Path) -> float:
    """The median of three reads of ``path`` (one lasts 0.06-0.1 s: one alone is noise)."""
    return statistics.median(timed("dd", f"if={path}", "of=/dev/null", "bs=1M") for _ in range(3))


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


def fio(where: Path, load: str, mib: int) -> dict:
    """fio's ``load`` ("seq" or "rand") writing a new file of ``mib`` MiB in ``where``:
    {"s": its wall clock (until it exits, the file closed), "mbs": MB written ÷ that,
    "fio_mbs": the bandwidth fio reports, "file": the file's name}; "s" and the rates None
    and "error" (its exit code and stderr) when fio failed. Leaves the file in place."""
    rw, bs = FIO_LOADS[load]
    path = where / f"fio-{load}-{next(_fio_runs)}.bin"
    settled()
    cmd = ["fio", f"--name={load}", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", "--ioengine=psync",
           "--numjobs=1", f"--size={mib}M", "--end_fsync=0", "--output-format=json"]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - t
    out = {"file": path.name, "s": None, "mbs": None, "fio_mbs": None}
    job = None
    try:
        job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        pass
    if r.returncode or job is None or job.get("error"):
        out["error"] = f"exit {r.returncode}, job error {job and job.get('error')}: {r.stderr.strip()[-800:]}"
        log(f"fio {load} in {where}: {' '.join(cmd)}: {out['error']}")
        return out
    return dict(out, s=took, mbs=job["write"]["io_bytes"] / took / 1e6, fio_mbs=job["write"]["bw_bytes"] / 1e6)


def fio_rows(where: Path, local: Path, args, res: dict, name: str, after=None) -> None:
    """Both fio loads, ``args.fio_repeat`` times each in ``where`` and, just before each, on
    the local disk (``local``): the same page cache state for both of a pair — a write of
    1 GiB runs at 2-7 GB/s here depending on what the kernel must reclaim first. Into
    ``res``: NAME_fio_LOAD (the runs) and NAME_fio_LOAD_local (their local partners);
    ``after(path)`` after each run in ``where`` (a sync), the local files removed."""
    for load, mib in (("seq", args.fio_mib), ("rand", args.fio_rand_mib)):
        runs, partners = res.setdefault(f"{name}_fio_{load}", []), res.setdefault(f"{name}_fio_{load}_local", [])
        for _ in range(args.fio_repeat):
            partner = fio(local, load, mib)
            (local / partner["file"]).unlink(missing_ok=True)
            run = fio(where, load, mib)
            if after is not None:
                after(where / run["file"])
            partners.append(partner)
            runs.append(run)
            if run["s"] is not None and partner["s"] is not None:
                log(f"{name}: fio {load} {mib} MiB {run['s']:.2f} s, {run['mbs']:.0f} MB/s until exit "
                    f"({run['fio_mbs']:.0f} as fio measures); local disk {partner['mbs']:.0f} "
                    f"({partner['fio_mbs']:.0f})")


def fio_median(runs: list[dict], what: str) -> float | None:
    """The median of the runs' ``what`` ("mbs", "fio_mbs"); None when any run failed."""
    values = [r[what] for r in runs]
    return None if not values or None in values else statistics.median(values)


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
        if args.fio:
            fio_rows(floor, local, args, res, "floor", after=Path.unlink)
    (work / "pass-src").mkdir(exist_ok=True)
    with PassMount(work / "pass-src", work / "pass-mnt", "--writeback") as passing:
        res["pass_dbench"] = dbench(passing / "dbench", args.dbench_seconds)
        log(f"pass-through floor (writeback cache): dbench {res['pass_dbench']} MB/s")
    for name, extra in VARIANTS:
        mp = delve.mount(*extra)
        try:
            d = mp / "eager"
            res[f"{name}_dd_s"] = dd(src, d / f"{name}.bin")
            res[f"{name}_sync_s"] = delve.sync()[0]
            res[f"{name}_reread_s"] = reread(d / f"{name}.bin")
            (d / f"{name}.bin").unlink()  # as on local disk: fio writes beside no kept 1 GiB
            delve.sync()
            fio_files = []
            if args.fio:  # each file in S3 before the next row: no upload runs beside it
                fio_rows(d, local, args, res, name, after=lambda path: (fio_files.append(path), delve.sync()))
            res[f"{name}_dbench"] = dbench(d / f"dbench-{name}", args.dbench_seconds)
            t = time.perf_counter()
            subprocess.run(["rm", "-rf", str(d / f"dbench-{name}"), *map(str, fio_files)], check=True)
            delve.sync()
            log(f"{name}: dd {res[f'{name}_dd_s']:.2f} s, sync {res[f'{name}_sync_s']:.2f} s, "
                f"re-read {res[f'{name}_reread_s']:.2f} s, dbench {res[f'{name}_dbench']} MB/s "
                f"(cleanup {time.perf_counter() - t:.1f} s)")
        finally:
            delve.umount()
    mp = delve.mount(*JOURNAL_FSYNC)
    try:
        res["eager_rw_journal_dbench"] = dbench(mp / "eager" / "dbench-journal", args.dbench_seconds)
        subprocess.run(["rm", "-rf", str(mp / "eager" / "dbench-journal")], check=True)
        delve.sync()
        log(f"{' '.join(JOURNAL_FSYNC)}: dbench {res['eager_rw_journal_dbench']} MB/s")
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
    lines.append(f"| dbench, 2 clients | {mb(res['local_dbench'])} | {mb(res.get('pass_dbench'))}* | "
                 f"{mb(res['eager_dbench'])} | {mb(res['eager_rw_dbench'])} |")
    lines.append(f"| dbench, `fsync=journal` | — | — | — | {mb(res.get('eager_rw_journal_dbench'))} |")
    columns = ("floor", "eager", "eager_rw")
    for load, what in (("seq", f"fio sequential write, {res.get('fio_mib')} MiB in 1 MiB"),
                       ("rand", f"fio random write, {res.get('fio_rand_mib')} MiB in 4 KiB")):
        if not res.get(f"eager_fio_{load}"):
            continue  # --no-fio
        local_runs = [r for c in columns for r in res.get(f"{c}_fio_{load}_local", [])]
        cells, ratios = [], ["1.00×"]

        def rate(runs):
            v, v_fio = fio_median(runs, "mbs"), fio_median(runs, "fio_mbs")
            return "failed" if v is None else f"{v:.0f} MB/s ({v_fio:.0f})"
        cells.append(rate(local_runs))
        for c in columns:
            runs, partners = res.get(f"{c}_fio_{load}", []), res.get(f"{c}_fio_{load}_local", [])
            cells.append(rate(runs))
            v, ref = fio_median(runs, "mbs"), fio_median(partners, "mbs")
            v_fio, ref_fio = fio_median(runs, "fio_mbs"), fio_median(partners, "fio_mbs")
            ratios.append("—" if v is None or not ref else f"{v / ref:.2f}× ({v_fio / ref_fio:.2f}×)")
        lines.append(f"| {what}, until fio exits (as fio measures), median of {len(res[f'eager_fio_{load}'])} | "
                     + " | ".join(cells) + " |")
        lines.append(f"| speed ÷ local disk ({load} fio; ÷ its local partners) | " + " | ".join(ratios) + " |")
        best = max((r["mbs"] for r in local_runs if r["mbs"] is not None), default=None)
        at_best = ["1.00×" if best else "—"]
        for c in columns:
            v = fio_median(res.get(f"{c}_fio_{load}", []), "mbs")
            at_best.append("—" if v is None or not best else f"{v / best:.2f}×")
        lines.append(f"| speed ÷ the local disk's fastest run ({load} fio, until exit) | "
                     + " | ".join(at_best) + " |")
    lines.append("\n\\* the pass-through floor (benchmarks/pipeline/passfs.py, writeback cache): "
                 "the floor keeps no bytes, dbench needs them")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--dbench-seconds", type=int, default=20)
    ap.add_argument("--fio-mib", type=int, default=None,
                    help="size of fio's sequential write in MiB (default: --big-mib)")
    ap.add_argument("--fio-rand-mib", type=int, default=64, help="size of fio's random 4 KiB write in MiB")
    ap.add_argument("--fio-repeat", type=int, default=3,
                    help="fio runs of each load per column, each after one on the local disk (medians)")
    ap.add_argument("--no-fio", dest="fio", action="store_false", help="leave the fio rows out")
    ap.add_argument("--save", metavar="NAME", help="keep the results as results/eager-writes-NAME.json")
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    if args.fio_mib is None:
        args.fio_mib = args.big_mib
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
            if args.fio:
                res.update(fio_mib=args.fio_mib, fio_rand_mib=args.fio_rand_mib)
            with cpu_mode(mode):
                run_mode(here, Delve(env, here, handler.url), src, args, res)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / (f"eager-writes-{args.save}.json" if args.save else "eager-writes.json")
    out.write_text(json.dumps(results, indent=2))
    log(f"results: {out}")
    for mode in results:
        print(f"\n{CPU_MODES[mode]}:\n")
        print(table(results[mode]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
