"""The aligner role: one member of the pool that aligns the reads, and its per-file step.

``aligner`` mounts the two views every aligner mounts (roles.aligner_views) and joins the
work-queue group of ``reads``::

    delvefs watch MNT/reads --group align --existing --lease 10 -j 1 \\
        --exec 'exec python -m delvefs.devtools.demo align ... {}'

so each read file goes to exactly one live aligner; one that dies loses its file to the
others when its lease runs out. ``align`` is that command, once per file: bowtie2 writes
the sample's SAM into a scratch directory of the output view (a name the view cannot
show, so nothing of it is uploaded), a small ``stats.json`` goes beside it, and the
directory is renamed into place — the mount publishes both files in one change. Each step
goes into the aligner's journal (roles.record), which the publisher reads to count what
every member took.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .genome import make_reference, write_fasta
from .roles import (DELVEFS, GROUP, PUBLISHED_AT, SCRATCH, STATS, aligner_views, journal_of, killed_marker, log,
                    mounted, read_journal, record, run_of, sample_of)


def build_index(workdir: Path, seed: int) -> Path:
    index = workdir / "index" / "ref"
    if not index.with_suffix(".1.bt2").exists():
        index.parent.mkdir(parents=True, exist_ok=True)
        write_fasta(make_reference(seed), workdir / "index" / "ref.fa")
        subprocess.run(["bowtie2-build", "-q", str(workdir / "index" / "ref.fa"), str(index)], check=True)
    return index


def aligner(name: str, workdir: Path, journals: Path, seed: int, lease: float, kill_at: int,
            threads: int = 1) -> int:
    # SIGTERM ends the member like Ctrl-C: it leaves the group, its file goes to the others
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    journals.mkdir(parents=True, exist_ok=True)
    index = build_index(workdir, seed)
    with mounted(aligner_views(), workdir) as mnt:
        log(name, f"mounted {mnt}")
        step = [sys.executable, "-m", "delvefs.devtools.demo", "align", "--aligner", name,
                "--index", str(index), "--out", str(mnt / "aligned"), "--journals", str(journals),
                "--threads", str(threads), "--kill-at", str(kill_at)]
        # `exec`: the member's SIGTERM then reaches the step itself, not only its shell
        member = subprocess.Popen([*DELVEFS, "watch", str(mnt / "reads"), "--group", GROUP, "--existing",
                                   "--lease", str(lease), "-j", "1", "--exec", f"exec {shlex.join(step)} {{}}"])
        try:
            return member.wait()
        finally:
            if member.poll() is None:
                member.terminate()
                member.wait(30)
            log(name, "left the group, unmounting")


def align(fastq: Path, name: str, index: Path, out: Path, journals: Path, threads: int, kill_at: int) -> int:
    """Align one read file for the group member that runs this; publish its sample."""
    # a stopped member stops this step: KeyboardInterrupt makes subprocess.run kill bowtie2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    key, attempt = os.environ["DELVEFS_GROUP_KEY"], int(os.environ["DELVEFS_GROUP_ATTEMPT"])
    journal = journal_of(journals, name)
    taken = time.time()
    record(journal, "took", key=key, attempt=attempt, member=os.environ["DELVEFS_GROUP_MEMBER"])
    log(name, f"took {key} (attempt {attempt})")
    run, sample = run_of(key), sample_of(key)
    final = out / run / sample
    if final.is_dir():
        # an earlier attempt published it and died before its member acknowledged the file
        record(journal, "already", key=key)
        log(name, f"{sample} was published already")
        return 0
    scratch = final.with_name(SCRATCH + sample)
    shutil.rmtree(scratch, ignore_errors=True)  # an earlier attempt's, on this mount
    scratch.mkdir(parents=True)
    started = time.monotonic()
    bowtie2 = subprocess.run(["bowtie2", "-p", str(threads), "-x", str(index), "-U", str(fastq),
                              "-S", str(scratch / f"{sample}.sam")], stderr=subprocess.PIPE, text=True, check=True)
    align_ms = round((time.monotonic() - started) * 1000)
    published_at = float(os.getxattr(fastq, f"user.meta.{PUBLISHED_AT}"))
    stats = {"sample": sample, "input": key, "aligner": name, "attempt": attempt, "align_ms": align_ms,
             "taken_after_ms": round((taken - published_at) * 1000),
             "bowtie2": bowtie2.stderr.strip().splitlines()}
    (scratch / STATS).write_text(json.dumps(stats, indent=1) + "\n")
    if kill_at and took_count(journal, run) == kill_at and first_to_die(killed_marker(journals, run), name):
        record(journal, "killed", key=key)
        log(name, f"SIGKILL to the whole aligner while it holds {key} ({sample}.sam and {STATS} "
                  f"written into {scratch.name}/, not yet renamed)")
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.rename(scratch, final)  # the mount publishes the directory: both files in one change
    record(journal, "published", key=key, sample=sample)
    log(name, f"published {final.parent.name}/{sample}/ ({sample}.sam, {STATS}; bowtie2 {align_ms} ms)")
    return 0


def took_count(journal: Path, run: str) -> int:
    """Files of ``run`` this aligner took, this one included."""
    return sum(1 for e in read_journal(journal) if e["event"] == "took" and run_of(e["key"]) == run)


def first_to_die(marker: Path, name: str) -> bool:
    """Whether this aligner is the one of the pool to be killed (the first to ask)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, name.encode())
    os.close(fd)
    return True
