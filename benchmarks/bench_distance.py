"""Mount operations at a distance: S3 behind toxiproxy (delvefs/devtools/distance.py) at
0, 5 and 15 ms each way, DelveFS against boto3, s3fs-fuse and rclone mount on the same
MinIO through the same link, and the floor — pinned to CPU 0 and unpinned (``--cpus``),
one table per distance and CPU mode, then one across the distances.

    .venv/bin/python -m benchmarks.bench_distance [--distances 0,5,15] [--bandwidth 100]
        [--objects 1000] [--scale] [--big-mib 256] [--big-gib] [--tree-files 2000]
        [--files 50] [--reads 50] [--only delvefs,floor,boto3,s3fs,rclone]
        [--ops ls,first-byte,sequential,random,create,untar,rm] [--cpus both|pinned|unpinned]
        [--no-count]

The setting: MinIO and RabbitMQ on loopback as everywhere; per distance one toxiproxy link
in front of MinIO (a bandwidth toxic of ``--bandwidth`` MB/s per connection each way, then
a latency toxic of the distance each way: docs/PERFORMANCE.md, "At a distance"), probed
before each CPU mode's run (20 HEADs through the link against 20 straight: the run stops
when the added round trip is off by more than max(2 ms, 25 %)). Every S3 client goes
through the link: the DelveFS mounts, the handler's S3 endpoint (its first scan of a
bucket, and its checks of a mount's proofs: it shares the mounts' endpoint, as it must),
boto3, s3fs and rclone; MinIO's events to RabbitMQ and the mounts' requests to the handler
stay on loopback.

Counting: toxiproxy keeps no request log, so each measured client (DelveFS, boto3, s3fs,
rclone) reaches the link through a counting proxy of its own (faultproxy.py, in a child
process: ``distance.CountingProxy``) that logs its HTTP requests with their start and end;
every client pays the same extra hop (~0.1 ms a request, and CPU for the bytes of the big
reads: ``--no-count`` leaves it out, and the counts with it). Per operation the tables give
DelveFS's requests by method, the round trips that followed one another (the longest chain
of requests each started after the one before had its answer: ``distance.critical_path``)
and what the distance added to the clock in round trips ((time at d − time at 0) ÷ 2d).

Operations (each on a fresh mount with an empty cache unless said; the same for every
system, its form for boto3 in the row's name):
  * ``ls``: mount + ``ls -l`` of a view of ``--objects`` 100-byte objects (and of 100,000
    with ``--scale``); boto3: a paginated ListObjectsV2 (pages follow one another);
  * ``first-byte``: open + read of 1 byte of ``--files`` small files of a listed view, one
    after the other (median); boto3: GetObject + read of 1 byte;
  * ``sequential``: read of a ``--big-mib`` object (``--big-gib``: 1,024 MiB) with 1 MiB
    reads; boto3: s3transfer's ``download_file`` with 16 ranged GETs at a time of 8 MiB,
    then a read of the file;
  * ``random``: ``--reads`` reads of 32 KiB at seeded random offsets of the big object, one
    after the other; boto3: a ranged GetObject each;
  * ``create``: create + write 100 bytes + close of ``--files`` new files; DelveFS default
    mode (each close uploads) and eager (close returns at once) + ``delvefs sync``; boto3:
    PutObject of the same files, 16 at a time;
  * ``untar``: ``tar -x`` of ``--tree-files`` files of the Python standard library
    (benchmarks/bench_tree.py's tar) into an eager view + ``delvefs sync``; boto3:
    PutObject of the same files, 16 at a time; s3fs until ``tar`` exits (it uploads at
    close); rclone (``--vfs-cache-mode writes``) until S3 has every file;
  * ``rm``: ``rm -rf`` of that tree + ``delvefs sync``; boto3: DeleteObject of each key, 16
    at a time (as ``aws s3 rm --recursive``); rclone until S3 has none.
The floor (benchmarks/floorfs.py: the same names and sizes in memory, zeros for bytes,
with the writeback cache for create, untar and rm as eager mounts) has no S3 and no
distance: it runs once per CPU mode, its row repeated in every distance's table.
MinIO's populated data is kept in ~/.cache/delvefs/bench-distance
(``DELVEFS_BENCH_DISTANCE_DIR``). The tables go to stdout, the numbers to
benchmarks/results/distance-DATE.json.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import datetime
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.devtools.distance import CountingProxy, Toxiproxy, by_method, critical_path
from delvefs.devtools.localservices import LocalServices
from delvefs.shared.config import S3Settings
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import DELVEFS, RESULTS, drop_caches, log, wait_for
from .bench_pipeline import rclone_env
from .bench_tree import source_tar
from .mounting import CPU_MODES, FloorMount, add_cpu_option, cpu_mode, cpu_modes, mount_s3fs

BASE = Path(os.environ.get("DELVEFS_BENCH_DISTANCE_DIR", Path.home() / ".cache/delvefs/bench-distance"))
MANY, BIG, WORK = "dist-many", "dist-big", "dist-work"
SYSTEMS = ("delvefs", "floor", "boto3", "s3fs", "rclone")
COUNTED = ("delvefs", "boto3", "s3fs", "rclone")
OPS = ("ls", "first-byte", "sequential", "random", "create", "untar", "rm")
TRANSFERS = 16          # boto3's requests at a time where the operation allows
READ_SIZE = 32 << 10    # the random reads
SEED = 20261201


# --- the data

def populate(client, counts: list[int], big_mib: int) -> None:
    """``n{N}/obj-XXXXXX.dat`` (100 bytes) for each N of ``counts`` in MANY, a big object of
    random bytes in BIG, WORK empty (built once, kept in BASE)."""
    ensure_bucket(client, MANY)
    for n in counts:
        have = {o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=MANY, Prefix=f"n{n}/")
                for o in page.get("Contents", [])}
        missing = [f"n{n}/obj-{i:06d}.dat" for i in range(n) if f"n{n}/obj-{i:06d}.dat" not in have]
        if missing:
            log(f"populating {len(missing)} objects of n{n}/ ...")
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                list(pool.map(lambda k: client.put_object(Bucket=MANY, Key=k, Body=b"x" * 100), missing,
                              chunksize=256))
    ensure_bucket(client, BIG)
    try:
        client.head_object(Bucket=BIG, Key=big_key(big_mib))
    except Exception:  # noqa: BLE001 — not there yet
        log(f"uploading a {big_mib} MiB object ...")
        with tempfile.NamedTemporaryFile() as f:
            chunk = os.urandom(1 << 20)
            for _ in range(big_mib):
                f.write(chunk)
            f.flush()
            client.upload_file(f.name, BIG, big_key(big_mib))
    ensure_bucket(client, WORK)
    clear(client, WORK)


def big_key(mib: int) -> str:
    return f"big/{mib}MiB.bin"


def keys_of(client, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", []) if not o["Key"].endswith("/")]


def clear(client, bucket: str, prefix: str = "") -> None:
    keys = [{"Key": k} for k in keys_of(client, bucket, prefix)]
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})


def tree_members(tar: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(tar) as t:
        return [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isfile()]


def offsets(size: int, count: int) -> list[int]:
    rng = random.Random(SEED)
    return [rng.randrange(0, (size - READ_SIZE) // 4096) * 4096 for _ in range(count)]


# --- what each operation does in a directory (the same for every file system)

def ls_l(path: Path) -> int:
    r = subprocess.run(["ls", "-l", str(path)], capture_output=True)
    if r.returncode:
        raise RuntimeError(f"ls -l {path}: {r.stderr.decode()[-300:]}")
    return r.stdout.count(b"\n") - 1


def first_bytes(paths: list[Path], each) -> list[float]:
    """Seconds of open + read(1) + close of each path (``each()`` after each one)."""
    times = []
    for p in paths:
        t = time.perf_counter()
        with open(p, "rb", buffering=0) as f:
            if len(f.read(1)) != 1:
                raise RuntimeError(f"{p}: no first byte")
        times.append(time.perf_counter() - t)
        each()
    return times


def read_all(path: Path) -> int:
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
    return total


def read_at(path: Path, where: list[int]) -> None:
    with open(path, "rb", buffering=0) as f:
        for off in where:
            if len(os.pread(f.fileno(), READ_SIZE, off)) != READ_SIZE:
                raise RuntimeError(f"{path}: short read at {off}")


def create_files(directory: Path, count: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open(directory / f"f-{i:05d}.txt", "wb") as f:
            f.write(b"y" * 100)


def run(*cmd: str, env=None) -> None:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-400:]}")


# --- the systems

@dataclasses.dataclass
class Setting:
    """One distance: its link, the counting proxy of each client, the handler."""

    distance: int
    link: object
    urls: dict            # client -> the S3 URL it uses
    counters: dict        # client -> CountingProxy (empty with --no-count)
    handler: object
    env: dict             # the mounts' environment (AWS_ENDPOINT_URL: DelveFS's URL)
    work: Path

    def take(self, who: str) -> list:
        c = self.counters.get(who)
        return c.take() if c else []


class Measure:
    """Times and requests of one system's operations at one distance, into ``res``."""

    def __init__(self, setting: Setting, who: str, res: dict):
        self.s, self.who, self.res = setting, who, res

    @contextlib.contextmanager
    def op(self, name: str):
        """Time the block as operation ``name``; the requests the system made meanwhile."""
        self.start()
        yield
        self.stop(name)

    def start(self) -> None:
        """An operation starts (``op``; or ``start`` and ``stop`` where the operation ends
        inside a block whose end it does not include, e.g. a mount's)."""
        self.s.take(self.who)
        self.t = time.perf_counter()

    def stop(self, name: str) -> None:
        took = time.perf_counter() - self.t
        logged = self.s.take(self.who)
        entry = self.res.setdefault(name, {})
        entry[self.who] = {"s": took, "requests": len(logged), "by_method": by_method(logged),
                           "chain": critical_path(logged)} if self.s.counters else {"s": took}
        log(f"  d={self.s.distance} {self.who} {name}: {took:.3f} s"
            + (f", {len(logged)} requests ({by_method(logged)}), chain {critical_path(logged)}"
               if self.s.counters else ""))

    def note(self, name: str, key: str, value) -> None:
        self.res.setdefault(name, {}).setdefault(self.who, {})[key] = value


