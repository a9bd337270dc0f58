"""A workflow on a mount: a small sequencing pipeline (Snakemake, bowtie2, samtools;
benchmarks/pipeline/Snakefile) run on the local disk with a boto3 stage-in and stage-out
(the baseline), on DelveFS (default and eager mode, passthrough on and off), on s3fs-fuse,
on rclone mount and on a pass-through floor file system, against the same MinIO, in one
run — each variant ``--repeat`` times, pinned and unpinned (``--cpus``), one table each.

    .venv/bin/python -m benchmarks.bench_pipeline [--samples 24] [--reads 8000] [--repeat 2]
        [--only local,local-parallel,delvefs,eager,delvefs-policy,delvefs-nopt,eager-nopt,s3fs,rclone,floor,floorwb]
        [--mount-options fsync=journal,write_back=2] [--cpus both|pinned|unpinned] [--ttl 300s]
        [--distance MS [--bandwidth MB]]

The workflow: ``--samples`` samples (every other one paired-end), ``--reads`` reads (pairs)
of 100 bases each, sampled with 1 % mismatches from a random 200 kb reference of 4 contigs
(seeded: the same inputs every run, built once in ~/.cache/delvefs/bench-pipeline/). Per
sample: bowtie2 (index built once by bowtie2-build) piped to ``samtools view -b``,
``samtools sort``, ``samtools index``, ``flagstat``, ``idxstats``, a Python stats script
(Snakemake ``script:``); a summary over all samples — 6 × samples + 3 jobs,
``snakemake --cores 2``. The inputs are objects of the bucket ``pipeline-inputs``; the
outputs go to ``pipeline-results`` under a prefix of their own per run.

Variants (the clock covers everything until every output is in S3):
  * ``local``: boto3 downloads the inputs (10 at a time, as ``aws s3 sync``), Snakemake runs
    on the local disk, boto3 uploads every output (not ``.snakemake/``) — the baseline;
  * ``local-parallel``: the same with parallel staging: one s3transfer TransferManager
    (``max_concurrency=16``, as ``aws s3 sync`` with 16 requests at a time) for all the
    downloads, one for all the uploads — a second denominator (÷ parallel staging);
  * ``delvefs``: one DelveFS mount: the inputs read through a read-only view of the inputs
    bucket, the working directory (``.snakemake/`` too) a writable view of the run's
    prefix; the default mode uploads at close, so S3 has every output when Snakemake ends;
  * ``eager``: the same mount with ``--eager``, then ``delvefs sync`` inside the clock;
  * ``delvefs-policy``: the default mount with a write policy for Snakemake's bookkeeping
    (``write: {eager: [".snakemake/*"]}``: those files written back eagerly, the outputs
    close-to-open), then ``delvefs sync`` inside the clock;
  * ``delvefs-nopt``, ``eager-nopt``: the same two with ``-o passthrough=off`` (on by default;
    an eager mount turns it off by itself);
  * ``delvefs-opts``, ``eager-opts``: the same two with ``-o`` the ``--mount-options`` given
    (only with ``--mount-options``, and only options ``delvefs mount --help`` lists);
  * ``s3fs``, ``rclone``: s3fs-fuse and ``rclone mount --vfs-cache-mode writes`` (its
    default 5 s write-back) of each bucket, the same layout; the clock runs until S3 has
    every file the mount shows at its size (rclone uploads after close);
  * ``floor``, ``floorwb``: benchmarks/pipeline/passfs.py, a pyfuse3 file system passing
    each request on to a local directory (served as floorfs.py, i.e. as DelveFS; floorwb with
    the kernel's writeback cache, as eager mounts), with the baseline's stage-in and
    stage-out through it: what the kernel and a Python FUSE request loop cost.
Pinned: the file system's daemons (and the baseline's boto3 transfers) on CPU 0 (``taskset
-c 0``), Snakemake and its tools on every CPU; unpinned: everything anywhere. MinIO,
RabbitMQ and the handler always run anywhere.

The medians' table also has the ceiling: the baseline's workflow phase alone, i.e. a mount
that costs nothing, reading and writing as fast as the local disk, with no staging to do
(its ratio is the most any file system can reach on this workflow), and for each variant
how close it gets to it (ceiling ÷ its total).

``--distance MS`` puts S3 MS ms away (each way; ``--bandwidth`` MB/s per connection): a
toxiproxy link in front of MinIO (delvefs/devtools/distance.py: the bandwidth toxic, then
the latency toxic) that every S3 client uses — the staging (boto3, s3transfer), the DelveFS
mounts and the handler's S3 endpoint, s3fs, rclone — while MinIO's events to RabbitMQ and
the mounts' requests to the handler stay on loopback; so do the benchmark's own looks at
S3 (an observer, not a client measured): its checks and its wait until S3 has every
output, which stops the clock. The link is probed (its added round trip measured) before
each run; a run whose probe is off is not run.

Every run is checked: the outputs in S3 (not ``.snakemake/``) are the set of the reference
run (an untimed local run first, which also warms the caches) with the same sizes (BAM,
BAI, bowtie2 index and its log within 2 % or 1 KiB: headers name paths), the text outputs
(flagstat, idxstats, stats, summary, bowtie2's logs) byte for byte; S3 has every file the
mount shows; ``delvefs status`` has nothing pending. Snakemake is installed by the benchmark
into build/bench-pipeline-venv (never a project dependency); bowtie2 and samtools are
Debian's (``apt-get install bowtie2 samtools``). The tables go to stdout and to
benchmarks/results/pipeline-DATE.txt (the numbers to pipeline-DATE.json).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.devtools.distance import Toxiproxy
from delvefs.shared.config import S3Settings
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import DELVEFS, RESULTS, DelveMount, log, wait_for
from .bench_tree import services
from .mounting import PassMount, add_cpu_option, cpu_mode, cpu_modes, mount_s3fs

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = Path(__file__).resolve().parent / "pipeline"
BASE = Path(os.environ.get("DELVEFS_BENCH_PIPELINE_DIR", Path.home() / ".cache/delvefs/bench-pipeline"))
VENV = ROOT / "build" / "bench-pipeline-venv"
SNAKEMAKE_REQUIREMENT = "snakemake==9.27.1"
INPUTS, RESULTS_BUCKET = "pipeline-inputs", "pipeline-results"
TOOLS = ("bowtie2", "bowtie2-build", "samtools")
SEED = 20240601
TRANSFERS = 10  # boto3 transfers at a time (aws s3 sync's default)
PARALLEL_TRANSFERS = 16  # the parallel staging's (s3transfer's max_concurrency)

VARIANTS = {  # name: (what, kind, extra mount arguments)
    "local": ("local disk + boto3 stage-in/out (baseline)", "local", ()),
    "local-parallel": ("local disk + parallel staging (s3transfer, 16 transfers)", "local", ()),
    "delvefs": ("DelveFS default", "delvefs", ()),
    "eager": ("DelveFS --eager + `delvefs sync`", "delvefs", ("--eager",)),
    "delvefs-policy": ("DelveFS default, `write: {{eager: [.snakemake/*]}}` + `delvefs sync`", "delvefs", ()),
    "delvefs-nopt": ("DelveFS default, passthrough=off", "delvefs", ("-o", "passthrough=off")),
    "eager-nopt": ("DelveFS --eager + sync, passthrough=off", "delvefs", ("--eager", "-o", "passthrough=off")),
    "delvefs-opts": ("DelveFS default, -o {opts}", "delvefs", ()),
    "eager-opts": ("DelveFS --eager + sync, -o {opts}", "delvefs", ("--eager",)),
    "s3fs": ("s3fs-fuse", "s3fs", ()),
    "rclone": ("rclone mount --vfs-cache-mode writes", "rclone", ()),
    "floor": ("floor (pass-through pyfuse3) + boto3 stage-in/out", "floor", ()),
    "floorwb": ("floor, writeback cache + boto3 stage-in/out", "floor", ("--writeback",)),
}
DEFAULT = [v for v in VARIANTS if not v.endswith("-opts")]
# what is pinned here (mounting.CPU_MODES pins the workload too: Snakemake needs both CPUs)
PINNING = {"pinned": "Pinned: the file systems' daemons (DelveFS, s3fs, rclone, the floor) and the baseline's "
                     "boto3 transfers on CPU 0 (`taskset -c 0`); Snakemake and its tools on both CPUs",
           "unpinned": "Unpinned: everything on any CPU"}


# --- the inputs

def make_inputs(out: Path, samples: int, reads: int, seed: int = SEED, ref_kb: int = 200, contigs: int = 4,
                read_len: int = 100, mismatch: float = 0.01) -> Path:
    """The workflow's inputs in ``out`` (built once): reference.fa, samples.tsv and
    reads/*.fq.gz — every other sample paired-end (fragments of 300 ± 30 bases), reads
    sampled from the reference with ``mismatch`` substitutions, random qualities."""
    import numpy as np
    if (out / "samples.tsv").exists():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "reads").mkdir(parents=True)
    letters = np.frombuffer(b"ACGT", dtype=np.uint8)
    complement = np.array([3, 2, 1, 0], dtype=np.uint8)
    rng = np.random.default_rng(seed)
    clen = ref_kb * 1000 // contigs
    genome = rng.integers(0, 4, (contigs, clen), dtype=np.uint8)
    with open(partial / "reference.fa", "w") as f:
        for i, contig in enumerate(genome):
            s = letters[contig].tobytes().decode()
            f.write(f">chr{i + 1}\n" + "".join(s[j:j + 60] + "\n" for j in range(0, len(s), 60)))
    rows = ["sample\tr1\tr2"]
    for n in range(samples):
        name, paired = f"S{n + 1:02d}", n % 2 == 0
        r = np.random.default_rng([seed, n])
        contig = r.integers(0, contigs, reads)
        frag = (np.clip(r.normal(300, 30, reads).astype(int), read_len, clen - 1) if paired
                else np.full(reads, read_len))
        start = (r.random(reads) * (clen - frag)).astype(int)
        mates = [genome[contig[:, None], start[:, None] + np.arange(read_len)]]
        if paired:
            mate = genome[contig[:, None], (start + frag - read_len)[:, None] + np.arange(read_len)]
            mates.append(complement[mate][:, ::-1])
        else:  # single reads from either strand
            rev = r.random(reads) < 0.5
            mates[0] = np.where(rev[:, None], complement[mates[0]][:, ::-1], mates[0])
        files = []
        for m, seqs in enumerate(mates, 1):
            hit = r.random(seqs.shape) < mismatch
            seqs = np.where(hit, (seqs + r.integers(1, 4, seqs.shape, dtype=np.uint8)) % 4, seqs)
            bases, quals = letters[seqs], r.integers(53, 74, seqs.shape, dtype=np.uint8)
            suffix = f"/{m}".encode() if paired else b""
            body = b"".join(b"@%s.%d%s\n%s\n+\n%s\n" % (name.encode(), i, suffix, bases[i].tobytes(), quals[i].tobytes())
                            for i in range(reads))
            rel = f"reads/{name}_R{m}.fq.gz" if paired else f"reads/{name}.fq.gz"
            with open(partial / rel, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                                 compresslevel=1) as gz:
                gz.write(body)
            files.append(rel)
        rows.append(f"{name}\t{files[0]}\t{files[1] if paired else ''}")
    (partial / "samples.tsv").write_text("\n".join(rows) + "\n")
    partial.rename(out)
    return out


# --- S3

def listing(client, bucket: str, prefix: str = "") -> dict[str, int]:
    """{key below ``prefix``: size} of ``bucket`` (folder markers left out)."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            if not o["Key"].endswith("/"):
                out[o["Key"][len(prefix):]] = o["Size"]
    return out


def clear(client, bucket: str, prefix: str = "") -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def stage_in(client, target: Path) -> None:
    """Every object of the inputs bucket into ``target``, TRANSFERS at a time."""
    keys = listing(client, INPUTS)
    for key in keys:
        (target / key).parent.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(TRANSFERS) as pool:
        list(pool.map(lambda k: client.download_file(INPUTS, k, str(target / k)), keys))


def stage_out(client, source: Path, prefix: str) -> int:
    """Every file below ``source`` but ``.snakemake/`` to ``prefix``, TRANSFERS at a time."""
    files = [rel for rel in tree(source) if not rel.startswith(".snakemake/")]
    with concurrent.futures.ThreadPoolExecutor(TRANSFERS) as pool:
        list(pool.map(lambda rel: client.upload_file(str(source / rel), RESULTS_BUCKET, prefix + rel), files))
    return len(files)


def transfer_manager(client):
    """s3transfer's TransferManager with PARALLEL_TRANSFERS requests at a time over all its
    transfers (as ``aws s3 sync`` with max_concurrent_requests = 16; 8 MiB parts)."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    return create_transfer_manager(client, TransferConfig(max_concurrency=PARALLEL_TRANSFERS,
                                                          multipart_chunksize=8 << 20))


def stage_in_parallel(client, target: Path) -> None:
    """``stage_in`` by one TransferManager: every download queued at once, 16 requests at a time."""
    keys = listing(client, INPUTS)
    for key in keys:
        (target / key).parent.mkdir(parents=True, exist_ok=True)
    with transfer_manager(client) as tm:
        for f in [tm.download(INPUTS, k, str(target / k)) for k in keys]:
            f.result()


def stage_out_parallel(client, source: Path, prefix: str) -> int:
    """``stage_out`` by one TransferManager, 16 requests at a time."""
    files = [rel for rel in tree(source) if not rel.startswith(".snakemake/")]
    with transfer_manager(client) as tm:
        for f in [tm.upload(str(source / rel), RESULTS_BUCKET, prefix + rel) for rel in files]:
            f.result()
    return len(files)


def tree(d: Path) -> dict[str, int]:
    """{path below ``d``: size} of every regular file."""
    out = {}
    for here, _, names in os.walk(d):
        for n in names:
            p = Path(here) / n
            st = p.lstat()
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(d))] = st.st_size
    return out


def wait_in_s3(client, workdir: Path, prefix: str, timeout: float = 300) -> int:
    """Until S3 has every file of ``workdir`` at its size (under ``prefix``); their count."""
    want = tree(workdir)
    deadline = time.monotonic() + timeout
    while True:
        have = listing(client, RESULTS_BUCKET, prefix)
        missing = sorted(k for k, size in want.items() if have.get(k) != size)
        if not missing:
            return len(want)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} of {len(want)} files not in S3 (at their size) after "
                               f"{timeout:.0f} s: {', '.join(missing[:8])}")
        time.sleep(0.1)


# --- the workflow and its check

def snakemake_venv() -> Path:
    """build/bench-pipeline-venv/bin/snakemake, installed there first if missing."""
    exe = VENV / "bin" / "snakemake"
    if not exe.exists():
        log(f"installing {SNAKEMAKE_REQUIREMENT} into {VENV} ...")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", SNAKEMAKE_REQUIREMENT], check=True)
    return exe


def versions(snakemake: Path) -> str:
    def first(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, errors="replace").stdout.splitlines()[0].strip()
        except (OSError, IndexError):
            return "?"
    return (f"snakemake {first([str(snakemake), '--version'])}, {first(['bowtie2', '--version']).split('/')[-1]}, "
            f"{first(['samtools', '--version'])}")


def run_workflow(snakemake: Path, inputs: Path, workdir: Path, logfile: Path) -> int:
    """``snakemake --cores 2`` of the pipeline in ``workdir``; the number of jobs it ran."""
    env = {**os.environ, "PATH": f"{snakemake.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    workdir.mkdir(parents=True, exist_ok=True)
    with open(logfile, "w") as out:
        r = subprocess.run([str(snakemake), "--snakefile", str(PIPELINE / "Snakefile"), "--directory", str(workdir),
                            "--cores", "2", "--config", f"inputs={inputs}"], env=env, stdout=out,
                           stderr=subprocess.STDOUT, timeout=3600)
    text = logfile.read_text(errors="replace")
    if r.returncode:
        raise RuntimeError(f"snakemake exited with {r.returncode}; last lines of {logfile}:\n"
                           + "\n".join(text.splitlines()[-25:]))
    done = re.findall(r"(\d+) of (\d+) steps \(100%\) done", text)
    return int(done[-1][1]) if done else 0


def exact(rel: str) -> bool:
    """Outputs the same byte for byte in every variant (the others name paths)."""
    return rel.startswith(("qc/", "stats/", "logs/align/")) or rel == "summary.tsv"


def reference_of(results: Path) -> dict:
    """{output: (size, bytes if compared exactly)} of a local run's results."""
    return {rel: (size, (results / rel).read_bytes() if exact(rel) else None)
            for rel, size in tree(results).items() if not rel.startswith(".snakemake/")}


def check(client, prefix: str, reference: dict) -> list[str]:
    """What is wrong with the outputs in S3 under ``prefix`` (nothing: [])."""
    have = {k: v for k, v in listing(client, RESULTS_BUCKET, prefix).items() if not k.startswith(".snakemake/")}
    problems = []
    missing, extra = sorted(set(reference) - set(have)), sorted(set(have) - set(reference))
    if missing:
        problems.append(f"{len(missing)} outputs missing in S3: {', '.join(missing[:6])}")
    if extra:
        problems.append(f"{len(extra)} unexpected objects: {', '.join(extra[:6])}")
    for rel in sorted(set(reference) & set(have)):
        size, body = reference[rel]
        if body is not None:
            got = client.get_object(Bucket=RESULTS_BUCKET, Key=prefix + rel)["Body"].read()
            if got != body:
                problems.append(f"{rel}: content differs ({len(got)} bytes, reference {len(body)})")
        elif abs(have[rel] - size) > max(1024, 0.02 * size):
            problems.append(f"{rel}: {have[rel]} bytes, reference {size}")
    return problems


# --- the file systems

def mount_options_available(opts: str) -> tuple[str, list[str]]:
    """The ``-o`` options of ``opts`` that ``delvefs mount --help`` lists, and those it does not."""
    help_text = subprocess.run([DELVEFS, "mount", "--help"], capture_output=True, text=True).stdout
    known, unknown = [], []
    for item in filter(None, opts.split(",")):
        name = item.split("=", 1)[0]
        (known if f"--{name.replace('_', '-')}" in help_text or f" {name}=" in help_text else unknown).append(item)
    return ",".join(known), unknown


def views_yaml(prefix: str, ttl: str, eager_globs: tuple[str, ...] = ()) -> str:
    """The inputs view and the run's results view; ``eager_globs``: the results view's
    files written back eagerly (the write policy), the rest close-to-open."""
    policy = f"""
  write:
    eager: [{", ".join(f'"{g}"' for g in eager_globs)}]""" if eager_globs else ""
    return f"""
inputs:
  bucket: {INPUTS}
  object: "*"
  writable: false
  ttl: {ttl}
results:
  bucket: {RESULTS_BUCKET}
  object: "{prefix}*"
  ttl: {ttl}{policy}
"""


# Snakemake's own bookkeeping in the working directory: written back eagerly by the
# write-policy variant (its outputs stay close-to-open)
BOOKKEEPING = (".snakemake/*",)


def delvefs_status(env, mp: Path) -> dict:
    r = subprocess.run([DELVEFS, "status", "--json", str(mp)], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"delvefs status: {r.stderr.strip()}")
    return json.loads(r.stdout)


def log_lines(path: Path, limit: int = 40) -> list[str]:
    """The WARNING, ERROR and traceback lines of a mount's log."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    picked, in_tb = [], False
    for line in lines:
        if " WARNING " in line or " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
            picked.append(line)
            in_tb = line.startswith("Traceback")
        elif in_tb and (line.startswith((" ", "\t")) or re.match(r"^\w+(\.\w+)*(Error|Exception)", line)):
            picked.append(line)
        else:
            in_tb = False
    return picked[:limit]


def rclone_env(env: dict, work: Path) -> dict:
    renv = {k: v for k, v in env.items() if k != "AWS_CA_BUNDLE"}  # rclone 1.60 fails on it over http
    return {**renv, "RCLONE_CONFIG": str(work / "rclone.conf"), "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Minio", "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
            "RCLONE_CONFIG_BENCH_ENDPOINT": env["AWS_ENDPOINT_URL"], "RCLONE_CONFIG_BENCH_REGION": "us-east-1"}


def fuse_unmount(mp: Path) -> None:
    subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True)
    try:
        wait_for(lambda: mounted_fstype(str(mp)) is None, 30, f"{mp} unmounted")
    except RuntimeError:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)


class Bench:
    def __init__(self, args, work: Path, env: dict, client, handler, snakemake: Path, reference: dict,
                 stage_client=None, link=None):
        self.args, self.work, self.env, self.client, self.handler = args, work, env, client, handler
        self.snakemake, self.reference = snakemake, reference
        # the staging's S3 client (through the link at a distance); ``client`` checks and
        # clears on MinIO's own endpoint
        self.stage_client = stage_client or client
        self.link = link
        self.delve = DelveMount(env, work, handler.url)
        self.opts = args.known_opts

    def run(self, variant: str, mode: str, n: int) -> dict:
        """One timed run of ``variant``; its phases (seconds), its check, its notes."""
        what, kind, extra = VARIANTS[variant]
        prefix = f"{mode}/{variant}/{n}/"
        here = self.work / f"{mode}-{variant}-{n}"
        here.mkdir()
        res = {"variant": variant, "mode": mode, "run": n, "prefix": prefix, "problems": [], "log": []}
        try:
            if self.link is not None:   # the distance, proven before each run (DistanceError: not run)
                probe = self.link.probe()
                res["probe_added_ms"] = probe.added_ms
                log(f"{variant} {mode} #{n}: {probe}")
            getattr(self, f"run_{kind}")(variant, mode, here, prefix, extra, res)
        except Exception as exc:  # noqa: BLE001 — recorded; the other runs go on
            res["error"] = str(exc)
            log(f"{variant} {mode} #{n} failed: {exc}")
        finally:
            clear(self.client, RESULTS_BUCKET, prefix)
            shutil.rmtree(here, ignore_errors=True)
        if "total_s" in res:
            log(f"{variant} {mode} #{n}: {res['total_s']:.2f} s (" + ", ".join(
                f"{k[:-2]} {res[k]:.2f}" for k in ("stage_in_s", "workflow_s", "finish_s") if k in res)
                + f"){'; ' + '; '.join(res['problems']) if res['problems'] else ''}")
        return res

    def finish_check(self, prefix: str, res: dict) -> None:
        res["problems"] += check(self.client, prefix, self.reference)

    # -- the baseline and the floor: boto3 in and out around a local (or floor) directory

    def run_local(self, variant, mode, here, prefix, extra, res) -> None:
        self.staged(mode, here, here, prefix, res, parallel=variant == "local-parallel")

    def run_floor(self, variant, mode, here, prefix, extra, res) -> None:
        source = here / "source"
        source.mkdir()
        with cpu_mode(mode):
            t = time.perf_counter()
            floor = PassMount(source, here / "mnt", *extra)
            floor.mount()
            res["mount_s"] = time.perf_counter() - t
        try:
            self.staged(mode, here, floor.mountpoint, prefix, res)
        finally:
            t = time.perf_counter()
            floor.umount()
            res["umount_s"] = time.perf_counter() - t

    def staged(self, mode, here: Path, base: Path, prefix: str, res: dict, parallel: bool = False) -> None:
        inputs, workdir = base / "inputs", base / "results"
        inputs.mkdir()
        t0 = time.perf_counter()
        with cpu_mode(mode):
            (stage_in_parallel if parallel else stage_in)(self.stage_client, inputs)
        t1 = time.perf_counter()
        res["jobs"] = run_workflow(self.snakemake, inputs, workdir, here / "snakemake.log")
        t2 = time.perf_counter()
        with cpu_mode(mode):
            res["uploaded"] = (stage_out_parallel if parallel else stage_out)(self.stage_client, workdir, prefix)
        t3 = time.perf_counter()
        res.update(stage_in_s=t1 - t0, workflow_s=t2 - t1, finish_s=t3 - t2, total_s=t3 - t0)
        self.finish_check(prefix, res)

    # -- DelveFS

    def run_delvefs(self, variant, mode, here, prefix, extra, res) -> None:
        if variant.endswith("-opts"):
            extra = (*extra, "-o", self.opts)
        policy = variant == "delvefs-policy"
        eager = "--eager" in extra or policy  # (then `delvefs sync` in the clock)
        with cpu_mode(mode):
            t, mp = self.delve.mount(views_yaml(prefix, self.args.ttl, BOOKKEEPING if policy else ()),
                                     *extra)
        res["mount_s"] = t
        cache = self.work / f"cache-{self.delve.n}"
        try:
            t0 = time.perf_counter()
            res["jobs"] = run_workflow(self.snakemake, mp / "inputs", mp / "results", here / "snakemake.log")
            t1 = time.perf_counter()
            if eager:
                r = subprocess.run([DELVEFS, "sync", str(mp)], env=self.env, capture_output=True, text=True)
                if r.returncode:
                    res["problems"].append(f"delvefs sync exited {r.returncode}: {r.stderr.strip()[-400:]}")
            res["in_s3"] = wait_in_s3(self.client, mp / "results", prefix)
            t2 = time.perf_counter()
            res.update(workflow_s=t1 - t0, finish_s=t2 - t1, total_s=t2 - t0)
            st = delvefs_status(self.env, mp)
            res["passthrough"] = st.get("passthrough", {}).get("state")
            res["pending"] = sum(st.get("counts", {}).values())
            if res["pending"]:
                res["problems"].append(f"delvefs status: {st['counts']} ("
                                       + ", ".join(f"{f.get('path')} {f.get('state')}" for f in st["files"][:5]) + ")")
            self.finish_check(prefix, res)
        finally:
            t = time.perf_counter()
            r = subprocess.run([DELVEFS, "umount", str(mp)], env=self.env, capture_output=True, text=True)
            if mounted_fstype(str(mp)):
                subprocess.run(["fusermount3", "-u", "-z", str(mp)])
            res["umount_s"] = time.perf_counter() - t
            if r.returncode or r.stderr.strip():
                res["problems"].append(f"delvefs umount ({r.returncode}): {r.stderr.strip()[-400:]}")
            res["log"] = log_lines(cache / "mount.log")
            shutil.rmtree(cache, ignore_errors=True)

    # -- s3fs and rclone: a mount of each bucket

    def mounted_buckets(self, kind: str, mode: str, here: Path, res: dict):
        """Mount the inputs and the results bucket; (inputs, results, unmount)."""
        mps = {b: here / f"{kind}-{b}" for b in (INPUTS, RESULTS_BUCKET)}
        procs = []
        t = time.perf_counter()
        with cpu_mode(mode):
            for bucket, mp in mps.items():
                mp.mkdir()
                if kind == "s3fs":
                    mount_s3fs(self.env, here, bucket, mp)
                else:
                    opts = ["--read-only"] if bucket == INPUTS else ["--vfs-cache-mode", "writes"]
                    procs.append(subprocess.Popen(
                        ["rclone", "mount", f"bench:{bucket}", str(mp), "--cache-dir", str(here / "rclone-cache"),
                         *opts], env=rclone_env(self.env, here), stdout=subprocess.DEVNULL,
                        stderr=open(here / f"rclone-{bucket}.log", "wb")))
                    wait_for(lambda mp=mp: mounted_fstype(str(mp)) is not None, 30, f"rclone mount of {bucket}")
        res["mount_s"] = time.perf_counter() - t

        def unmount():
            t = time.perf_counter()
            for mp in mps.values():
                fuse_unmount(mp)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.terminate()
                    p.wait(30)
            res["umount_s"] = time.perf_counter() - t
        return mps[INPUTS], mps[RESULTS_BUCKET], unmount

    def run_s3fs(self, variant, mode, here, prefix, extra, res) -> None:
        self.run_bucket_mounts("s3fs", mode, here, prefix, res)

    def run_rclone(self, variant, mode, here, prefix, extra, res) -> None:
        self.run_bucket_mounts("rclone", mode, here, prefix, res)

    def run_bucket_mounts(self, kind, mode, here, prefix, res) -> None:
        inputs, results, unmount = self.mounted_buckets(kind, mode, here, res)
        try:
            workdir = results / prefix
            t0 = time.perf_counter()
            res["jobs"] = run_workflow(self.snakemake, inputs, workdir, here / "snakemake.log")
            t1 = time.perf_counter()
            res["in_s3"] = wait_in_s3(self.client, workdir, prefix)
            t2 = time.perf_counter()
            res.update(workflow_s=t1 - t0, finish_s=t2 - t1, total_s=t2 - t0)
            self.finish_check(prefix, res)
        finally:
            unmount()
            if kind == "rclone":
                res["log"] = [line for f in sorted(here.glob("rclone-*.log"))
                              for line in f.read_text(errors="replace").splitlines() if "ERROR" in line][:40]


# --- the tables

FINISH = {"local": "stage-out", "floor": "stage-out", "delvefs": "until in S3", "s3fs": "until in S3",
          "rclone": "until in S3"}


def label(variant: str, opts: str) -> str:
    return VARIANTS[variant][0].format(opts=opts)


def table(runs: list[dict], opts: str) -> str:
    """Every run; ratio = the baseline's median total / the run's total (> 1: faster)."""
    base = [r["total_s"] for r in runs if r["variant"] == "local" and "total_s" in r]
    ref = statistics.median(base) if base else None

    def s(v):
        return "—" if v is None else f"{v:.2f} s"
    lines = ["| variant | run | total (clock) | ratio: baseline / this (> 1: faster than the baseline) | "
             "stage-in | workflow | stage-out / sync / until in S3 | mount + unmount (not clocked) | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        v = r["variant"]
        total = r.get("total_s")
        ratio = "—" if total is None or ref is None else f"{ref / total:.2f}"
        finish = s(r.get("finish_s"))
        if v.startswith("eager") and r.get("finish_s") is not None:
            finish += " (sync)"
        mount = None if r.get("mount_s") is None else r["mount_s"] + (r.get("umount_s") or 0)
        if "error" in r:
            ok = "FAILED: " + r["error"].splitlines()[0][:160]
        elif r["problems"]:
            ok = "WRONG: " + "; ".join(r["problems"])[:200]
        else:
            ok = "ok" + (f", {r['pending']} pending" if "pending" in r else "")
            ok += f", passthrough {r['passthrough']}" if r.get("passthrough") else ""
        lines.append(f"| {label(v, opts)} | {r['run']} | {s(total)} | {ratio} | {s(r.get('stage_in_s'))} | "
                     f"{s(r.get('workflow_s'))} | {finish} | {s(mount)} | {ok} |")
    return "\n".join(lines)


def summary_table(results: dict, modes: list[str], variants: list[str], opts: str) -> str:
    """The median total of each variant and its ratio to the baseline's, per CPU mode (and to
    the parallel staging's, when it ran); after the baseline, the ceiling: its workflow phase
    alone (a file system that cost nothing), and how close each variant gets to it."""
    parallel = "local-parallel" in variants
    per_mode = ["median total", "ratio (÷ baseline)"] + (["÷ parallel staging"] if parallel else []) \
        + ["ceiling ÷ this (1.00: the ceiling)"]
    head = "| variant | " + " | ".join(f"{m}: {c}" for m in modes for c in per_mode) + " |"
    lines = [head, "|---|" + "---|" * (len(per_mode) * len(modes))]

    def median(m: str, v: str, phase: str) -> float | None:
        t = [r[phase] for r in results[m] if r["variant"] == v and phase in r and "error" not in r]
        return statistics.median(t) if t else None

    def ceiling(m: str) -> float | None:
        for v in ("local", "local-parallel"):
            if v in variants and median(m, v, "workflow_s") is not None:
                return median(m, v, "workflow_s")
        return None

    def ratio(a, b) -> str:
        return "—" if a is None or b is None else f"{a / b:.2f}"

    def row(name: str, v: str, phase: str) -> str:
        cells = []
        for m in modes:
            t = median(m, v, phase)
            cells += ["—" if t is None else f"{t:.2f} s", ratio(median(m, "local", "total_s"), t)]
            if parallel:
                cells.append(ratio(median(m, "local-parallel", "total_s"), t))
            cells.append(ratio(ceiling(m), t))
        return f"| {name} | " + " | ".join(cells) + " |"
    for v in variants:
        lines.append(row(label(v, opts), v, "total_s"))
        if v == "local" or (v == "local-parallel" and "local" not in variants):
            lines.append(row(f"ceiling: the {'baseline' if v == 'local' else 'parallel staging'}'s workflow "
                             "alone (a mount that costs nothing)", v, "workflow_s"))
    return "\n".join(lines)


def failures(results: dict, opts: str) -> str:
    out = []
    for m, runs in results.items():
        for r in runs:
            if "error" in r or r["problems"] or r["log"]:
                out.append(f"* {label(r['variant'], opts)}, {m}, run {r['run']}:")
                if "error" in r:
                    out += ["    " + line for line in r["error"].splitlines()]
                out += [f"    {p}" for p in r["problems"]]
                if r["log"]:
                    out.append("    log lines (WARNING/ERROR) of the mount:")
                    out += [f"      {line}" for line in r["log"]]
    return "\n".join(out)


# --- the run

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--reads", type=int, default=8000, help="reads (pairs) per sample")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each variant (per CPU mode)")
    ap.add_argument("--only", help="comma-separated variants: " + ",".join(VARIANTS)
                    + f" (default: {','.join(DEFAULT)}, and the -opts ones with --mount-options)")
    ap.add_argument("--mount-options", default="", metavar="OPT[,OPT...]",
                    help="more DelveFS rows (default and eager mode) with these -o options, "
                         "if `delvefs mount --help` lists them")
    ap.add_argument("--ttl", default="300s", help="the views' ttl (default 300s, as bench_tree)")
    ap.add_argument("--out", metavar="FILE", help="the table's file (default benchmarks/results/pipeline-DATE.txt)")
    ap.add_argument("--distance", type=int, default=None, metavar="MS",
                    help="S3 at MS ms each way: every S3 client through a toxiproxy link "
                         "(delvefs/devtools/distance.py), probed before each run")
    ap.add_argument("--bandwidth", type=float, default=100, metavar="MB",
                    help="with --distance: MB/s per connection each way (default 100; 0: none)")
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        print(f"bench_pipeline: {', '.join(missing)} missing: apt-get install bowtie2 samtools", file=sys.stderr)
        return 2
    args.known_opts, unknown = mount_options_available(args.mount_options)
    variants = [v for v in (args.only.split(",") if args.only else
                            DEFAULT + (["delvefs-opts", "eager-opts"] if args.mount_options else []))]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; known: {', '.join(VARIANTS)}")
    notes = []
    if unknown:
        notes.append(f"not run: -o {','.join(unknown)} (not listed by `delvefs mount --help`)")
    if not args.known_opts:
        variants = [v for v in variants if not v.endswith("-opts")]
    modes = cpu_modes(args.cpus)
    snakemake = snakemake_venv()
    tools = versions(snakemake)
    data = make_inputs(BASE / f"inputs-s{args.samples}-r{args.reads}-seed{SEED}", args.samples, args.reads)
    started = datetime.datetime.now()
    results: dict[str, list[dict]] = {}
    loads = {}
    far: dict = {}   # with --distance: the link

    def at_distance(work: Path, minio_url: str) -> str:
        toxiproxy = stack.enter_context(Toxiproxy(work))
        far["link"] = toxiproxy.link(minio_url, args.distance, args.bandwidth)
        log(f"{far['link'].describe()}; {far['link'].probe()}")
        return far["link"].url

    with contextlib.ExitStack() as stack, \
            services("bench-pipeline-", BASE, at_distance if args.distance is not None else None) \
            as (work, env, client, handler):
        for bucket in (INPUTS, RESULTS_BUCKET):
            ensure_bucket(client, bucket)
            clear(client, bucket)
            wire_notifications(client, bucket, env["DELVEFS_NOTIFY_ARN"])
        with concurrent.futures.ThreadPoolExecutor(TRANSFERS) as pool:
            list(pool.map(lambda rel: client.upload_file(str(data / rel), INPUTS, rel), tree(data)))
        # the reference run: untimed, local (warms the page cache, MinIO and Snakemake's imports)
        ref = work / "reference"
        (ref / "inputs").mkdir(parents=True)
        stage_in(client, ref / "inputs")
        t = time.perf_counter()
        jobs = run_workflow(snakemake, ref / "inputs", ref / "results", work / "reference-snakemake.log")
        log(f"reference run: {jobs} jobs, {time.perf_counter() - t:.1f} s")
        reference = reference_of(ref / "results")
        link = far.get("link")
        stage_client = None
        if link is not None:
            stage_client = make_client(dataclasses.replace(S3Settings.from_env(), endpoint_url=link.url),
                                       max_pool=32)
        bench = Bench(args, work, env, client, handler, snakemake, reference, stage_client, link)
        for mode in modes:
            log(f"--- {PINNING[mode]}")
            runs = results[mode] = []
            load_before = os.getloadavg()
            for n in range(1, args.repeat + 1):
                for variant in variants:
                    runs.append(bench.run(variant, mode, n))
            loads[mode] = (load_before, os.getloadavg())
        clear(client, INPUTS)
    inputs_bytes = sum(tree(data).values())
    header = [
        f"# Pipeline benchmark, {started:%Y-%m-%d %H:%M} ({os.uname().release}, {os.cpu_count()} CPUs), "
        f"MinIO on loopback{f' behind a link of {args.distance} ms each way' if link is not None else ''}",
        *([f"S3 at a distance: {link.describe()}; every S3 client (staging, the DelveFS mounts and the "
            "handler, s3fs, rclone) through it, events and the mounts' handler requests on loopback; "
            "probed before each run (`probe_added_ms` in the JSON)."] if link is not None else []),
        f"{args.samples} samples × {args.reads} reads (every other sample paired-end), "
        f"{inputs_bytes / 2**20:.1f} MiB of inputs; {jobs} jobs, `snakemake --cores 2`; {tools}.",
        f"Outputs: {len(reference)} files, {sum(s for s, _ in reference.values()) / 2**20:.1f} MiB "
        f"(+ .snakemake/ on the mounts). Views' ttl {args.ttl}.",
        "The clock: from the first input read (the baseline: its stage-in) until every output is in S3; "
        "mount and unmount are outside it.",
        "Ratio = the baseline's median total (local disk + boto3 stage-in/out, same CPU mode) / the run's "
        "total: 1.00 is the baseline, > 1 faster than it, < 1 slower. In the medians' table also "
        "÷ parallel staging (the same with the local disk + parallel staging as the denominator) and "
        "ceiling ÷ this (the ceiling: the baseline's workflow phase alone; 1.00 is as fast as a mount "
        "that costs nothing).",
        f"`python -m benchmarks.bench_pipeline {' '.join(argv if argv is not None else sys.argv[1:])}`",
        *notes,
    ]
    text = ["\n".join(header)]
    for mode in modes:
        (l1, _, _), (l2, _, _) = loads[mode]
        text.append(f"## {PINNING[mode]} (1-minute load {l1:.1f} before, {l2:.1f} after)\n\n"
                    + table(results[mode], args.known_opts))
    text.append("## Medians\n\n" + summary_table(results, modes, variants, args.known_opts))
    fails = failures(results, args.known_opts)
    if fails:
        text.append("## Failures, wrong outputs and the mounts' warnings\n\n" + fails)
    out_text = "\n\n".join(text) + "\n"
    RESULTS.mkdir(exist_ok=True)
    out = Path(args.out) if args.out else RESULTS / f"pipeline-{started:%Y-%m-%dT%H%M}.txt"
    out.write_text(out_text)
    out.with_suffix(".json").write_text(json.dumps({"args": {k: v for k, v in vars(args).items()},
                                                    "loads": loads, "runs": results}, indent=2))
    print(out_text)
    log(f"results: {out}")
    bad_runs = [r for runs in results.values() for r in runs if "error" in r or r["problems"]]
    return 1 if bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
