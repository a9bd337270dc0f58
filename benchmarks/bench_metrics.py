"""What a mount's metrics cost per FUSE request: the same requests with metrics off and on
(``--metrics-addr``), in three layers.

    .venv/bin/python -m benchmarks.bench_metrics [--batches N] [--batch N] [--files N] [--rounds R]

* ``adapter``: the FUSE adapter's request wrapper in-process, on a request that does
  nothing (``access``): the pure Python cost of the timing;
* ``statfs``: ``statvfs(2)`` on a real mount (every call is a FUSE request the kernel does
  not cache: a do-nothing request through the kernel), its time and the CPU time per
  request of the mount daemon's main thread (``/proc/PID/task/PID/schedstat``: not
  disturbed by waiting for a CPU);
* ``untar``: untar of the first ``--files`` files of benchmarks/bench_tree.py's tree into
  an ``--eager`` mount (request-heavy: lookups, creates, writes, flushes, releases), then
  ``delvefs sync`` (not timed); ``--rounds`` times.

Two mounts (off, on) run side by side. The requests go in short batches (``--batch``; a
tenth for statfs), alternating between off and on (each first in every other round),
``--batches`` of each: on a machine shared with other work (a CPU quota stops a process
for whole periods) the fastest batch is the undisturbed speed; the tenth percentile and
the median are reported beside it.
docs/PERFORMANCE.md, "Metrics", has a run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from .bench_mount import DELVEFS, RESULTS, log
from .bench_tree import Delve, services, source_tar, timed


def bench_adapter(batches: int, batch: int) -> dict:
    import trio

    from delvefs.client.mount.fuse_adapter import Adapter
    from delvefs.client.mount.metrics import request_times

    core = SimpleNamespace(writeback_cache=False, access=lambda ino, mode: None)
    off, on = Adapter(core), Adapter(core, request_times=request_times())

    async def one(adapter) -> float:
        access = adapter.access
        t = time.perf_counter()
        for _ in range(batch):
            await access(1, 0, None)
        return (time.perf_counter() - t) / batch

    async def alternate():
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(batches):
            times["off"].append(await one(off))
            times["on"].append(await one(on))
        return times
    times = trio.run(alternate)
    return summary("adapter", times["off"], times["on"])


def summary(name: str, off: list[float], on: list[float], per: str = "request") -> dict:
    """Per request (or file), microseconds: the fastest batch, the tenth percentile and
    the median."""
    r: dict = {"batches": len(off)}
    for label, times in (("off", off), ("on", on)):
        r[f"{label}_min_us"] = min(times) * 1e6
        r[f"{label}_p10_us"] = statistics.quantiles(times, n=10, method="inclusive")[0] * 1e6
        r[f"{label}_median_us"] = statistics.median(times) * 1e6
    for stat in ("min", "p10", "median"):
        r[f"added_{stat}_us"] = r[f"on_{stat}_us"] - r[f"off_{stat}_us"]
    log(f"{name}: off {r['off_min_us']:.3f} us (p10 {r['off_p10_us']:.3f}, median {r['off_median_us']:.3f}), "
        f"on {r['on_min_us']:.3f} us (p10 {r['on_p10_us']:.3f}, median {r['on_median_us']:.3f}) per {per}")
    return r


def daemon_pid(mountpoint: Path, env: dict) -> int:
    from delvefs.client.mount.mountpoints import run_file
    return json.loads(run_file(str(mountpoint), Path(env["DELVEFS_STATE_HOME"])).read_text())["pid"]


def cpu_seconds(pid: int) -> float:
    """Time on a CPU of process ``pid``'s main thread, the one that answers FUSE requests
    (ns resolution, unlike its ticks)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def statfs_batch(mountpoint: Path, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        os.statvfs(mountpoint)
    return (time.perf_counter() - t) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=500, help="batches of requests, alternating off and on")
    ap.add_argument("--batch", type=int, default=1000, help="requests per batch (statfs: a tenth)")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="untar rounds")
    args = ap.parse_args(argv)
    res: dict = {"adapter": bench_adapter(args.batches, args.batch)}
    tar = source_tar(args.files)
    with services("bench-metrics-") as (work, env, _client, handler):
        mounts = {}
        try:
            for name in ("off", "on"):
                (work / name).mkdir()
                delve = Delve(env, work / name, handler.url)
                metrics = ["--metrics-addr", f"127.0.0.1:{free_port()}"] if name == "on" else []
                mounts[name] = (delve, delve.mount("--eager", *metrics))
            times: dict[str, list[float]] = {"off": [], "on": []}
            cpu: dict[str, list[float]] = {"off": [], "on": []}  # the daemon's, per request
            pids = {name: daemon_pid(mp, env) for name, (_, mp) in mounts.items()}
            n = max(1, args.batch // 10)
            for i in range(args.batches):
                for name, (_, mp) in in_turn(mounts, i):
                    used = cpu_seconds(pids[name])
                    times[name].append(statfs_batch(mp, n))
                    cpu[name].append((cpu_seconds(pids[name]) - used) / n)
            res["statfs"] = summary("statfs", times["off"], times["on"])
            # CPU time does not count the waits for a CPU: the mount's own cost, under load too
            res["statfs_daemon_cpu"] = summary("statfs, the daemon's CPU", cpu["off"], cpu["on"])
            untar: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(args.rounds):
                for name, (_, mp) in in_turn(mounts, i):
                    target = mp / "eager" / f"{name}-{i}"
                    target.mkdir(parents=True)
                    untar[name].append(timed("tar", "-x", "-f", str(tar), "-C", str(target)) / args.files)
                    subprocess.run([DELVEFS, "sync", str(mp)], env=env, check=True, capture_output=True)
            res["untar_per_file"] = summary("untar", untar["off"], untar["on"], per="file")
            res["untar_files"] = args.files
        finally:
            for delve, _ in mounts.values():
                delve.umount()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "metrics-last.json"
    out.write_text(json.dumps(res, indent=2))
    log(f"results: {out}")
    print(json.dumps(res, indent=2))
    return 0


def in_turn(mounts: dict, i: int) -> list:
    """The mounts' items, off first in even rounds and on first in odd ones: neither
    always runs after the other (the store grows, the other's uploads finish)."""
    items = list(mounts.items())
    return items if i % 2 == 0 else items[::-1]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
