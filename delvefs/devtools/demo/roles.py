"""The demo's roles: init, subscriber, publish.

Each role talks to the system only through its public faces — the S3 API
(``delvefs.shared.s3``), the ``delvefs`` command (mount, watch, umount) and plain file
I/O on the mount — exactly as a user's pipeline would.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...shared import s3 as s3api
from ...shared.config import handler_token, handler_url, notify_arn
from .genome import AlignmentScore, make_reference, score_sam, simulate_reads, write_fasta

INPUT_BUCKET = "reads"
OUTPUT_BUCKET = "alignments"
PUBLISHED_AT = "published-at"   # user metadata the publisher stamps on each read file
SEEN_AFTER_MS = "seen-after-ms"  # tag a subscriber puts on each alignment
ALIGN_MS = "align-ms"
DELVEFS = [sys.executable, "-m", "delvefs"]


def log(role: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} {role}] {message}", file=sys.stderr, flush=True)


# --- init -----------------------------------------------------------------------------------

def init() -> int:
    client = s3api.make_client()
    for bucket in (INPUT_BUCKET, OUTPUT_BUCKET):
        s3api.ensure_bucket(client, bucket)
        s3api.wire_notifications(client, bucket, notify_arn())
    log("init", f"buckets {INPUT_BUCKET}, {OUTPUT_BUCKET} created, notifications wired")
    return 0


# --- subscriber -----------------------------------------------------------------------------

def views_yaml(worker: int) -> str:
    return f"""\
# worker {worker}: its share of the reads, and where its alignments go
in:
  bucket: {INPUT_BUCKET}
  object: "*.fastq"
  properties: {{worker: "{worker}"}}
  ttl: 1s
  writable: false
out:
  bucket: {OUTPUT_BUCKET}
  object: "*.sam"
  properties: {{stage: aligned, worker: "{worker}"}}
  ttl: 1s