def views_yaml(objects: list[int]) -> str:
    out = "".join(f"n{n}:\n  bucket: {MANY}\n  object: \"n{n}/*\"\n  ttl: 300s\n" for n in objects)
    return out + f"big:\n  bucket: {BIG}\n  object: \"big/*\"\n  ttl: 300s\nwork:\n  bucket: {WORK}\n" \
                 f"  object: \"work/*\"\n  ttl: 300s\n"


class Delve:
    def __init__(self, s: Setting, args):
        self.s, self.args, self.n = s, args, 0
        self.views = s.work / "distance-views.yaml"
        self.views.write_text(views_yaml(args.object_counts))

    @contextlib.contextmanager
    def mounted(self, *extra: str):
        self.n += 1
        mp = self.s.work / f"delvefs-{self.n}"
        mp.mkdir()
        r = subprocess.run([DELVEFS, "mount", str(self.views), str(mp), "--cache-dir",
                            str(self.s.work / f"cache-{self.n}"), "--handler", self.s.handler.url, *extra],
                           env=self.s.env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"delvefs mount: {r.stderr[-600:]}")
        try:
            yield mp
        finally:
            subprocess.run([DELVEFS, "umount", str(mp)], env=self.s.env, capture_output=True)
            if mounted_fstype(str(mp)):
                subprocess.run(["fusermount3", "-u", "-z", str(mp)])
            shutil.rmtree(self.s.work / f"cache-{self.n}", ignore_errors=True)

    def sync(self, mp: Path) -> None:
        run(DELVEFS, "sync", "--no-wait-handler", str(mp), env=self.s.env)


