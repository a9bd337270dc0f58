"""The publisher role: the sequencer and the report.

It uploads read files through the plain S3 API (a third at once, the rest while the
aligners' group runs), subscribes to the run's results through a read-only mount
(``delvefs watch``) and waits for whole samples — when the first file of a sample
appears, both must be there — then checks that every sample was aligned exactly once,
counting the outputs (the view, and S3 itself) and the inputs each member took (the
aligners' journals), and that the group has nothing left; prints the summary.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...shared import s3 as s3api
from ...shared.config import handler_token, handler_url
from .genome import AlignmentScore, make_reference, score_sam, simulate_reads
from .roles import (DELVEFS, GROUP, INPUT_BUCKET, OUTPUT_BUCKET, OUTPUT_ROOT, PUBLISHED_AT, log,
                    mounted, output_files, read_journals, read_key, results_views, sample_of)


class Subscriber:
    """``delvefs watch VIEW --existing`` in a thread: when the first file of a sample
    appears, the sample's directory is listed — a whole sample has both its files."""

    def __init__(self, view_dir: Path):
        self.view_dir = view_dir
        self.first_seen: dict[str, tuple[float, list[str]]] = {}  # sample -> (when, its listing then)
        self.changed = threading.Condition()
        self.watch = subprocess.Popen([*DELVEFS, "watch", str(view_dir), "--existing"],
                                      stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True, name="demo-subscriber")
        self.thread.start()

    def _read(self) -> None:
        for line in self.watch.stdout:
            sample = Path(line.rstrip("\n")).relative_to(self.view_dir).parts[0]
            if sample in self.first_seen:
                continue
            directory = self.view_dir / sample
            listing = sorted(os.listdir(directory)) if directory.is_dir() else []  # a stray file: no sample
            with self.changed:
                self.first_seen[sample] = (time.time(), listing)
                self.changed.notify_all()
            log("publisher", f"{sample}/ appeared: {', '.join(listing)}")

    def wait_for(self, samples: set[str], deadline: float) -> set[str]:
        """The samples not seen by the deadline."""
        with self.changed:
            while not samples <= set(self.first_seen) and self.watch.poll() is None:
                if not self.changed.wait(max(0.0, deadline - time.monotonic())):
                    break
            return samples - set(self.first_seen)

    def close(self) -> None:
        if self.watch.poll() is None:
            self.watch.terminate()
        self.watch.wait(30)
        self.thread.join(10)


def group_state(timeout: float = 5) -> dict | None:
    """The aligners' group as the handler's status shows it (None before it exists)."""
    from ...client.handler.api import HandlerError, SyncHandlerClient
    with SyncHandlerClient(handler_url(), handler_token(), timeout=timeout) as handler:
        with contextlib.suppress(HandlerError):
            return next((g for g in handler.status().get("groups", []) if g["name"] == GROUP), None)
    return None


def wait_for_group(condition, deadline: float, what: str) -> dict:
    while True:
        group = group_state()
        if group is not None and condition(group):
            return group
        if time.monotonic() > deadline:
            raise TimeoutError(f"group {GROUP}: no {what} ({handler_url()}): {group}")
        time.sleep(0.2)


@dataclass
class AlignerReport:
    took: list[dict] = field(default_factory=list)       # journal entries: key, attempt
    published: list[str] = field(default_factory=list)   # samples
    already: list[str] = field(default_factory=list)     # keys found published by an earlier attempt
    killed: str | None = None                            # the key it held when it was killed
    score: AlignmentScore = field(default_factory=AlignmentScore)
    align_ms: int = 0


