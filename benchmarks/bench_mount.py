"""Mount read path: DelveFS vs s3fs-fuse vs rclone mount vs the floor on the same MinIO,
same run — pinned to CPU 0 and unpinned (``--cpus``), one table each.

    .venv/bin/python -m benchmarks.bench_mount [--objects 100000] [--big-mib 1024] [--skip-others]
                                               [--only boto3,delvefs,floor,s3fs,rclone]
                                               [--cpus both|pinned|unpinned]

Measures (docs/PERFORMANCE.md, "## Mount (read path)"):
  * ``ls -l`` of a view of N small objects in one prefix: DelveFS fresh mount (the handler
    already tracks the bucket) and hot; s3fs and rclone cold (fresh mount) and hot;
  * mount ready + ``ls -l`` of a 100-file view carved out of the same bucket;
  * stat rate of files in a listed view (kernel lookups, not cached) vs boto3 head_object;
  * sequential read of a big object through a fresh mount vs boto3 download_file + read;
  * references: boto3 listing, head_object rate, download_file throughput;
  * passthrough (``--only passthrough``): re-reading the big object once it is whole in the
    cache directory, ``--passthrough on`` and ``off``, against the same bytes in a file on
    the cache directory's disk: with every page cache dropped (``drop_caches``: the bytes
    come from disk) and with the cache file's pages hot but the mount file's dropped
    (``posix_fadvise(DONTNEED)`` on it: what memory pressure leaves when a file is cached
    twice, in the mount's pages and in the cache file's); best of 3, MiB/s;
  * the floor (benchmarks/floorfs.py: a pyfuse3 file system mounted as DelveFS's is, with a
    directory of the same N names of 100 bytes, a 100-file one and a big file of zeros, all
    in memory) doing the same: what the kernel, the binding and the machine cost.

The populated MinIO data directory is kept in ~/.cache/delvefs/bench-mount between runs
(populating 100,000 objects takes minutes); everything else starts fresh each run. The
tables go to stdout, the numbers to benchmarks/results/mount-N.json.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from delvefs.devtools.localservices import LocalServices
from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .mounting import CPU_MODES, FloorMount, add_cpu_option, cpu_mode, cpu_modes, mount_s3fs

BASE = Path(os.environ.get("DELVEFS_BENCH_DIR", Path.home() / ".cache/delvefs/bench-mount"))
DELVEFS = str(Path(sys.executable).parent / "delvefs")
BUCKET = "bench-many"
BIG_BUCKET = "bench-big"
RESULTS = Path(__file__).resolve().parent / "results"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_parts(parts, only: str | None, res: dict) -> None:
    """Run each (name, fn) of ``parts`` (only those named in ``only``, comma-separated);
    a part that fails is recorded in ``res`` and the others still run."""
    for name, part in parts:
        if only and name not in only.split(","):
            continue
        try:
            part()
        except Exception as exc:  # noqa: BLE001 — record it, go on with the others
            log(f"{name} failed: {exc}")
            res[f"{name}_error"] = str(exc)


def timed(fn, *a, **kw):
    t = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t, out


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timeout waiting for {what}")
        time.sleep(0.05)


def populate(client, n: int, big_mib: int) -> None:
    ensure_bucket(client, BUCKET)
    have = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="many/"):
        have.update(o["Key"] for o in page.get("Contents", []))
    missing = [f"many/obj-{i:06d}.dat" for i in range(n) if f"many/obj-{i:06d}.dat" not in have]
    if missing:
        log(f"populating {len(missing)} objects ...")
        t = time.perf_counter()
        body = b"x" * 100
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=k, Body=body), missing,
                          chunksize=256))
        log(f"  {time.perf_counter() - t:.0f} s")
    ensure_bucket(client, BIG_BUCKET)
    key = f"big/{big_mib}MiB.bin"
    try:
        client.head_object(Bucket=BIG_BUCKET, Key=key)
    except Exception:  # noqa: BLE001
        log(f"uploading {big_mib} MiB object ...")
        with tempfile.NamedTemporaryFile() as f:
            chunk = os.urandom(1 << 20)
            for _ in range(big_mib):
                f.write(chunk)
            f.flush()
            client.upload_file(f.name, BIG_BUCKET, key)


def ls_l(path) -> float:
    t = time.perf_counter()
    r = subprocess.run(["ls", "-l", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"ls -l {path}: {r.stderr.decode()[-300:]}")
    return dt, r.stdout.count(b"\n") - 1


def drop_caches():
    subprocess.run(["sync"])
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


class DelveMount:
    def __init__(self, env, work: Path, handler_url: str):
        self.env, self.work, self.handler_url = env, work, handler_url
        self.n = 0

    def mount(self, views_text: str, *extra: str) -> tuple[float, Path]:
        self.n += 1
        views = self.work / f"views-{self.n}.yaml"
        views.write_text(views_text)
        mp = self.work / f"mnt-{self.n}"
        mp.mkdir()
        t = time.perf_counter()
        r = subprocess.run([DELVEFS, "mount", str(views), str(mp), "--cache-dir", str(self.work / f"cache-{self.n}"),
                            "--handler", self.handler_url, *extra], env=self.env, capture_output=True, text=True)
        dt = time.perf_counter() - t
        if r.returncode:
            raise RuntimeError(r.stderr)
        return dt, mp

    def umount(self, mp):
        subprocess.run([DELVEFS, "umount", str(mp)], env=self.env, check=False)
        if mounted_fstype(str(mp)):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])

    def pid(self, mp) -> int:
        out = subprocess.run(["pgrep", "-f", f"delvefs mount .* {mp} --foreground"],
                             capture_output=True, text=True).stdout.split()
        return int(out[0])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def views_many(ttl="300s"):
    return f"""
