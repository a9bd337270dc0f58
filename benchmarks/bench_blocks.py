"""Huge objects through a mount: random and tail reads, a sequential read, a real BAM region
query and an append, each against what a program would do with boto3 (or the local disk), in
one run on the same MinIO.

    .venv/bin/python -m benchmarks.bench_blocks [--size-mib 1024] [--bam-reads 8000000]
        [--repeat 3] [--only tail,random,sequential,samtools,append] [--save NAME] [--plot PNG]
    .venv/bin/python -m benchmarks.bench_blocks --report benchmarks/results/blocks-1024MiB.json --plot docs/huge-objects.png

Rows (docs/PERFORMANCE.md, "## Huge objects"); every DelveFS row starts from a fresh mount
(``delvefs mount`` with an empty cache directory) and, like its baseline, from a dropped page
cache: as root ``sync`` + ``echo 1 > /proc/sys/vm/drop_caches`` (the page cache, MinIO's included;
dentries stay, so a listed view stays listed in the kernel), otherwise ``posix_fadvise``
DONTNEED on every file of MinIO's data directory and of the local BAM:

  * tail: open + seek + read of the last 4 KiB + close of the SIZE object, the view already
    listed (``os.listdir`` of it and a ``stat`` of the file before the clock starts) —
    against one boto3 ranged GET of the same 4 KiB; median of ``--repeat`` fresh mounts and GETs;
  * tail, not listed: the same without the ``os.listdir`` and ``stat`` (the lookups are timed too);
  * random: open + 50 ``pread``s of 4 KiB at random 4 KiB-aligned offsets + close — against
    50 boto3 ranged GETs of the same offsets in the same order, one thread;
  * sequential: open → last byte in 1 MiB reads — against boto3 ``download_file`` + reading
    the downloaded file;
  * samtools: ``samtools view -c BAM REGION`` of a sorted, indexed BAM of a few hundred MB
    through the mount — against the same command on the same files on local disk; one row
    per region (10 kb each) and the median; the counts must agree;
  * append: ``open(path, "ab")`` + write 1 MiB + close (strict mode: close returns once S3
    has the new object; its size and SHA-256 are checked afterwards) — against boto3
    ``download_file`` + append + ``upload_file`` of a copy of the same object; and, as a
    reference, a server-side copy of the whole object (what a rebuild by UploadPartCopy
    costs this store at least).

The SIZE object's bytes are a deterministic function of their offset, so every read is
checked against what it must return. The BAM is made by the demo's own generator
(delvefs/devtools/demo/genome.py) on a larger genome: reads aligned with bowtie2 (-p 2),
``samtools sort`` + ``samtools index``; it is built once per parameter set and kept in
~/.cache/delvefs/bench-blocks (minutes of alignment), as is MinIO's data directory.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.devtools.demo.genome import make_reference, simulate_reads, write_fasta
from delvefs.devtools.localservices import LocalServices
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import DELVEFS, RESULTS, log, run_parts, wait_for

BASE = Path(os.environ.get("DELVEFS_BENCH_BLOCKS_DIR", Path.home() / ".cache/delvefs/bench-blocks"))
BUCKET = "bench-blocks"
PARTS = ("tail", "random", "sequential", "samtools", "append")
MIB = 1 << 20
PAGE = 4096
RANDOM_READS = 50
APPEND_BYTES = MIB
# the BAM's genome: big enough that a sorted BAM of millions of reads has a realistic index
CHROMOSOMES, CHROMOSOME_LENGTH, READ_LENGTH, GENOME_SEED = 4, 5_000_000, 150, 17
REGION_LENGTH = 10_000
READS_PER_CHUNK = 250_000


# --- the data ---

def block(i: int) -> bytes:
    """MiB number ``i`` of the big object (deterministic, incompressible)."""
    return random.Random(i).randbytes(MIB)


def expected_bytes(offset: int, length: int) -> bytes:
    first, last = offset // MIB, (offset + length - 1) // MIB
    data = b"".join(block(i) for i in range(first, last + 1))
    start = offset - first * MIB
    return data[start:start + length]


def big_key(size_mib: int) -> str:
    return f"big/{size_mib}MiB.bin"


def ensure_big_object(client, work: Path, size_mib: int) -> None:
    key = big_key(size_mib)
    try:
        if client.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == size_mib * MIB:
            return
    except Exception:  # noqa: BLE001 — missing: upload it
        pass
    log(f"uploading the {size_mib} MiB object ...")
    src = work / "big.bin"
    with open(src, "wb") as f:
        for i in range(size_mib):
            f.write(block(i))
    client.upload_file(str(src), BUCKET, key)
    src.unlink()


def bam_dir(reads: int) -> Path:
    return BASE / (f"bam-g{CHROMOSOMES}x{CHROMOSOME_LENGTH}-s{GENOME_SEED}"
                   f"-r{reads}x{READ_LENGTH}")


def regions() -> list[str]:
    """Four 10 kb regions spread over the chromosomes (1-based, inclusive)."""
    out = []
    for i, fraction in enumerate((0.02, 0.5, 0.8, 0.99)):
        start = int(CHROMOSOME_LENGTH * fraction) + 1
        out.append(f"chr{i % CHROMOSOMES + 1}:{start}-{start + REGION_LENGTH - 1}")
    return out


def _reads_chunk(args) -> str:
    reference, seed, count = args
    return simulate_reads(reference, seed=seed, count=count, read_length=READ_LENGTH, tag=f"c{seed}r")


def build_bam(reads: int) -> Path:
    """The sorted, indexed BAM of ``reads`` simulated reads (built once, then cached)."""
    d = bam_dir(reads)
    bam = d / "sim.bam"
    if bam.exists() and bam.with_suffix(".bam.bai").exists():
        return bam
    index_dir = BASE / f"index-g{CHROMOSOMES}x{CHROMOSOME_LENGTH}-s{GENOME_SEED}"
    index = index_dir / "ref"
    reference = make_reference(GENOME_SEED, CHROMOSOMES, CHROMOSOME_LENGTH)
    if not index.with_suffix(".1.bt2").exists():
        log(f"bowtie2-build of {CHROMOSOMES} x {CHROMOSOME_LENGTH:,} bp ...")
        partial = index_dir.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        write_fasta(reference, partial / "ref.fa")
        subprocess.run(["bowtie2-build", "-q", "--threads", "2", str(partial / "ref.fa"), str(partial / "ref")],
                       check=True)
        shutil.rmtree(index_dir, ignore_errors=True)
        partial.rename(index_dir)
    partial = d.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    t = time.perf_counter()
    fastq = partial / "reads.fq"
    chunks = [(reference, GENOME_SEED * 1000 + i, min(READS_PER_CHUNK, reads - i * READS_PER_CHUNK))
              for i in range((reads + READS_PER_CHUNK - 1) // READS_PER_CHUNK)]
    log(f"simulating {reads:,} reads of {READ_LENGTH} bp ...")
    with open(fastq, "w") as f, concurrent.futures.ProcessPoolExecutor(2) as pool:
        for text in pool.map(_reads_chunk, chunks):
            f.write(text)
    log(f"  {time.perf_counter() - t:.0f} s; bowtie2 -p 2 | samtools sort ...")
    align = subprocess.Popen(["bowtie2", "--quiet", "-p", "2", "-x", str(index), "-U", str(fastq)],
                             stdout=subprocess.PIPE)
    sort = subprocess.run(["samtools", "sort", "-@", "1", "-m", "768M", "-T", str(partial / "sort"),
                           "-o", str(partial / "sim.bam"), "-"], stdin=align.stdout)
    align.stdout.close()
    if align.wait() or sort.returncode:
        raise RuntimeError(f"bowtie2 ({align.returncode}) | samtools sort ({sort.returncode}) failed")
    subprocess.run(["samtools", "index", str(partial / "sim.bam")], check=True)
    fastq.unlink()
    shutil.rmtree(d, ignore_errors=True)
    partial.rename(d)
    log(f"  BAM {bam.stat().st_size / MIB:.0f} MiB in {time.perf_counter() - t:.0f} s ({d})")
    return bam


def ensure_bam_objects(client, bam: Path) -> None:
    for local, key in ((bam, "bam/sim.bam"), (bam.with_suffix(".bam.bai"), "bam/sim.bam.bai")):
        try:
            if client.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == local.stat().st_size:
                continue
        except Exception:  # noqa: BLE001 — missing: upload it
            pass
        client.upload_file(str(local), BUCKET, key)


# --- cold caches ---

COLD_DIRS: list[Path] = []  # without drop_caches: the directories whose files leave the page cache
_drop_caches_works: bool | None = None  # found out at the first drop


def drop_caches() -> str:
    """Empty the page cache of everything a timed operation reads (module docstring);
    returns how: "drop_caches" or "posix_fadvise"."""
    global _drop_caches_works
    os.sync()
    if _drop_caches_works is not False:
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
            _drop_caches_works = True
            return "drop_caches"
        except OSError:  # not root, or /proc/sys read-only in a container
            _drop_caches_works = False
    for top in COLD_DIRS:
        for here, _, names in os.walk(top):
            for name in names:
                try:
                    fd = os.open(os.path.join(here, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    return "posix_fadvise"


# --- mounts ---

class Mounts:
    """Fresh DelveFS mounts of one views file, each with an empty cache directory."""

    def __init__(self, env: dict, work: Path, handler_url: str, views_text: str):
        self.env, self.work, self.handler_url = env, work, handler_url
        self.views = work / "views.yaml"
        self.views.write_text(views_text)
        self.n = 0
        self.live: list[Path] = []
        self.logs = work / "mount-logs"

    def fresh(self) -> Path:
        self.n += 1
        mp = self.work / f"mnt-{self.n}"
        mp.mkdir()
        r = subprocess.run([DELVEFS, "mount", str(self.views), str(mp), "--cache-dir",
                            str(self.work / f"cache-{self.n}"), "--handler", self.handler_url],
                           env=self.env, capture_output=True, text=True)
        if r.returncode:
            self._keep_log(mp)
            raise RuntimeError(f"delvefs mount: {r.stderr[-500:]}")
        self.live.append(mp)
        return mp

    def _keep_log(self, mp: Path) -> Path:
        cache = self.work / f"cache-{mp.name.split('-')[1]}"
        self.logs.mkdir(exist_ok=True)
        if (cache / "mount.log").exists():
            shutil.copy(cache / "mount.log", self.logs / f"{mp.name}.log")
        return cache

    def umount(self, mp: Path) -> None:
        r = subprocess.run([DELVEFS, "umount", str(mp)], env=self.env, capture_output=True, text=True)
        if mounted_fstype(str(mp)):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])
        self.live.remove(mp)
        # the cached data goes (a GiB per mount), the mount's log is kept for a failed part
        shutil.rmtree(self._keep_log(mp), ignore_errors=True)
        if r.returncode:
            raise RuntimeError(f"delvefs umount: {r.stderr[-500:]}")

    def close(self) -> None:
        for mp in list(self.live):
            try:
                self.umount(mp)
            except Exception as exc:  # noqa: BLE001 — keep unmounting the others
                log(f"umount {mp}: {exc}")


VIEWS = f"""
big:
  bucket: {BUCKET}
  object: "big/*"
  ttl: 300s
  writable: false