"""


def build_index(workdir: Path, seed: int) -> Path:
    index = workdir / "index" / "ref"
    if not index.with_suffix(".1.bt2").exists():
        index.parent.mkdir(parents=True, exist_ok=True)
        write_fasta(make_reference(seed), workdir / "index" / "ref.fa")
        subprocess.run(["bowtie2-build", "-q", str(workdir / "index" / "ref.fa"), str(index)], check=True)
    return index


def align_one(path: Path, out_dir: Path, index: Path, threads: int) -> tuple[Path, int]:
    """bowtie2 the FASTQ at ``path`` straight into the output view; returns (output, ms)."""
    out = out_dir / (path.stem + ".sam")
    started = time.monotonic()
    subprocess.run(["bowtie2", "--quiet", "-p", str(threads), "-x", str(index), "-U", str(path),
                    "-S", str(out)], check=True)
    return out, round((time.monotonic() - started) * 1000)


def subscriber(worker: int, workdir: Path, seed: int, threads: int = 1) -> int:
    role = f"worker {worker}"
    workdir.mkdir(parents=True, exist_ok=True)
    index = build_index(workdir, seed)
    views = workdir / "views.yaml"
    views.write_text(views_yaml(worker))
    mnt = workdir / "mnt"
    mnt.mkdir(exist_ok=True)
    subprocess.run([*DELVEFS, "mount", str(views), str(mnt), "--cache-dir", str(workdir / "cache")], check=True)
    log(role, f"mounted {mnt}")
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True
        with contextlib.suppress(ProcessLookupError):
            watch.terminate()

    watch = subprocess.Popen([*DELVEFS, "watch", str(mnt / "in"), "--existing"],
                             stdout=subprocess.PIPE, text=True)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        for line in watch.stdout:
            seen = time.time()
            path = Path(line.rstrip("\n"))
            published = float(os.getxattr(path, f"user.meta.{PUBLISHED_AT}"))
            out, ms = align_one(path, mnt / "out", index, threads)
            # Tags through xattrs: they land on the S3 object (dual access). The publisher
            # waits for SEEN_AFTER_MS, so it goes last.
            os.setxattr(out, f"user.{ALIGN_MS}", str(ms).encode())
            os.setxattr(out, f"user.{SEEN_AFTER_MS}", str(round((seen - published) * 1000)).encode())
            log(role, f"aligned {path.name} -> {out.name} in {ms} ms")
            if stop:
                break
    finally:
        watch.terminate()
        watch.wait(10)
        subprocess.run([*DELVEFS, "umount", str(mnt)], check=False)
        log(role, "unmounted")
    return 0


# --- publisher ------------------------------------------------------------------------------

@dataclass
class WorkerReport:
    files: int = 0
    score: AlignmentScore = field(default_factory=AlignmentScore)
    align_ms: int = 0
    latencies_ms: list[int] = field(default_factory=list)


def read_key(i: int) -> str:
    return f"run1/lane{i % 2 + 1}/sample_{i:03d}.fastq"


def wait_for_subscribers(views: int, timeout: float) -> None:
    """Until the handler has ``views`` views registered (each subscriber mounts two)."""
    from ...client.handler_api import HandlerError, SyncHandlerClient
    deadline = time.monotonic() + timeout
    # the view count is a detail /healthz gives to a principal only
    with SyncHandlerClient(handler_url(), handler_token(), timeout=2) as handler:
        while time.monotonic() < deadline:
            with contextlib.suppress(HandlerError, ValueError):
                if handler.health().get("views", 0) >= views:
                    return
            time.sleep(0.2)
    raise TimeoutError(f"subscribers not mounted after {timeout:.0f} s ({handler_url()})")


def publish(workers: int, files: int, reads: int, seed: int, interval: float, timeout: float,
            backlog: int | None = None) -> int:
    """Upload ``files`` FASTQ files tagged round-robin for ``workers``: the first
    ``backlog`` (default a third) at once, the rest once the subscribers are mounted —
    those measure the upload -> visible latency a user feels."""
    client = s3api.make_client()
    reference = make_reference(seed)
    backlog = files // 3 if backlog is None else backlog
    expected: dict[str, int] = {}  # output key -> worker
    live: set[str] = set()         # output keys of files published while subscribers ran
    started = time.monotonic()
    for i in range(files):
        if i == backlog:
            wait_for_subscribers(2 * workers, timeout)
            log("publisher", "subscribers are mounted; publishing the rest while they run")
        worker = i % workers + 1
        key = read_key(i)
        body = simulate_reads(reference, seed=seed * 1000 + i, count=reads, tag=f"f{i}r").encode()
        client.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body, Tagging=f"worker={worker}",
                          Metadata={PUBLISHED_AT: f"{time.time():.6f}"})
        expected[Path(key).stem + ".sam"] = worker
        if i >= backlog:
            live.add(Path(key).stem + ".sam")
        log("publisher", f"published s3://{INPUT_BUCKET}/{key} for worker {worker}")
        if i >= backlog:
            time.sleep(interval)  # pacing, so that files keep arriving while subscribers work

    deadline = time.monotonic() + timeout
    done: dict[str, dict[str, str]] = {}
    while len(done) < len(expected):
        for key in expected:
            if key not in done:
                tags = s3api.get_object_tags(client, OUTPUT_BUCKET, key)
                if tags is not None and SEEN_AFTER_MS in tags:
                    done[key] = tags
        print(f"\r[publisher] alignments: {len(done)}/{len(expected)}", end="", file=sys.stderr, flush=True)
        if len(done) < len(expected):
            if time.monotonic() > deadline:
                print(file=sys.stderr)
                log("publisher", f"timed out; missing {sorted(set(expected) - set(done))}")
                return 1
            time.sleep(0.25)
    print(file=sys.stderr)
    elapsed = time.monotonic() - started

    reports = {w: WorkerReport() for w in range(1, workers + 1)}
    ok = True
    for key, worker in sorted(expected.items()):
        tags = done[key]
        if tags.get("stage") != "aligned" or tags.get("worker") != str(worker):
            log("publisher", f"{key}: wrong tags {tags}")
            ok = False
        sam = client.get_object(Bucket=OUTPUT_BUCKET, Key=key)["Body"].read().decode()
        report = reports[worker]
        report.files += 1
        report.score += score_sam(sam)
        report.align_ms += int(tags.get(ALIGN_MS, 0))
        if key in live:
            report.latencies_ms.append(int(tags[SEEN_AFTER_MS]))
    print_summary(reports, expected, done, elapsed)
    total = AlignmentScore()
    for r in reports.values():
        total += r.score
    if total.correct_pct < 90:
        log("publisher", f"alignment rate {total.correct_pct:.1f}% below 90% of the simulated truth")
        ok = False
    return 0 if ok else 1


def print_summary(reports, expected, done, elapsed) -> None:
    print(f"\n{'worker':>6} {'files':>6} {'reads':>7} {'aligned %':>10} {'correct %':>10} {'align s':>8}")
    for worker, r in reports.items():
        print(f"{worker:>6} {r.files:>6} {r.score.reads:>7} {r.score.aligned_pct:>10.1f} "
              f"{r.score.correct_pct:>10.1f} {r.align_ms / 1000:>8.2f}")
    latencies = sorted(ms for r in reports.values() for ms in r.latencies_ms)
    if latencies:
        print(f"\nupload -> visible in the subscriber's view (files published while subscribers ran): "
              f"median {statistics.median(latencies):.0f} ms, max {latencies[-1]} ms over "
              f"{len(latencies)} files")
    print(f"all {len(expected)} files aligned {elapsed:.1f} s after the first upload")
    print(f"\noutputs, read back through the S3 API (s3://{OUTPUT_BUCKET}/...):")
    for key in sorted(expected):
        print(f"  {key:<24} {json.dumps(done[key], sort_keys=True)}")
