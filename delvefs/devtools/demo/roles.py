"""What the demo's roles share: the buckets and keys, the views files, the aligners'
journals, a mount's lifetime, and the ``init`` role.

Each role talks to the system only through its public faces — the S3 API
(``delvefs.shared.s3``), the ``delvefs`` command (mount, watch, umount), the handler's
status and plain file I/O on a mount — exactly as a user's pipeline would.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ...shared import s3 as s3api
from ...shared.config import notify_arn

INPUT_BUCKET = "reads"
OUTPUT_BUCKET = "alignments"
OUTPUT_ROOT = "aligned/"        # a sample's results: aligned/RUN/SAMPLE/{SAMPLE.sam, stats.json}
SCRATCH = ".tmp-"               # aligned/RUN/.tmp-SAMPLE/: written there, renamed into place
STATS = "stats.json"
GROUP = "align"                 # the work-queue group the aligners form on the reads view
PUBLISHED_AT = "published-at"   # user metadata the publisher stamps on each read file
DELVEFS = [sys.executable, "-m", "delvefs"]


def log(role: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {role}] {message}", file=sys.stderr, flush=True)


# --- keys ------------------------------------------------------------------------------------

def read_key(run: str, i: int) -> str:
    return f"{run}/lane{i % 2 + 1}/sample_{i:03d}.fastq"


def sample_of(key: str) -> str:
    return Path(key).stem


def run_of(key: str) -> str:
    return key.split("/", 1)[0]


def output_files(sample: str) -> list[str]:
    return sorted([f"{sample}.sam", STATS])


# --- views -----------------------------------------------------------------------------------

def aligner_views() -> str:
    """Every aligner mounts these same two views: equal views are one view at the handler,
    so the aligners' group of ``reads`` is one group."""
    return f"""\
reads:
  bucket: {INPUT_BUCKET}
  object: "*.fastq"
  ttl: 1s
  writable: false
aligned:
  bucket: {OUTPUT_BUCKET}
  object: "{OUTPUT_ROOT}*"
  not: {{object: "*/{SCRATCH}*"}}       # a sample's scratch directory: never uploaded
  properties: {{stage: aligned}}         # also the tags its files get
  ttl: 1s
"""


def results_views(run: str) -> str:
    """The publisher's view: one run's results, read-only."""
    return f"""\
aligned:
  bucket: {OUTPUT_BUCKET}
  object: "{OUTPUT_ROOT}{run}/*"
  not: {{object: "*/{SCRATCH}*"}}
  properties: {{stage: aligned}}
  ttl: 1s
  writable: false
"""


@contextlib.contextmanager
def mounted(views: str, workdir: Path):
    """``views`` mounted at ``workdir/mnt`` (its cache beside it) until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "views.yaml").write_text(views)
    mnt = workdir / "mnt"
    mnt.mkdir(exist_ok=True)
    # its own session, and waited for even when interrupted: a mount being made is
    # finished, so that it can be unmounted (its daemon would outlive an interrupted command)
    command = subprocess.Popen([*DELVEFS, "mount", str(workdir / "views.yaml"), str(mnt), "--cache-dir",
                                str(workdir / "cache")], start_new_session=True)
    try:
        try:
            status = command.wait()
        except KeyboardInterrupt:
            command.wait()
            raise
        if status != 0:
            raise RuntimeError(f"delvefs mount {mnt} failed (exit status {status})")
        yield mnt
    finally:
        unmount(mnt)


def unmount(mnt: Path) -> None:
    if not os.path.ismount(mnt):
        return
    r = subprocess.run([*DELVEFS, "umount", str(mnt)], check=False, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if "scratch file left behind" in r.stdout + r.stderr:
        # what the killed aligner wrote and never finished: dropped on purpose, not lost
        log("demo", f"{mnt}: the scratch files above are the killed aligner's unfinished work, "
                    "left behind as intended (its file went to another aligner); nothing was lost")


# --- journals --------------------------------------------------------------------------------

def journal_of(journals: Path, aligner: str) -> Path:
    """An aligner's journal: one JSON line per event (took, published, already, killed)."""
    return journals / f"{aligner}.jsonl"


def record(journal: Path, event: str, **fields) -> None:
    line = json.dumps({"event": event, "time": round(time.time(), 3), **fields}) + "\n"
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write: lines of a killed writer are whole or absent
    finally:
        os.close(fd)


def read_journal(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.endswith("}")]


def read_journals(journals: Path) -> dict[str, list[dict]]:
    return {p.stem: read_journal(p) for p in sorted(journals.glob("*.jsonl"))}


def killed_marker(journals: Path, run: str) -> Path:
    """Names the aligner of the pool that was killed in ``run`` (the first to claim it)."""
    return journals / f"killed-{run}"


# --- init ------------------------------------------------------------------------------------

def init() -> int:
    client = s3api.make_client()
    for bucket in (INPUT_BUCKET, OUTPUT_BUCKET):
        s3api.ensure_bucket(client, bucket)
        s3api.wire_notifications(client, bucket, notify_arn())
    log("init", f"buckets {INPUT_BUCKET}, {OUTPUT_BUCKET} created, notifications wired")
    return 0