bam:
  bucket: {BUCKET}
  object: "bam/*"
  ttl: 300s
  writable: false
append:
  bucket: {BUCKET}
  object: "append/*"
  ttl: 300s
"""


def fresh_listed(mounts: Mounts, view: str, name: str, size: int) -> Path:
    """A fresh mount whose ``view`` is listed and shows ``name`` with ``size`` bytes."""
    mp = mounts.fresh()
    path = mp / view / name

    def shown():
        return name in os.listdir(mp / view) and path.stat().st_size == size
    wait_for(shown, 60, f"{view}/{name} of {size} bytes in the mount")
    return path


# --- the parts ---

def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def ranged_get(client, key: str, offset: int, length: int) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key,
                             Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()


def bench_tail(client, mounts: Mounts, size_mib: int, repeat: int, res: dict) -> None:
    key, size = big_key(size_mib), size_mib * MIB
    offset = size - PAGE
    want = expected_bytes(offset, PAGE)
    times = []
    for _ in range(repeat):
        drop_caches()
        t = time.perf_counter()
        got = ranged_get(client, key, offset, PAGE)
        times.append(time.perf_counter() - t)
        assert got == want, "boto3 tail read: wrong bytes"
    res["boto3_tail_ms"] = median_ms(times)

    def through_mount(listed: bool) -> float:
        if listed:
            path = fresh_listed(mounts, "big", key.split("/", 1)[1], size)
        else:
            path = mounts.fresh() / "big" / key.split("/", 1)[1]
        try:
            drop_caches()
            t = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                f.seek(offset)
                got = f.read(PAGE)
            took = time.perf_counter() - t
        finally:
            mounts.umount(path.parents[1])
        assert got == want, "tail read through the mount: wrong bytes"
        return took
    res["delvefs_tail_ms"] = median_ms([through_mount(True) for _ in range(repeat)])
    res["delvefs_tail_unlisted_ms"] = median_ms([through_mount(False) for _ in range(repeat)])
    log(f"tail 4 KiB: boto3 {res['boto3_tail_ms']:.1f} ms, delvefs {res['delvefs_tail_ms']:.1f} ms "
        f"(not listed before: {res['delvefs_tail_unlisted_ms']:.1f} ms)")


def random_offsets(size: int, seed: int = 4096) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(size // PAGE) * PAGE for _ in range(RANDOM_READS)]


def bench_random(client, mounts: Mounts, size_mib: int, res: dict) -> None:
    key, size = big_key(size_mib), size_mib * MIB
    offsets = random_offsets(size)
    want = [expected_bytes(o, PAGE) for o in offsets]
    drop_caches()
    t = time.perf_counter()
    got = [ranged_get(client, key, o, PAGE) for o in offsets]
    res["boto3_random_ms"] = (time.perf_counter() - t) * 1000
    assert got == want, "boto3 random reads: wrong bytes"
    path = fresh_listed(mounts, "big", key.split("/", 1)[1], size)
    try:
        drop_caches()
        t = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            got = [os.pread(fd, PAGE, o) for o in offsets]
        finally:
            os.close(fd)
        res["delvefs_random_ms"] = (time.perf_counter() - t) * 1000
    finally:
        mounts.umount(path.parents[1])
    assert got == want, "random reads through the mount: wrong bytes"
    log(f"{RANDOM_READS} random 4 KiB reads: boto3 {res['boto3_random_ms']:.0f} ms, "
        f"delvefs {res['delvefs_random_ms']:.0f} ms")


def read_through(path: Path) -> int:
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MIB):
            total += len(chunk)
    return total


def bench_sequential(client, mounts: Mounts, work: Path, size_mib: int, res: dict) -> None:
    key, size = big_key(size_mib), size_mib * MIB
    target = work / "download.bin"
    drop_caches()
    t = time.perf_counter()
    client.download_file(BUCKET, key, str(target))
    total = read_through(target)
    res["boto3_sequential_s"] = time.perf_counter() - t
    target.unlink()
    assert total == size, total
    path = fresh_listed(mounts, "big", key.split("/", 1)[1], size)
    try:
        drop_caches()
        t = time.perf_counter()
        total = read_through(path)
        res["delvefs_sequential_s"] = time.perf_counter() - t
    finally:
        mounts.umount(path.parents[1])
    assert total == size, total
    log(f"sequential {size_mib} MiB: boto3 download_file + read {res['boto3_sequential_s']:.2f} s, "
        f"delvefs {res['delvefs_sequential_s']:.2f} s")


def samtools_count(bam: Path, region: str) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run(["samtools", "view", "-c", str(bam), region], capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"samtools view -c {bam} {region}: {r.stderr[-300:]}")
    return took, int(r.stdout)


def bench_samtools(mounts: Mounts, bam: Path, res: dict) -> None:
    res["bam_bytes"] = bam.stat().st_size
    rows = []
    for region in regions():
        drop_caches()
        local_s, local_count = samtools_count(bam, region)
        path = fresh_listed(mounts, "bam", bam.name, bam.stat().st_size)
        try:
            drop_caches()
            mount_s, mount_count = samtools_count(path, region)
        finally:
            mounts.umount(path.parents[1])
        if mount_count != local_count:
            raise RuntimeError(f"{region}: {mount_count} reads through the mount, {local_count} locally")
        rows.append({"region": region, "reads": local_count, "local_ms": local_s * 1000,
                     "delvefs_ms": mount_s * 1000})
        log(f"samtools view -c {region}: {local_count} reads, local {local_s * 1000:.0f} ms, "
            f"delvefs {mount_s * 1000:.0f} ms")
    res["samtools"] = rows
    res["local_samtools_ms"] = statistics.median(r["local_ms"] for r in rows)
    res["delvefs_samtools_ms"] = statistics.median(r["delvefs_ms"] for r in rows)


def appended_data() -> bytes:
    return random.Random("append").randbytes(APPEND_BYTES)


def expected_append_sha256(size_mib: int) -> str:
    h = hashlib.sha256()
    for i in range(size_mib):
        h.update(block(i))
    h.update(appended_data())
    return h.hexdigest()


def object_sha256(client, key: str) -> tuple[int, str]:
    h = hashlib.sha256()
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
    size = 0
    while chunk := body.read(8 * MIB):
        h.update(chunk)
        size += len(chunk)
    return size, h.hexdigest()


def append_keys(size_mib: int) -> tuple[str, str]:
    """(the mount's copy, boto3's copy) of the big object, fresh for every run."""
    return f"append/{size_mib}MiB.bin", f"boto3-append/{size_mib}MiB.bin"


def prepare_append(client, size_mib: int, res: dict) -> None:
    """Server-side copies of the big object for the append part (made before the handler
    starts, so its first scan finds them). The first is timed: what rebuilding the object
    from its unchanged bytes costs this store at least (boto3's managed copy: UploadPartCopy
    parts of 8 MiB, 10 at a time)."""
    for key in append_keys(size_mib):
        drop_caches()
        t = time.perf_counter()
        client.copy({"Bucket": BUCKET, "Key": big_key(size_mib)}, BUCKET, key)
        res.setdefault("boto3_server_copy_s", time.perf_counter() - t)


def bench_append(client, mounts: Mounts, work: Path, size_mib: int, res: dict) -> None:
    mount_key, boto_key = append_keys(size_mib)
    size = size_mib * MIB
    data = appended_data()
    want = (size + APPEND_BYTES, expected_append_sha256(size_mib))
    local = work / "append.bin"
    drop_caches()
    t = time.perf_counter()
    client.download_file(BUCKET, boto_key, str(local))
    with open(local, "ab") as f:
        f.write(data)
    client.upload_file(str(local), BUCKET, boto_key)
    res["boto3_append_s"] = time.perf_counter() - t
    local.unlink()
    path = fresh_listed(mounts, "append", mount_key.split("/", 1)[1], size)
    try:
        drop_caches()
        t = time.perf_counter()
        with open(path, "ab") as f:
            f.write(data)
        res["delvefs_append_s"] = time.perf_counter() - t
        # close-to-open: what S3 holds now, before the unmount could upload anything
        got = object_sha256(client, mount_key)
    finally:
        mounts.umount(path.parents[1])
    if got != want:
        raise RuntimeError(f"after the append through the mount S3 holds {got[0]} bytes "
                           f"(sha256 {got[1][:12]}…), expected {want[0]} ({want[1][:12]}…)")
    res["append_verified"] = True
    log(f"append 1 MiB to {size_mib} MiB: boto3 download + append + upload {res['boto3_append_s']:.2f} s, "
        f"delvefs {res['delvefs_append_s']:.3f} s (S3 object checked: size and SHA-256)")


# --- the table and the plot ---

# (label, DelveFS key, baseline key, baseline label, unit, ratio is DelveFS ÷ baseline?, target)
ROWS = [
    ("last 4 KiB, fresh mount, view listed", "delvefs_tail_ms", "boto3_tail_ms", "one boto3 ranged GET",
     "ms", True, 3.0),
    ("last 4 KiB, fresh mount, view not listed", "delvefs_tail_unlisted_ms", "boto3_tail_ms",
     "one boto3 ranged GET", "ms", True, 3.0),
    (f"{RANDOM_READS} random 4 KiB reads, fresh mount", "delvefs_random_ms", "boto3_random_ms",
     f"{RANDOM_READS} boto3 ranged GETs", "ms", True, 2.0),
    ("sequential read, fresh mount", "delvefs_sequential_s", "boto3_sequential_s",
     "boto3 download_file + read", "s", False, 1.0),
    ("`samtools view -c` one region (median), cold", "delvefs_samtools_ms", "local_samtools_ms",
     "same on local disk, cold", "ms", True, 5.0),
    ("append 1 MiB + close", "delvefs_append_s", "boto3_append_s",
     "boto3 download_file + append + upload_file", "s", False, 10.0),
]


def ratio_text(delve: float, base: float, slower_is_ratio: bool, target: float) -> tuple[str, str, str]:
    """(ratio, target, met) in the target's own terms: a time ratio DelveFS ÷ baseline (lower
    is better) or a speed-up baseline ÷ DelveFS (higher is better)."""
    if slower_is_ratio:
        r = delve / base
        return f"{r:.2f}× the time", f"≤ {target:g}×", "yes" if r <= target else "no"
    r = base / delve
    return f"{r:.2f}× as fast", f"≥ {target:g}×", "yes" if r >= target else "no"


def table(res: dict) -> str:
    size = f"{res['size_mib']} MiB object"
    lines = [f"Huge objects ({size}; BAM {res.get('bam_bytes', 0) / MIB:.0f} MiB)", "",
             "| operation | DelveFS | baseline | baseline is | ratio | target | met |",
             "|---|---:|---:|---|---:|---|---|"]
    for label, dk, bk, blabel, unit, slower, target in ROWS:
        d, b = res.get(dk), res.get(bk)
        part = next(p for p in PARTS if p in dk)
        if d is None or b is None:
            error = res.get(f"{part}_error")
            why = f"failed: {error[:80]}" if error else "not run"
            lines.append(f"| {label} | {'—' if d is None else f'{d:.1f} {unit}'} | "
                         f"{'—' if b is None else f'{b:.1f} {unit}'} | {blabel} | {why} | | |")
            continue
        fmt = (lambda v: f"{v:.1f} ms") if unit == "ms" else (lambda v: f"{v:.2f} s")
        ratio, tgt, met = ratio_text(d, b, slower, target)
        lines.append(f"| {label} | {fmt(d)} | {fmt(b)} | {blabel} | {ratio} | {tgt} | {met} |")
    if res.get("boto3_server_copy_s") is not None:
        copy_s, append_s = res["boto3_server_copy_s"], res.get("delvefs_append_s")
        lines.append(f"| reference: server-side copy of the whole object (boto3 `copy`, UploadPartCopy) | | "
                     f"{copy_s:.2f} s | the floor of a rebuild on this store | "
                     f"{'' if append_s is None else f'append = {append_s / copy_s:.2f}× the copy'} | | |")
    for row in res.get("samtools", []):
        lines.append(f"| `samtools view -c {row['region']}` ({row['reads']} reads) | {row['delvefs_ms']:.1f} ms "
                     f"| {row['local_ms']:.1f} ms | local disk, cold | "
                     f"{row['delvefs_ms'] / row['local_ms']:.2f}× the time | | |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in ROWS if res.get(r[1]) is not None and res.get(r[2]) is not None]
    if not rows:
        log("no row has both sides: no plot")
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    x = range(len(rows))
    to_ms = [1 if r[4] == "ms" else 1000 for r in rows]
    delve = [res[r[1]] * k for r, k in zip(rows, to_ms)]
    base = [res[r[2]] * k for r, k in zip(rows, to_ms)]
    ax.bar([i - 0.2 for i in x], base, 0.4, label="baseline (boto3 / local disk)", color="tab:gray")
    ax.bar([i + 0.2 for i in x], delve, 0.4, label="DelveFS", color="tab:blue")
    for i, r in enumerate(rows):
        ratio, target, _ = ratio_text(res[r[1]], res[r[2]], r[5], r[6])
        ax.text(i, max(delve[i], base[i]) * 1.3, f"{ratio}\n(target {target})", ha="center", fontsize=7)
    labels = ["tail 4 KiB\nlisted", "tail 4 KiB\nnot listed", f"{RANDOM_READS} random\n4 KiB",
              "sequential\nread", f"samtools region\n(median of {len(regions())})", "append\n1 MiB"]
    ax.set_xticks(list(x), [labels[ROWS.index(r)] for r in rows])
    ax.set_yscale("log")
    ax.set_ylim(top=max(delve + base) * 8)
    ax.set_ylabel("milliseconds (log scale)")
    ax.set_title(f"{res['size_mib']} MiB object, BAM {res.get('bam_bytes', 0) / MIB:.0f} MiB, "
                 "fresh mounts, cold page cache, MinIO on loopback")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


# --- main ---

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="size of the big object (default 1024)")
    ap.add_argument("--bam-reads", type=int, default=8_000_000,
                    help="simulated reads in the BAM (default 8,000,000: a sorted BAM of ~290 MB)")
    ap.add_argument("--repeat", type=int, default=3, help="fresh mounts per tail-read row (median)")
    ap.add_argument("--only", help="comma-separated parts: " + ",".join(PARTS))
    ap.add_argument("--save", metavar="NAME", help="results/blocks-NAME.json (default: the size)")
    ap.add_argument("--plot", metavar="PNG", help="the bar chart (default: next to the JSON)")
    ap.add_argument("--build-bam-only", action="store_true", help="build (or find) the cached BAM and stop")
    ap.add_argument("--report", metavar="JSON", help="only print the table and draw the plot of an earlier run")
    args = ap.parse_args(argv)
    if args.report:
        res = json.loads(Path(args.report).read_text())
        print(table(res))
        plot(res, Path(args.plot) if args.plot else Path(args.report).with_suffix(".png"))
        return 0
    only = args.only.split(",") if args.only else list(PARTS)
    unknown = set(only) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}: choose from {','.join(PARTS)}")
    # SIGTERM (a `timeout`) tears down like Ctrl-C: no mount or service stays behind
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    BASE.mkdir(parents=True, exist_ok=True)
    bam = build_bam(args.bam_reads) if "samtools" in only or args.build_bam_only else None
    if args.build_bam_only:
        return 0
    res: dict = {"size_mib": args.size_mib, "bam_reads": args.bam_reads, "repeat": args.repeat,
                 "page_cache_dropped_by": drop_caches()}
    with LocalServices(BASE / "services") as svc, tempfile.TemporaryDirectory(prefix="bench-blocks-") as d:
        work = Path(d)
        env = {**os.environ, **svc.env(), "DELVEFS_STATE_HOME": str(work / "state"),
               "DELVEFS_HANDLER_TOKEN": "bench"}
        os.environ.update(svc.env())
        client = make_client(max_pool=16)
        ensure_bucket(client, BUCKET)
        wire_notifications(client, BUCKET, svc.minio.notify_arn)
        COLD_DIRS[:] = [svc.minio.data_dir] + ([bam.parent] if bam is not None else [])
        ensure_big_object(client, work, args.size_mib)
        if bam is not None:
            ensure_bam_objects(client, bam)
        if "append" in only:
            prepare_append(client, args.size_mib, res)
        from eventhandler.devtools import HandlerProcess
        handler = HandlerProcess(svc.env(), work / "handler-state", token="bench")
        handler.start()
        mounts = Mounts(env, work, handler.url, VIEWS)
        try:
            parts = [("tail", lambda: bench_tail(client, mounts, args.size_mib, args.repeat, res)),
                     ("random", lambda: bench_random(client, mounts, args.size_mib, res)),
                     ("sequential", lambda: bench_sequential(client, mounts, work, args.size_mib, res)),
                     ("samtools", lambda: bench_samtools(mounts, bam, res)),
                     ("append", lambda: bench_append(client, mounts, work, args.size_mib, res))]
            run_parts(parts, ",".join(only), res)
        finally:
            mounts.close()
            handler.close()
            name = args.save or f"{args.size_mib}MiB"
            if any(k.endswith("_error") for k in res):
                kept = RESULTS / f"blocks-{name}-logs"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(mounts.logs, kept) if mounts.logs.exists() else kept.mkdir(parents=True)
                shutil.copy(handler.log_path, kept / "handler.log")
                log(f"a part failed: the mounts' and the handler's logs are in {kept}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"blocks-{name}.json"
    out.write_text(json.dumps(res, indent=2))
    log(f"results: {out}")
    print(table(res))
    plot(res, Path(args.plot) if args.plot else out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