many:
  bucket: {BUCKET}
  object: "many/*"
  ttl: {ttl}
"""


def views_small(ttl="300s"):
    return f"""
small:
  bucket: {BUCKET}
  object: "many/obj-0000??.dat"
  ttl: {ttl}
"""


def views_big():
    return f"""
big:
  bucket: {BIG_BUCKET}
  object: "big/*"
  ttl: 300s
"""


def bench_delvefs(env, work: Path, handler, n: int, big_key: str, res: dict):
    dm = DelveMount(env, work, handler.url)
    # warm-up: the handler starts tracking the bucket (first scan), then the measured mounts
    t, mp = dm.mount(views_many())
    dt, count = ls_l(mp / "many")
    res["delvefs_first_scan_ls_s"] = t + dt
    log(f"delvefs first mount (handler scans bucket) + ls -l: {t + dt:.2f} s, {count} entries")
    dm.umount(mp)

    drop_caches()
    t, mp = dm.mount(views_many())
    dt, count = ls_l(mp / "many")
    assert count == n, count
    res["delvefs_fresh_mount_s"] = t
    res["delvefs_fresh_ls_s"] = t + dt
    hot = [ls_l(mp / "many")[0] for _ in range(3)]
    res["delvefs_hot_ls_s"] = min(hot)
    res["delvefs_rss_100k_mib"] = rss_mib(dm.pid(mp))
    log(f"delvefs fresh mount+ls -l {t + dt:.2f} s (mount {t:.2f}), hot {min(hot):.2f} s, "
        f"RSS {res['delvefs_rss_100k_mib']:.0f} MiB")
    dm.umount(mp)

    # stat rate: listed view, files not yet known to the kernel
    t, mp = dm.mount(views_many())
    os.listdir(mp)  # root only
    # the listing streams in the background: wait for its last page (the view is "listed"),
    # else the timed lookups would also wait for pages still on their way
    wait_for(lambda: os.path.exists(mp / "many" / f"obj-{n - 1:06d}.dat"), 60, "listing")
    res["delvefs_stat_per_s"] = stat_rate(mp / "many", n)
    log(f"delvefs stat: {res['delvefs_stat_per_s']:.0f}/s")
    dm.umount(mp)

    # 100-file view carved out of the big bucket
    times = []
    for _ in range(3):
        t, mp = dm.mount(views_small())
        dt, count = ls_l(mp / "small")
        assert count == 100, count
        times.append(t + dt)
        dm.umount(mp)
    res["delvefs_small_view_mount_ls_s"] = min(times)
    log(f"delvefs 100-file view mount + ls -l: {min(times):.3f} s")

    # big sequential read through a fresh mount
    drop_caches()
    t0 = time.perf_counter()
    t, mp = dm.mount(views_big())
    path = mp / "big" / big_key.split("/", 1)[1]
    t1 = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            total += len(chunk)
    t2 = time.perf_counter()
    res["delvefs_big_read_s"] = t2 - t1
    res["delvefs_big_mount_read_s"] = t2 - t0
    res["big_bytes"] = total
    log(f"delvefs big read {total / (t2 - t1) / 2**20:.0f} MiB/s ({t2 - t1:.2f} s, +mount {t1 - t0:.2f} s)")
    dm.umount(mp)


def read_file(path, drop_own_pages: bool = False) -> tuple[float, int]:
    """Seconds to read ``path`` with 1 MiB reads, and its bytes (its own pages dropped
    first: ``drop_own_pages``)."""
    total = 0
    with open(path, "rb", buffering=0) as f:
        if drop_own_pages:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        while chunk := f.read(1 << 20):
            total += len(chunk)
        return time.perf_counter() - t, total


def bench_passthrough(env, work: Path, handler, big_key: str, res: dict, repeat: int = 3):
    """Re-reads of the big object once it is whole in the cache directory, with passthrough
    on and off, against the same bytes in a local file (see the module's docstring)."""
    dm = DelveMount(env, work, handler.url)
    local = None
    for mode in ("on", "off"):
        t, mp = dm.mount(views_big(), "--passthrough", mode)
        try:
            path = mp / "big" / big_key.split("/", 1)[1]
            read_file(path)  # fetched whole into the cache directory
            st = json.loads(subprocess.run([DELVEFS, "status", "--json", str(mp)], env=env,
                                           capture_output=True, text=True, check=True).stdout)
            res[f"passthrough_{mode}_state"] = st["passthrough"]["state"]
            if local is None:  # the reference: the same bytes in a file of the same disk
                local = work / "local-copy.bin"
                with open(path, "rb") as src, open(local, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                for which in ("cold", "hot"):
                    times = []
                    for _ in range(repeat):
                        if which == "cold":
                            drop_caches()
                        times.append(read_file(local)[0])
                    res[f"local_{which}_reread_s"] = min(times)
            for which in ("cold", "hot"):
                times = []
                for _ in range(repeat):
                    if which == "cold":
                        drop_caches()
                    else:
                        read_file(path)  # the cache file's pages in memory
                    dt, total = read_file(path, drop_own_pages=True)
                    assert total == res["big_bytes"], total
                    times.append(dt)
                res[f"passthrough_{mode}_{which}_reread_s"] = min(times)
            log(f"delvefs passthrough={mode} ({res[f'passthrough_{mode}_state']}): re-read "
                + ", ".join(f"{which} {res['big_bytes'] / res[f'passthrough_{mode}_{which}_reread_s'] / 2**20:.0f} MiB/s"
                            for which in ("cold", "hot")))
        finally:
            dm.umount(mp)
    log("local file: re-read " + ", ".join(
        f"{which} {res['big_bytes'] / res[f'local_{which}_reread_s'] / 2**20:.0f} MiB/s" for which in ("cold", "hot")))


def passthrough_table(res: dict, big_mib: int) -> str:
    """MiB/s of the re-reads of ``bench_passthrough``."""
    def rate(key):
        v = res.get(key)
        return f"{res['big_bytes'] / v / 2**20:,.0f} MiB/s ({v:.2f} s)" if v else "—"
    lines = [f"| re-read of a {big_mib} MiB file whole in the cache directory | local file | "
             "passthrough on | passthrough off |", "|---|---|---|---|"]
    for which, what in (("cold", "page cache dropped (from disk)"),
                        ("hot", "cache file's pages hot, the mount file's dropped")):
        lines.append(f"| {what} | {rate(f'local_{which}_reread_s')} | "
                     f"{rate(f'passthrough_on_{which}_reread_s')} | {rate(f'passthrough_off_{which}_reread_s')} |")
    return "\n".join(lines)


def stat_rate(directory: Path, n: int) -> float:
    """stats/s of up to 20,000 of the view's ``n`` names, spread over it (names the
    kernel does not know yet: one lookup each)."""
    names = [directory / f"obj-{i:06d}.dat" for i in range(0, n - 1, max(1, n // 20000))]
    t = time.perf_counter()
    for p in names:
        os.stat(p)
    return len(names) / (time.perf_counter() - t)


def bench_floor(work: Path, n: int, big_mib: int, res: dict):
    """The DelveFS measurements on the floor: the same names, sizes and commands."""
    many = ("--files", "many", "obj-{:06d}.dat", str(n), "100")
    drop_caches()
    t = time.perf_counter()
    with FloorMount(work / "floor-ls", *many) as mp:
        res["floor_fresh_mount_s"] = time.perf_counter() - t
        dt, count = ls_l(mp / "many")
        assert count == n, count
        res["floor_fresh_ls_s"] = res["floor_fresh_mount_s"] + dt
        res["floor_hot_ls_s"] = min(ls_l(mp / "many")[0] for _ in range(3))
    with FloorMount(work / "floor-ls", *many) as mp:  # stat: names the kernel does not know yet
        os.listdir(mp)
        os.path.exists(mp / "many" / f"obj-{n - 1:06d}.dat")
        res["floor_stat_per_s"] = stat_rate(mp / "many", n)
    log(f"floor: fresh mount+ls -l {res['floor_fresh_ls_s']:.2f} s (mount {res['floor_fresh_mount_s']:.2f}), "
        f"hot {res['floor_hot_ls_s']:.2f} s, stat {res['floor_stat_per_s']:.0f}/s")

    times = []
    for _ in range(3):
        t = time.perf_counter()
        with FloorMount(work / "floor-small", "--files", "small", "obj-{:06d}.dat", "100", "100") as mp:
            dt, count = ls_l(mp / "small")
            assert count == 100, count
            times.append(time.perf_counter() - t)
    res["floor_small_view_mount_ls_s"] = min(times)
    log(f"floor 100-file view mount + ls -l: {min(times):.3f} s")

    drop_caches()
    t0 = time.perf_counter()
    with FloorMount(work / "floor-big", "--files", "big", f"{big_mib}MiB.bin", "1", str(big_mib << 20)) as mp:
        t1 = time.perf_counter()
        total = 0
        with open(mp / "big" / f"{big_mib}MiB.bin", "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
        t2 = time.perf_counter()
    assert total == big_mib << 20, total
    res["floor_big_read_s"] = t2 - t1
    res["floor_big_mount_read_s"] = t2 - t0
    log(f"floor big read {total / (t2 - t1) / 2**20:.0f} MiB/s ({t2 - t1:.2f} s, +mount {t1 - t0:.2f} s)")


def bench_boto3(client, n: int, big_key: str, work: Path, res: dict):
    t, _ = timed(lambda: sum(len(p.get("Contents", [])) for p in client.get_paginator("list_objects_v2")
                             .paginate(Bucket=BUCKET, Prefix="many/")))
    res["boto3_list_s"] = t
    keys = [f"many/obj-{i:06d}.dat" for i in range(0, n, max(1, n // 1000))]
    t, _ = timed(lambda: [client.head_object(Bucket=BUCKET, Key=k) for k in keys])
    res["boto3_head_per_s"] = len(keys) / t
    from boto3.s3.transfer import TransferConfig
    target = work / "boto3-big.bin"
    drop_caches()
    t0 = time.perf_counter()
    client.download_file(BIG_BUCKET, big_key, str(target),
                         Config=TransferConfig(multipart_chunksize=8 << 20, max_concurrency=10))
    t1 = time.perf_counter()
    with open(target, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass
    t2 = time.perf_counter()
    target.unlink()
    res["boto3_download_s"] = t1 - t0
    res["boto3_download_read_s"] = t2 - t0
    log(f"boto3: list {res['boto3_list_s']:.2f} s, head {res['boto3_head_per_s']:.0f}/s, "
        f"download {res['big_bytes'] / (t1 - t0) / 2**20:.0f} MiB/s, +read {t2 - t0:.2f} s")


def bench_s3fs(env, work: Path, n: int, res: dict):
    mp = work / "s3fs-mnt"
    mp.mkdir()
    t = time.perf_counter()
    mount_s3fs(env, work, BUCKET, mp)
    try:
        cold, count = ls_l(mp / "many")
        res["s3fs_cold_ls_s"] = time.perf_counter() - t
        hot = min(ls_l(mp / "many")[0] for _ in range(2))
        res["s3fs_hot_ls_s"] = hot
        log(f"s3fs: cold {res['s3fs_cold_ls_s']:.1f} s ({count}), hot {hot:.1f} s")
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)])


def bench_rclone(env, work: Path, n: int, res: dict):
    renv = {k: v for k, v in env.items() if k != "AWS_CA_BUNDLE"}  # rclone 1.60 fails on it over http
    renv = {**renv, "RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Minio",
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
            "RCLONE_CONFIG_BENCH_ENDPOINT": env["AWS_ENDPOINT_URL"],
            "RCLONE_CONFIG_BENCH_REGION": "us-east-1"}
    mp = work / "rclone-mnt"
    mp.mkdir()
    t = time.perf_counter()
    proc = subprocess.Popen(["rclone", "mount", f"bench:{BUCKET}", str(mp), "--read-only"], env=renv,
                            stdout=subprocess.DEVNULL, stderr=open(work / "rclone.log", "wb"))
    try:
        wait_for(lambda: mounted_fstype(str(mp)) is not None, 30, "rclone mount")
        cold, count = ls_l(mp / "many")
        res["rclone_cold_ls_s"] = time.perf_counter() - t
        hot = min(ls_l(mp / "many")[0] for _ in range(2))
        res["rclone_hot_ls_s"] = hot
        log(f"rclone: cold {res['rclone_cold_ls_s']:.1f} s ({count}), hot {hot:.1f} s")
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)])
        proc.terminate()
        proc.wait(30)


def table(res: dict, objects: int, big_mib: int) -> str:
    """DelveFS's speed over the others' (above 1: DelveFS is faster)."""
    g = res.get

    def fmt(v, unit):
        if v is None:
            return "—"
        return f"{v:,.0f}/s" if unit == "/s" else f"{v:.{3 if v < 1 else 2}f} s"

    def speed(delve, other, unit):
        if delve is None or other is None:
            return "—"
        return f"{(delve / other if unit == '/s' else other / delve):.2f}×"

    def faster(a, b):
        there = [v for v in (a, b) if v is not None]
        return min(there) if there else None
    rows = [
        (f"`ls -l` of {objects:,} objects, fresh mount", "s", g("delvefs_fresh_ls_s"), g("floor_fresh_ls_s"),
         g("boto3_list_s"), g("s3fs_cold_ls_s"), g("rclone_cold_ls_s"), "≤ 3 s; ≥ 4× s3fs, rclone (100,000)"),
        ("`ls -l` again (hot)", "s", g("delvefs_hot_ls_s"), g("floor_hot_ls_s"), None, g("s3fs_hot_ls_s"),
         g("rclone_hot_ls_s"), "≤ 1.5 s; ≥ 4× s3fs, rclone (100,000)"),
        ("`stat` of files in a listed view (boto3: `head_object`)", "/s", g("delvefs_stat_per_s"),
         g("floor_stat_per_s"), g("boto3_head_per_s"), None, None, "≥ 0.9× the floor; ≥ 20× boto3"),
        (f"{big_mib} MiB sequential read, fresh mount (boto3: `download_file` + read)", "s",
         g("delvefs_big_read_s"), g("floor_big_read_s"), g("boto3_download_read_s"), None, None, "≥ 0.8× boto3"),
        ("the same, with the mount", "s", g("delvefs_big_mount_read_s"), g("floor_big_mount_read_s"),
         g("boto3_download_read_s"), None, None, ""),
        ("100-file view: mount until ready + `ls -l`", "s", g("delvefs_small_view_mount_ls_s"),
         g("floor_small_view_mount_ls_s"), None, None, None, "≤ 0.3 s"),
    ]
    lines = ["| operation | DelveFS | floor | boto3 | s3fs | rclone | DelveFS / floor | DelveFS / boto3 "
             "| DelveFS / faster of s3fs, rclone | target |", "|---|---|---|---|---|---|---|---|---|---|"]
    for what, unit, delve, floor, boto, s3fs, rclone, target in rows:
        other = faster(s3fs, rclone) if unit == "s" else None
        lines.append(f"| {what} | {fmt(delve, unit)} | {fmt(floor, unit)} | {fmt(boto, unit)} | "
                     f"{fmt(s3fs, unit)} | {fmt(rclone, unit)} | {speed(delve, floor, unit)} | "
                     f"{speed(delve, boto, unit)} | {speed(delve, other, unit)} | {target} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--skip-others", action="store_true", help="skip s3fs and rclone")
    ap.add_argument("--populate-only", action="store_true")
    ap.add_argument("--only", help="comma-separated parts: boto3,delvefs,floor,s3fs,rclone,passthrough")
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    modes = cpu_modes(args.cpus)
    BASE.mkdir(parents=True, exist_ok=True)
    results: dict = {"objects": args.objects, "big_mib": args.big_mib, "big_bytes": args.big_mib << 20}
    big_key = f"big/{args.big_mib}MiB.bin"
    with LocalServices(BASE / "services") as svc, tempfile.TemporaryDirectory(prefix="bench-mount-") as d:
        work = Path(d)
        env = {**os.environ, **svc.env(), "DELVEFS_STATE_HOME": str(work / "state")}
        os.environ.update(svc.env())
        client = make_client(max_pool=64)
        populate(client, args.objects, args.big_mib)
        if args.populate_only:
            return 0
        for b in (BUCKET, BIG_BUCKET):
            wire_notifications(client, b, svc.minio.notify_arn)
        from eventhandler.devtools import HandlerProcess
        handler = HandlerProcess(svc.env(), work / "handler-state", token="bench")
        handler.start()
        env["DELVEFS_HANDLER_TOKEN"] = "bench"
        try:
            for mode in modes:
                log(f"--- {CPU_MODES[mode]}")
                res = results[mode] = {"big_bytes": args.big_mib << 20}
                here = work / mode
                here.mkdir()
                parts = [("boto3", functools.partial(bench_boto3, client, args.objects, big_key, here, res)),
                         ("delvefs", functools.partial(bench_delvefs, env, here, handler, args.objects, big_key, res)),
                         ("floor", functools.partial(bench_floor, here, args.objects, args.big_mib, res)),
                         ("passthrough", functools.partial(bench_passthrough, env, here, handler, big_key, res))]
                if not args.skip_others:
                    parts += [("s3fs", functools.partial(bench_s3fs, env, here, args.objects, res)),
                              ("rclone", functools.partial(bench_rclone, env, here, args.objects, res))]
                with cpu_mode(mode):
                    run_parts(parts, args.only, res)
        finally:
            handler.close()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"mount-{args.objects}{'-' + args.only.replace(',', '-') if args.only else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    log(f"results: {out}")
    for mode in modes:
        print(f"\n{CPU_MODES[mode]}:\n")
        if not args.only or set(args.only.split(",")) - {"passthrough"}:
            print(table(results[mode], args.objects, args.big_mib))
            print()
        if "passthrough_on_hot_reread_s" in results[mode]:
            print(passthrough_table(results[mode], args.big_mib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