def publish(aligners: int, files: int, reads: int, seed: int, interval: float, timeout: float,
            backlog: int | None, run: str, journals: Path, workdir: Path) -> int:
    """Upload ``files`` read files of ``run``: the first ``backlog`` (default a third) at
    once, the rest once the group has ``aligners`` members; wait for every sample; check."""
    client = s3api.make_client()
    reference = make_reference(seed)
    backlog = files // 3 if backlog is None else backlog
    keys = [read_key(run, i) for i in range(files)]
    uploaded: dict[str, float] = {}  # sample -> upload time
    live: set[str] = set()           # samples uploaded while the group ran
    deadline = time.monotonic() + timeout
    with mounted(results_views(run), workdir) as mnt:
        subscriber = Subscriber(mnt / "aligned")
        try:
            started = time.monotonic()
            for i, key in enumerate(keys):
                if i == backlog:
                    wait_for_group(lambda g: len(g["members"]) >= aligners, deadline, f"{aligners} members")
                    log("publisher", f"the group {GROUP} has {aligners} members; publishing the rest while it runs")
                body = simulate_reads(reference, seed=seed * 1000 + i, count=reads, tag=f"f{i}r").encode()
                uploaded[sample_of(key)] = time.time()
                client.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body,
                                  Metadata={PUBLISHED_AT: f"{uploaded[sample_of(key)]:.6f}"})
                log("publisher", f"published s3://{INPUT_BUCKET}/{key}")
                if i >= backlog:
                    live.add(sample_of(key))
                    time.sleep(interval)  # pacing, so that files keep arriving while the group works
            missing = subscriber.wait_for(set(uploaded), deadline)
            elapsed = time.monotonic() - started
            if missing:
                log("publisher", f"timed out; no results for {sorted(missing)}")
                return 1
            # the samples are out; their members acknowledge them just after
            group = wait_for_group(lambda g: g["in_flight"] == 0 and g["backlog"] == 0, deadline,
                                   "quiet moment (files in flight or waiting)")
        except TimeoutError as exc:
            log("publisher", f"timed out: {exc}")
            return 1
        finally:
            subscriber.close()
        return check_and_report(client, mnt / "aligned", run, keys, uploaded, live, subscriber.first_seen,
                                read_journals(journals), group, elapsed)


def check_and_report(client, view_dir: Path, run: str, keys: list[str], uploaded: dict[str, float],
                     live: set[str], first_seen: dict, journals: dict[str, list[dict]], group: dict,
                     elapsed: float) -> int:
    """Every sample exactly once: in the view, in S3 and in the journals; print the summary."""
    problems: list[str] = []
    samples = sorted(sample_of(k) for k in keys)

    # the outputs: what the view shows, what S3 has (nothing else, no scratch)
    in_s3: dict[str, list[str]] = {}
    prefix = f"{OUTPUT_ROOT}{run}/"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=OUTPUT_BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            directory, _, name = obj["Key"][len(prefix):].partition("/")
            in_s3.setdefault(directory, []).append(name)
    for directory in sorted(set(in_s3) - set(samples)):
        problems.append(f"s3://{OUTPUT_BUCKET}/{OUTPUT_ROOT}{run}/{directory}/ is no sample's")
    shown = sorted(p.name for p in view_dir.iterdir())
    if shown != samples:
        problems.append(f"the view shows {shown}, not the {len(samples)} samples")
    partly = [s for s, (_when, listing) in first_seen.items() if listing != output_files(s)]
    for sample in samples:
        if sorted(in_s3.get(sample, [])) != output_files(sample):
            problems.append(f"{sample}: S3 has {sorted(in_s3.get(sample, []))}, not {output_files(sample)}")
    for sample in partly:
        problems.append(f"{sample}: first seen with {first_seen[sample][1]} only")

    # the inputs each member took, from the aligners' journals
    reports = {name: AlignerReport() for name in journals}
    published_by: dict[str, list[str]] = {}
    attempts: dict[str, list[tuple[str, int]]] = {}
    for name, entries in journals.items():
        report = reports[name]
        for e in entries:
            if not e.get("key", "").startswith(f"{run}/"):
                continue  # another run's
            if e["event"] == "took":
                report.took.append(e)
                attempts.setdefault(e["key"], []).append((name, e["attempt"]))
            elif e["event"] == "published":
                report.published.append(e["sample"])
                published_by.setdefault(e["sample"], []).append(name)
            elif e["event"] == "already":
                report.already.append(e["key"])
            elif e["event"] == "killed":
                report.killed = e["key"]
    for sample in samples:
        who = published_by.get(sample, [])
        if len(who) != 1:
            problems.append(f"{sample}: published {len(who)} times ({', '.join(who) or 'never'})")
    for key in keys:
        if key not in attempts:
            problems.append(f"{key}: no member took it")

    # the results themselves, read through the view
    stats_of: dict[str, dict] = {}
    for sample in sorted(set(samples) & set(shown)):
        stats = stats_of[sample] = json.loads((view_dir / sample / "stats.json").read_text())
        if published_by.get(sample) != [stats["aligner"]]:
            problems.append(f"{sample}: stats.json names {stats['aligner']}, the journals {published_by.get(sample)}")
        report = reports.setdefault(stats["aligner"], AlignerReport())
        report.score += score_sam((view_dir / sample / f"{sample}.sam").read_text())
        report.align_ms += stats["align_ms"]

    # the group: nothing failed, in flight or waiting
    failed = [f for f in group["failed_files"] if f["key"].startswith(f"{run}/")]
    for f in failed:
        problems.append(f"{f['key']}: failed in group {GROUP} after {f['attempts']} attempts ({f.get('error')})")

    print_summary(reports, samples, attempts, published_by, stats_of, uploaded, live, first_seen, partly,
                  group, elapsed)
    total = AlignmentScore()
    for r in reports.values():
        total += r.score
    if total.correct_pct < 90:
        problems.append(f"alignment rate {total.correct_pct:.1f}% below 90% of the simulated truth")
    for problem in problems:
        log("publisher", f"NOT EXACTLY ONCE / WRONG: {problem}")
    return 1 if problems else 0


