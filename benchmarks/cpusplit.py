"""Where a phase's CPU went, by process group, from /proc: on the 2-core VM many phases are
bound by the CPU of everything taking part (the mount, MinIO, the broker, the handler) more
than by any one of them, and a ratio alone does not show that.

    before = cpu_snapshot()
    ...                                   # the phase
    split = cpu_split(before, cpu_snapshot())   # {"mount": 1.2, "minio": 3.4, ..., "machine": 9.9, "wall": 5.0}

``machine`` is the busy CPU seconds of the whole machine (/proc/stat), ``wall`` the phase's
seconds; ``machine / wall`` near the number of CPUs means the phase was CPU-bound.
A process that ended during the phase is not counted (its group is short by it).
"""
from __future__ import annotations

import os
import time

TICK = os.sysconf("SC_CLK_TCK")
CPUS = os.cpu_count() or 1
GROUPS = ("mount", "minio", "rabbitmq", "handler", "other")


def _group(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "other"
    name = os.path.basename(argv[0]).decode(errors="replace")
    words = [a.decode(errors="replace") for a in argv[1:4]]
    if name == "minio":
        return "minio"
    if name in ("beam.smp", "erl_child_setup", "epmd", "inet_gethost"):
        return "rabbitmq"
    if "mount" in words and any("delvefs" in a for a in (name, *words)):
        return "mount"
    if any("eventhandler" in a for a in words):
        return "handler"
    return "other"


def cpu_snapshot() -> dict:
    """CPU seconds so far of every process (by pid, with its group), the machine's busy
    seconds and the clock."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        procs[pid] = (_group(pid), (int(fields[11]) + int(fields[12])) / TICK)
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # less idle and iowait
    return {"procs": procs, "busy": busy / TICK, "at": time.monotonic()}


def cpu_split(before: dict, after: dict) -> dict:
    """CPU seconds per group between two snapshots, with ``machine`` and ``wall``."""
    out = dict.fromkeys(GROUPS, 0.0)
    for pid, (group, cpu) in after["procs"].items():
        out[group] += cpu - before["procs"].get(pid, (group, 0.0))[1]
    out["machine"] = after["busy"] - before["busy"]
    out["wall"] = after["at"] - before["at"]
    return {k: round(v, 3) for k, v in out.items()}


def describe(split: dict) -> str:
    """One line: each group's CPU seconds, and how busy the machine was."""
    parts = ", ".join(f"{g} {split[g]:.2f}" for g in GROUPS)
    return (f"CPU s: {parts}; machine {split['machine']:.2f} of {CPUS * split['wall']:.2f} "
            f"({100 * split['machine'] / max(CPUS * split['wall'], 1e-9):.0f} % busy)")