def bench_delvefs(s: Setting, args, mode: str, res: dict, tar_files) -> None:
    m, d = Measure(s, "delvefs", res), Delve(s, args)
    with d.mounted() as mp:      # untimed: the handler's first scan of each view's bucket
        for n in args.object_counts:
            ls_l(mp / f"n{n}")
    for n in args.object_counts:
        if "ls" in args.op_list:
            drop_caches()
            m.start()
            with d.mounted() as mp:      # the clock: mount + ls -l, not the unmount
                if ls_l(mp / f"n{n}") != n:
                    raise RuntimeError(f"ls -l of n{n}: not {n} entries")
                m.stop(f"ls-{n}")
    if "first-byte" in args.op_list:
        with d.mounted() as mp:
            n = args.object_counts[0]
            ls_l(mp / f"n{n}")
            paths = [mp / f"n{n}" / f"obj-{i:06d}.dat" for i in range(0, n, max(1, n // args.files))][:args.files]
            each = []
            times = first_bytes(paths, lambda: each.append(s.take("delvefs")))
            record_each(m, "first-byte", times, each, bool(s.counters))
    size = args.big_mib << 20
    if "sequential" in args.op_list:
        drop_caches()
        with d.mounted() as mp:
            with m.op("sequential"):
                if read_all(mp / "big" / f"{args.big_mib}MiB.bin") != size:
                    raise RuntimeError("short big read")
    if "random" in args.op_list:
        with d.mounted() as mp:
            path = mp / "big" / f"{args.big_mib}MiB.bin"
            os.stat(path)
            with m.op("random"):
                read_at(path, offsets(size, args.reads))
    if "create" in args.op_list:
        with d.mounted() as mp:
            with m.op("create-default"):
                create_files(mp / "work" / f"create-default-{mode}-{s.distance}", args.files)
        with d.mounted("--eager") as mp:
            with m.op("create-eager"):
                create_files(mp / "work" / f"create-eager-{mode}-{s.distance}", args.files)
            with m.op("create-eager-sync"):
                d.sync(mp)
        fold(res, "create-eager", "create-eager-sync", "create-eager+sync", "delvefs")
    if "untar" in args.op_list or "rm" in args.op_list:
        prefix = f"work/tree-{mode}-{s.distance}/"
        with d.mounted("--eager") as mp:
            target = mp / prefix.rstrip("/")
            target.mkdir()
            with m.op("untar"):
                run("tar", "-x", "-f", str(args.tar), "-C", str(target))
            with m.op("untar-sync"):
                d.sync(mp)
            fold(res, "untar", "untar-sync", "untar+sync", "delvefs")
            if "rm" in args.op_list:
                with m.op("rm"):
                    run("rm", "-rf", str(target / "stdlib"))
                with m.op("rm-sync"):
                    d.sync(mp)
                fold(res, "rm", "rm-sync", "rm+sync", "delvefs")


def fold(res: dict, first: str, second: str, name: str, who: str) -> None:
    """Operation ``name`` = ``first`` then ``second`` (times and requests added)."""
    a, b = res.get(first, {}).get(who), res.get(second, {}).get(who)
    if a is None or b is None:
        return
    both = {"s": a["s"] + b["s"]}
    if "requests" in a:
        both.update(requests=a["requests"] + b["requests"], chain=a["chain"] + b["chain"],
                    by_method=f"{a['by_method']}; then {b['by_method']}")
    res.setdefault(name, {})[who] = both


def record_each(m: Measure, name: str, times: list[float], each: list, counted: bool) -> None:
    """A per-file operation: the median time, and the requests and chain of a median file."""
    entry = {"s": statistics.median(times), "files": len(times)}
    if counted:
        entry.update(requests=statistics.median(len(e) for e in each),
                     chain=statistics.median(critical_path(e) for e in each),
                     by_method=by_method(each[len(each) // 2]))
    m.res.setdefault(name, {})[m.who] = entry
    log(f"  d={m.s.distance} {m.who} {name}: median {entry['s'] * 1e3:.1f} ms of {len(times)}"
        + (f", {entry['requests']} requests ({entry['by_method']})" if counted else ""))


def bench_boto3(s: Setting, args, mode: str, res: dict, tar_files) -> None:
    from boto3.s3.transfer import TransferConfig
    m = Measure(s, "boto3", res)
    settings = dataclasses.replace(S3Settings.from_env(), endpoint_url=s.urls["boto3"])
    client = make_client(settings, max_pool=32)
    client.list_buckets()        # the connection pool's first connection, not timed
    pool = concurrent.futures.ThreadPoolExecutor(TRANSFERS)
    try:
        for n in args.object_counts:
            if "ls" in args.op_list:
                with m.op(f"ls-{n}"):
                    if len(keys_of(client, MANY, f"n{n}/")) != n:
                        raise RuntimeError(f"listing of n{n}/: not {n} keys")
        if "first-byte" in args.op_list:
            n = args.object_counts[0]
            keys = [f"n{n}/obj-{i:06d}.dat" for i in range(0, n, max(1, n // args.files))][:args.files]
            times, each = [], []
            for k in keys:
                t = time.perf_counter()
                if len(client.get_object(Bucket=MANY, Key=k)["Body"].read(1)) != 1:
                    raise RuntimeError(f"{k}: no first byte")
                times.append(time.perf_counter() - t)
                each.append(s.take("boto3"))
            record_each(m, "first-byte", times, each, bool(s.counters))
        size = args.big_mib << 20
        if "sequential" in args.op_list:
            target = s.work / "boto3-big.bin"
            drop_caches()
            with m.op("sequential"):
                client.download_file(BIG, big_key(args.big_mib), str(target),
                                     Config=TransferConfig(multipart_chunksize=8 << 20, max_concurrency=TRANSFERS))
                read_all(target)
            target.unlink()
        if "random" in args.op_list:
            with m.op("random"):
                for off in offsets(size, args.reads):
                    body = client.get_object(Bucket=BIG, Key=big_key(args.big_mib),
                                             Range=f"bytes={off}-{off + READ_SIZE - 1}")["Body"].read()
                    if len(body) != READ_SIZE:
                        raise RuntimeError("short ranged GET")
        if "create" in args.op_list:
            keys = [f"work/create-boto3-{mode}-{s.distance}/f-{i:05d}.txt" for i in range(args.files)]
            with m.op("create-default"):
                list(pool.map(lambda k: client.put_object(Bucket=WORK, Key=k, Body=b"y" * 100), keys))
        if "untar" in args.op_list or "rm" in args.op_list:
            prefix = f"work/tree-boto3-{mode}-{s.distance}/"
            with m.op("untar+sync"):
                list(pool.map(lambda kv: client.put_object(Bucket=WORK, Key=prefix + kv[0], Body=kv[1]),
                              tar_files))
            if "rm" in args.op_list:
                with m.op("rm+sync"):
                    list(pool.map(lambda k: client.delete_object(Bucket=WORK, Key=k), keys_of(client, WORK, prefix)))
    finally:
        pool.shutdown()


class BucketMount:
    """s3fs-fuse or rclone mount of one bucket through the system's URL."""

    def __init__(self, s: Setting, kind: str):
        self.s, self.kind, self.n = s, kind, 0

    @contextlib.contextmanager
    def mounted(self, bucket: str, writable: bool = False):
        self.n += 1
        mp = self.s.work / f"{self.kind}-{self.n}"
        mp.mkdir()
        env = {**self.s.env, "AWS_ENDPOINT_URL": self.s.urls[self.kind]}
        proc = None
        if self.kind == "s3fs":
            mount_s3fs(env, self.s.work, bucket, mp)
        else:
            opts = ["--vfs-cache-mode", "writes"] if writable else ["--read-only"]
            proc = subprocess.Popen(["rclone", "mount", f"bench:{bucket}", str(mp), "--cache-dir",
                                     str(self.s.work / f"rclone-cache-{self.n}"), *opts],
                                    env=rclone_env(env, self.s.work), stdout=subprocess.DEVNULL,
                                    stderr=open(self.s.work / f"rclone-{self.n}.log", "wb"))
            wait_for(lambda: mounted_fstype(str(mp)) is not None, 30, f"rclone mount of {bucket}")
        try:
            yield mp
        finally:
            subprocess.run(["fusermount3", "-u", str(mp)], capture_output=True)
            if mounted_fstype(str(mp)):
                subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
            if proc is not None:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.terminate()
                    proc.wait(30)


def wait_keys(client, prefix: str, count: int, timeout: float = 600) -> None:
    """Until WORK has ``count`` objects under ``prefix`` (rclone uploads after close)."""
    deadline = time.monotonic() + timeout
    while len(keys_of(client, WORK, prefix)) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{prefix}: not {count} objects after {timeout:.0f} s")
        time.sleep(0.2)


def bench_bucket_mount(kind: str, s: Setting, args, mode: str, res: dict, tar_files, direct) -> None:
    m, b = Measure(s, kind, res), BucketMount(s, kind)
    for n in args.object_counts:
        if "ls" in args.op_list:
            drop_caches()
            m.start()
            with b.mounted(MANY) as mp:
                if ls_l(mp / f"n{n}") != n:
                    raise RuntimeError(f"{kind}: ls -l of n{n}: not {n} entries")
                m.stop(f"ls-{n}")
    if "first-byte" in args.op_list:
        with b.mounted(MANY) as mp:
            n = args.object_counts[0]
            ls_l(mp / f"n{n}")
            paths = [mp / f"n{n}" / f"obj-{i:06d}.dat" for i in range(0, n, max(1, n // args.files))][:args.files]
            each = []
            times = first_bytes(paths, lambda: each.append(s.take(kind)))
            record_each(m, "first-byte", times, each, bool(s.counters))
    size = args.big_mib << 20
    if "sequential" in args.op_list:
        drop_caches()
        with b.mounted(BIG) as mp:
            with m.op("sequential"):
                if read_all(mp / "big" / f"{args.big_mib}MiB.bin") != size:
                    raise RuntimeError(f"{kind}: short big read")
    if "random" in args.op_list:
        with b.mounted(BIG) as mp:
            path = mp / "big" / f"{args.big_mib}MiB.bin"
            os.stat(path)
            with m.op("random"):
                read_at(path, offsets(size, args.reads))
    wait = kind == "rclone"   # rclone uploads after close (its write-back): until S3 has them
    if "create" in args.op_list:
        with b.mounted(WORK, writable=True) as mp:
            sub = f"work/create-{kind}-{mode}-{s.distance}"
            with m.op("create-default"):
                create_files(mp / sub, args.files)
                if wait:
                    wait_keys(direct, sub + "/", args.files)
    if "untar" in args.op_list or "rm" in args.op_list:
        prefix = f"work/tree-{kind}-{mode}-{s.distance}"
        with b.mounted(WORK, writable=True) as mp:
            (mp / prefix).mkdir(parents=True, exist_ok=True)   # (s3fs: EEXIST for a new one)
            with m.op("untar+sync"):
                run("tar", "-x", "-f", str(args.tar), "-C", str(mp / prefix))
                if wait:
                    wait_keys(direct, prefix + "/", len(tar_files))
            if "rm" in args.op_list:
                with m.op("rm+sync"):
                    run("rm", "-rf", str(mp / prefix / "stdlib"))
                    if wait:
                        wait_keys(direct, prefix + "/", 0)


def bench_floor(work: Path, args, res: dict) -> None:
    """The same operations on the floor (no S3, no distance)."""
    def op(name, fn):
        t = time.perf_counter()
        fn()
        res.setdefault(name, {})["floor"] = {"s": time.perf_counter() - t}
    files = [("--files", f"n{n}", "obj-{:06d}.dat", str(n), "100") for n in args.object_counts]
    big = ("--files", "big", f"{args.big_mib}MiB.bin", "1", str(args.big_mib << 20))
    for n, opts in zip(args.object_counts, files):
        if "ls" in args.op_list:
            drop_caches()

            t = time.perf_counter()
            with FloorMount(work / "floor-ls", *opts) as mp:
                ls_l(mp / f"n{n}")
                res.setdefault(f"ls-{n}", {})["floor"] = {"s": time.perf_counter() - t}
    if "first-byte" in args.op_list:
        n = args.object_counts[0]
        with FloorMount(work / "floor-fb", *files[0]) as mp:
            ls_l(mp / f"n{n}")
            paths = [mp / f"n{n}" / f"obj-{i:06d}.dat" for i in range(0, n, max(1, n // args.files))][:args.files]
            res.setdefault("first-byte", {})["floor"] = {"s": statistics.median(first_bytes(paths, lambda: None))}
    if "sequential" in args.op_list:
        with FloorMount(work / "floor-big", *big) as mp:
            op("sequential", lambda: read_all(mp / "big" / f"{args.big_mib}MiB.bin"))
    if "random" in args.op_list:
        with FloorMount(work / "floor-big", *big) as mp:
            op("random", lambda: read_at(mp / "big" / f"{args.big_mib}MiB.bin",
                                         offsets(args.big_mib << 20, args.reads)))
    if "create" in args.op_list:
        with FloorMount(work / "floor-create") as mp:
            op("create-default", lambda: create_files(mp / "default", args.files))
        with FloorMount(work / "floor-create-wb", "--writeback") as mp:
            op("create-eager", lambda: create_files(mp / "eager", args.files))
            res["create-eager+sync"] = {"floor": res["create-eager"]["floor"]}
    if "untar" in args.op_list or "rm" in args.op_list:
        with FloorMount(work / "floor-tree", "--writeback") as mp:
            (mp / "tree").mkdir()
            op("untar+sync", lambda: run("tar", "-x", "-f", str(args.tar), "-C", str(mp / "tree")))
            res["untar"] = {"floor": res["untar+sync"]["floor"]}
            if "rm" in args.op_list:
                op("rm+sync", lambda: run("rm", "-rf", str(mp / "tree" / "stdlib")))
                res["rm"] = {"floor": res["rm+sync"]["floor"]}


# --- the tables

def rows_of(args) -> list[tuple[str, str, str]]:
    """(key, what DelveFS does, what boto3 does) of each operation measured."""
    out = []
    ops = args.op_list
    for n in args.object_counts:
        if "ls" in ops:
            out.append((f"ls-{n}", f"mount + `ls -l` of {n:,} objects", "ListObjectsV2 pages"))
    if "first-byte" in ops:
        out.append(("first-byte", "first byte of an uncached file (median)", "GetObject + 1 byte"))
    if "sequential" in ops:
        out.append(("sequential", f"{args.big_mib} MiB sequential read", "download_file, 16 × 8 MiB ranges, + read"))
    if "random" in ops:
        out.append(("random", f"{args.reads} random 32 KiB reads", "ranged GetObject each"))
    if "create" in ops:
        out += [("create-default", f"create + close of {args.files} files, default mode", "PutObject, 16 at a time"),
                ("create-eager", "the same, eager (close only)", "—"),
                ("create-eager+sync", "the same, eager + `delvefs sync`", "PutObject, 16 at a time")]
    if "untar" in ops:
        out += [("untar", f"untar of {args.tree_count:,} files, eager", "—"),
                ("untar+sync", "untar + `delvefs sync`", "PutObject, 16 at a time")]
    if "rm" in ops:
        out += [("rm", "`rm -rf`, eager", "—"), ("rm+sync", "`rm -rf` + `delvefs sync`", "DeleteObject, 16 at a time")]
    return out


def boto3_key(key: str) -> str:
    return "create-default" if key == "create-eager+sync" else key


def fmt(v) -> str:
    if v is None:
        return "—"
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"


def cell(res: dict, key: str, who: str):
    return res.get(key, {}).get(who, {}).get("s")


def table(res: dict, floor: dict, args, distance: int, zero: dict | None) -> str:
    """One distance, one CPU mode: every system's time, DelveFS's speed over each (> 1:
    DelveFS is faster) and DelveFS's requests."""
    rtt = 2 * distance / 1e3
    lines = ["| operation | DelveFS | floor | boto3 (its form) | s3fs | rclone | boto3 ÷ DelveFS | "
             "faster of s3fs, rclone ÷ DelveFS | DelveFS requests | one after another | added round trips "
             "((t − t at 0) ÷ RTT) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, what, boto_form in rows_of(args):
        d = res.get(key, {}).get("delvefs", {})
        t = d.get("s")
        boto = cell(res, boto3_key(key), "boto3") if boto_form != "—" else None
        others = [v for v in (cell(res, key, "s3fs"), cell(res, key, "rclone")) if v is not None]
        fast = min(others) if others else None
        ratio = (lambda o: "—" if o is None or not t else f"{o / t:.2f}×")
        added = "—"
        if zero is not None and distance and t is not None and cell(zero, key, "delvefs") is not None:
            added = f"{(t - cell(zero, key, 'delvefs')) / rtt:.1f}"
        req = f"{d['requests']:g} ({d['by_method']})" if "requests" in d else "—"
        lines.append(f"| {what} | {fmt(t)} | {fmt(cell(floor, key, 'floor'))} | {fmt(boto)}"
                     f"{' (' + boto_form + ')' if boto is not None else ''} | {fmt(cell(res, key, 's3fs'))} | "
                     f"{fmt(cell(res, key, 'rclone'))} | {ratio(boto)} | {ratio(fast)} | {req} | "
                     f"{d.get('chain', '—')} | {added} |")
    return "\n".join(lines)


def across(results: dict, mode: str, args) -> str:
    """DelveFS and boto3 at each distance, and their ratio (> 1: DelveFS faster)."""
    ds = args.distance_list
    head = ("| operation | " + " | ".join(f"DelveFS at {d} ms" for d in ds) + " | "
            + " | ".join(f"boto3 at {d} ms" for d in ds) + " | "
            + " | ".join(f"boto3 ÷ DelveFS at {d} ms" for d in ds) + " |")
    lines = [head, "|---|" + "---|" * (3 * len(ds))]
    for key, what, boto_form in rows_of(args):
        delve = [cell(results[str(d)][mode], key, "delvefs") for d in ds]
        boto = [cell(results[str(d)][mode], boto3_key(key), "boto3") if boto_form != "—" else None for d in ds]
        ratios = ["—" if a is None or b is None else f"{b / a:.2f}×" for a, b in zip(delve, boto)]
        lines.append(f"| {what} | " + " | ".join(map(fmt, delve)) + " | " + " | ".join(map(fmt, boto))
                     + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


# --- the run

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--distances", default="0,5,15", help="ms each way, comma-separated (default 0,5,15)")
    ap.add_argument("--bandwidth", type=float, default=100, help="MB/s per connection each way (0: none)")
    ap.add_argument("--objects", type=int, default=1000, help="objects of the listed view (default 1,000)")
    ap.add_argument("--scale", action="store_true", help="also a view of 100,000 objects")
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--big-gib", action="store_true", help="a 1,024 MiB object instead")
    ap.add_argument("--tree-files", type=int, default=2000)
    ap.add_argument("--files", type=int, default=50, help="files created, and first bytes read (default 50)")
    ap.add_argument("--reads", type=int, default=50, help="random 32 KiB reads (default 50)")
    ap.add_argument("--only", help="comma-separated systems: " + ",".join(SYSTEMS))
    ap.add_argument("--ops", help="comma-separated operations: " + ",".join(OPS))
    ap.add_argument("--no-count", action="store_true", help="no counting proxies (no request counts)")
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    if args.big_gib:
        args.big_mib = 1024
    args.distance_list = [int(d) for d in args.distances.split(",")]
    args.object_counts = [args.objects] + ([100_000] if args.scale and args.objects != 100_000 else [])
    args.op_list = args.ops.split(",") if args.ops else list(OPS)
    systems = args.only.split(",") if args.only else list(SYSTEMS)
    bad = [x for x in systems if x not in SYSTEMS] + [x for x in args.op_list if x not in OPS]
    if bad:
        ap.error(f"unknown: {bad}")
    modes = cpu_modes(args.cpus)
    args.tar = source_tar(args.tree_files)
    tar_files = tree_members(args.tar)
    args.tree_count = len(tar_files)
    started = datetime.datetime.now()
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "probes": {}}
    floors: dict = {}
    BASE.mkdir(parents=True, exist_ok=True)
    with LocalServices(BASE / "services") as svc, tempfile.TemporaryDirectory(prefix="bench-distance-") as d, \
            Toxiproxy(Path(d)) as toxiproxy:
        work = Path(d)
        os.environ.update(svc.env())
        direct = make_client(max_pool=64)
        populate(direct, args.object_counts, args.big_mib)
        for b in (MANY, BIG, WORK):
            wire_notifications(direct, b, svc.minio.notify_arn)
        from eventhandler.devtools import HandlerProcess
        for distance in args.distance_list:
            link = toxiproxy.link(svc.minio.endpoint, distance, args.bandwidth, name=f"d{distance}")
            log(f"=== {link.describe()}")
            counters = {} if args.no_count else {who: CountingProxy(link.url) for who in COUNTED if who in systems}
            urls = {who: counters[who].url if who in counters else link.url for who in COUNTED}
            # the handler checks a mount's proofs (presigned URLs) against its own S3 endpoint,
            # so it shares DelveFS's: its requests for a mount (the proofs) count as the mount's
            handler = HandlerProcess({**svc.env(), "AWS_ENDPOINT_URL": urls["delvefs"]},
                                     work / f"handler-{distance}", token="bench")
            handler.start()
            env = {**os.environ, **svc.env(), "AWS_ENDPOINT_URL": urls["delvefs"],
                   "DELVEFS_STATE_HOME": str(work / "state"), "DELVEFS_HANDLER_TOKEN": "bench"}
            per = results[str(distance)] = {}
            try:
                for mode in modes:
                    probe = link.probe()
                    log(f"--- {CPU_MODES[mode]}, {probe}")
                    results["probes"][f"{distance}-{mode}"] = dataclasses.asdict(probe) | {"added_ms": probe.added_ms}
                    res = per[mode] = {}
                    here = work / f"{mode}-{distance}"
                    here.mkdir()
                    s = Setting(distance, link, urls, counters, handler, env, here)
                    with cpu_mode(mode):
                        if "floor" in systems and mode not in floors:
                            floors[mode] = {}
                            guarded(res, "floor", lambda: bench_floor(here, args, floors[mode]))
                        for who in systems:
                            if who == "delvefs":
                                guarded(res, who, lambda: bench_delvefs(s, args, mode, res, tar_files))
                            elif who == "boto3":
                                guarded(res, who, lambda: bench_boto3(s, args, mode, res, tar_files))
                            elif who in ("s3fs", "rclone"):
                                guarded(res, who, lambda who=who: bench_bucket_mount(who, s, args, mode, res,
                                                                                   tar_files, direct))
                    clear(direct, WORK)
            finally:
                handler.close()
                for c in counters.values():
                    c.close()
                link.remove()
        results["floor"] = floors
    out_lines = [f"# Mount operations at a distance, {started:%Y-%m-%d %H:%M} ({os.uname().release}, "
                 f"{os.cpu_count()} CPUs)",
                 f"toxiproxy v2.5.0 in front of MinIO on loopback: {args.bandwidth:g} MB/s per connection each way, "
                 f"then the distance each way; counting proxies {'off' if args.no_count else 'on'}. "
                 f"`python -m benchmarks.bench_distance {' '.join(argv if argv is not None else sys.argv[1:])}`",
                 "Times: one run each (first byte: the median file). Ratios: the other's time ÷ DelveFS's "
                 "(> 1: DelveFS is faster)."]
    for mode in modes:
        for distance in args.distance_list:
            p = results["probes"].get(f"{distance}-{mode}")
            probe = f"probe +{p['added_ms']:.2f} ms a round trip (set +{p['expected_ms']:.0f})" if p else "no probe"
            zero = results.get("0", {}).get(mode)
            res = results[str(distance)].get(mode, {})
            out_lines.append(f"\n## {CPU_MODES[mode]}: {distance} ms each way ({probe})\n\n"
                             + table(res, floors.get(mode, {}), args, distance, zero))
            errors = {k: v for k, v in res.items() if k.endswith("_error")}
            if errors:
                out_lines.append("\n".join(f"* {k[:-6]} failed: {v}" for k, v in errors.items()))
        out_lines.append(f"\n## {CPU_MODES[mode]}: across the distances\n\n{across(results, mode, args)}")
    text = "\n".join(out_lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"distance-{started:%Y-%m-%dT%H%M}.json"
    out.write_text(json.dumps(results, indent=2, default=str))
    out.with_suffix(".txt").write_text(text)
    log(f"results: {out}")
    return 1 if any(k.endswith("_error") for r in results.values() if isinstance(r, dict)
                    for m in r.values() if isinstance(m, dict) for k in m) else 0


def guarded(res: dict, who: str, fn) -> None:
    """Run one system's part; a failure is recorded and the others still run."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 — recorded in the table
        log(f"{who} failed: {exc}")
        res[f"{who}_error"] = str(exc)[:500]


if __name__ == "__main__":
    sys.exit(main())