def print_summary(reports, samples, attempts, published_by, stats_of, uploaded, live, first_seen, partly,
                  group, elapsed) -> None:
    print(f"\n{'aligner':<10} {'took':>5} {'published':>10} {'reads':>7} {'aligned %':>10} {'correct %':>10} "
          f"{'align s':>8}  killed holding")
    for name, r in sorted(reports.items()):
        print(f"{name:<10} {len(r.took):>5} {len(r.published):>10} {r.score.reads:>7} {r.score.aligned_pct:>10.1f} "
              f"{r.score.correct_pct:>10.1f} {r.align_ms / 1000:>8.2f}  {r.killed or '-'}")
    took = sum(len(r.took) for r in reports.values())
    published = sum(len(r.published) for r in reports.values())
    print(f"{'all':<10} {took:>5} {published:>10}")

    once = sum(1 for s in samples if len(published_by.get(s, [])) == 1)
    twice = sum(1 for s in samples if len(published_by.get(s, [])) > 1)
    never = len(samples) - once - twice
    print(f"\nsamples: {len(samples)} uploaded, {once} published exactly once, {never} missing, {twice} duplicated")
    print(f"inputs: taken {took} times for {len(samples)} files")
    for key, tries in sorted(attempts.items()):
        tries = sorted(tries, key=lambda t: t[1])
        if len(tries) > 1:
            print(f"  {key}: " + ", then ".join(f"{name} (attempt {n})" for name, n in tries))
    for name, r in sorted(reports.items()):
        if r.killed:
            print(f"  {name} was SIGKILLed holding {r.killed}; the group gave the file to another member "
                  "when its lease ran out")
    print(f"whole samples: {len(first_seen) - len(partly)} of {len(samples)} appeared with both files at once "
          f"({len(partly)} partly)")
    print(f"group {GROUP}: {len(group['members'])} live members, done {group['done']}, failed {group['failed']}, "
          f"in flight {group['in_flight']}, backlog {group['backlog']}")
    taken = sorted(stats_of[s]["taken_after_ms"] for s in live if s in stats_of and stats_of[s]["attempt"] == 1)
    if taken:
        print(f"upload -> taken by a member (files uploaded while the group ran, first attempts): "
              f"median {statistics.median(taken):.0f} ms, max {taken[-1]} ms over {len(taken)} files")
    whole = sorted(round((first_seen[s][0] - uploaded[s]) * 1000) for s in live if s in first_seen)
    if whole:
        print(f"upload -> whole sample seen by the publisher: median {statistics.median(whole):.0f} ms, "
              f"max {whole[-1]} ms")
    print(f"all {len(samples)} samples published {elapsed:.1f} s after the first upload")
    print(f"\noutputs, read back through the publisher's view (s3://{OUTPUT_BUCKET}/{OUTPUT_ROOT}RUN/...):")
    for sample in samples:
        stats = stats_of.get(sample)
        who = f"{stats['aligner']} attempt {stats['attempt']}" if stats else "-"
        listing = ", ".join(first_seen[sample][1]) if sample in first_seen else "-"
        print(f"  {sample}/  {listing:<32} {who}")
    sys.stdout.flush()
