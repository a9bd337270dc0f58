"""Mount write path: DelveFS vs s3fs-fuse vs boto3 vs the floor on the same MinIO, same
run — pinned to CPU 0 and unpinned (``--cpus``), one table each.

    .venv/bin/python -m benchmarks.bench_mount_write [--files 500] [--big-mib 1024] [--skip-s3fs]
                                                     [--rounds 10]
                                                     [--only boto3,delvefs,delvefs-rw,delvefs-off,floor,s3fs]
                                                     [--cpus both|pinned|unpinned]

DelveFS runs as mounted by default (``delvefs``: reads of cached files through FUSE
passthrough, writes through the mount), with ``-o passthrough=rw`` (``delvefs-rw``: the
kernel also writes new and truncated files into their cache file; uploaded at close as
before) and with ``-o passthrough=off`` (``delvefs-off``), side by side in one run.
Measures (docs/PERFORMANCE.md, "## Mount (write path)"):
  * create + close of empty files, one after the other (``open(O_CREAT|O_TRUNC)`` +
    ``close``: each close uploads) vs boto3 ``put_object`` of empty objects;
  * unlink of those files vs boto3 ``delete_object``;
  * ``dd bs=1M`` of a 1 GiB file into the mount (close included: the upload is part of it)
    vs ``dd`` to a local file + boto3 ``upload_file`` (8 MiB parts, 10 threads).
All sequential, one process; s3fs-fuse (``-o use_path_request_style``) on the same bucket;
the floor (benchmarks/floorfs.py: a pyfuse3 file system keeping only names, sizes and
modes, mounted as the DelveFS mount is) for what the kernel, the binding and the machine
cost.
The small operations take turns: ``--rounds`` batches of ``files / rounds`` each, the order
rotated every round, so that a change of the machine's load (shared machines) hits them
alike instead of whichever ran at the time.
MinIO's data directory is ~/.cache/delvefs/bench-mount/services (as bench_mount.py).
"""
from __future__ import annotations

import argparse
import contextlib
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

from .bench_mount import BASE, DELVEFS, RESULTS, log, wait_for
from .mounting import CPU_MODES, FloorMount, add_cpu_option, cpu_mode, cpu_modes

BUCKET = "bench-write"
PARTS = ("boto3", "delvefs", "delvefs-rw", "delvefs-off", "floor", "s3fs")
# the DelveFS parts: (result name, key prefix of its view, its mount options); the default
# passes cached reads through to the kernel, rw also the writes of new and truncated files
DELVE_PARTS = {"delvefs": ("delvefs", "delve", ()),
               "delvefs-rw": ("delvefs_rw", "delve-rw", ("-o", "passthrough=rw")),
               "delvefs-off": ("delvefs_off", "delve-off", ("-o", "passthrough=off"))}
COLUMNS = (("DelveFS", "delvefs"), ("DelveFS passthrough=rw", "delvefs_rw"),
           ("DelveFS passthrough=off", "delvefs_off"), ("floor", "floor"), ("s3fs", "s3fs"))


def create(directory: Path, i: int) -> None:
    fd = os.open(directory / f"e-{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.close(fd)


def interleaved(ops: dict, n: int, rounds: int) -> dict[str, float]:
    """Operations per second of each ``ops[name](i)`` for i in range(n), run in ``rounds``
    batches that take turns (the order rotated each round)."""
    spent = dict.fromkeys(ops, 0.0)
    names = list(ops)
    bounds = [n * r // rounds for r in range(rounds + 1)]
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = ops[name]
            t = time.perf_counter()
            for i in range(bounds[r], bounds[r + 1]):
                fn(i)
            spent[name] += time.perf_counter() - t
    return {name: n / s for name, s in spent.items()}


def dd(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    r = subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M"], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"dd: {r.stderr[-300:]}")
    return time.perf_counter() - t


def clear_bucket(client):
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objs:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": objs})


@contextlib.contextmanager
def delvefs_mount(env, work: Path, handler_url: str, prefix: str = "delve", options: tuple = ()):
    """The DelveFS view directory (view ``w``: keys PREFIX/*) of a mount with ``options``."""
    views = work / f"views-{prefix}.yaml"
    views.write_text(f"w:\n  bucket: {BUCKET}\n  object: \"{prefix}/*\"\n  ttl: 60s\n")
    mp = work / f"{prefix}-mnt"
    mp.mkdir()
    r = subprocess.run([DELVEFS, "mount", str(views), str(mp), "--cache-dir", str(work / f"{prefix}-cache"),
                        "--handler", handler_url, *options], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    try:
        os.listdir(mp / "w")
        yield mp / "w"
    finally:
        subprocess.run([DELVEFS, "umount", str(mp)], env=env, check=False)
        if mounted_fstype(str(mp)):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])


@contextlib.contextmanager
def s3fs_mount(env, work: Path):
    """A directory (prefix s3fs/) of an s3fs-fuse mount of the bucket."""
    pw = work / "s3fs.passwd"
    pw.write_text(f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}\n")
    pw.chmod(0o600)
    mp = work / "s3fs-mnt"
    mp.mkdir()
    subprocess.run(["s3fs", BUCKET, str(mp), "-o", f"url={env['AWS_ENDPOINT_URL']},use_path_request_style,"
                    f"passwd_file={pw}"], check=True)
    try:
        wait_for(lambda: mounted_fstype(str(mp)) is not None, 30, "s3fs mount")
        d = mp / "s3fs"
        d.mkdir(exist_ok=True)
        yield d
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)])


def small_ops(client, dirs: dict[str, Path], n: int, rounds: int, res: dict) -> None:
    """create + close and unlink in the mounts, put_object and delete_object with boto3
    (``client``, unless None)."""
    puts, deletes = {}, {}
    if client is not None:
        puts["boto3"] = lambda i: client.put_object(Bucket=BUCKET, Key=f"boto3/e-{i:05d}", Body=b"")
        deletes["boto3"] = lambda i: client.delete_object(Bucket=BUCKET, Key=f"boto3/e-{i:05d}")
    for name, d in dirs.items():
        puts[name] = lambda i, d=d: create(d, i)
        deletes[name] = lambda i, d=d: os.unlink(d / f"e-{i:05d}")
    for name, rate in interleaved(puts, n, rounds).items():
        res[f"{name}_{'put' if name == 'boto3' else 'create'}_per_s"] = rate
    for d in dirs.values():  # the kernel knows the names (as after an ls)
        for i in range(3):
            os.stat(d / f"e-{i:05d}")
    for name, rate in interleaved(deletes, n, rounds).items():
        res[f"{name}_{'delete' if name == 'boto3' else 'unlink'}_per_s"] = rate
    for name in puts:
        c = res[f"{name}_{'put' if name == 'boto3' else 'create'}_per_s"]
        u = res[f"{name}_{'delete' if name == 'boto3' else 'unlink'}_per_s"]
        log(f"{name}: create {c:.0f}/s ({1000 / c:.2f} ms), unlink {u:.0f}/s ({1000 / u:.2f} ms)")


def big_write(client, dirs: dict[str, Path], work: Path, src: Path, res: dict, parts) -> None:
    if "boto3" in parts:
        from boto3.s3.transfer import TransferConfig
        local = work / "local-big.bin"
        t0 = time.perf_counter()
        dd(src, local)
        t1 = time.perf_counter()
        client.upload_file(str(local), BUCKET, "boto3/big.bin",
                           Config=TransferConfig(multipart_chunksize=8 << 20, max_concurrency=10))
        t2 = time.perf_counter()
        local.unlink()
        res["boto3_local_write_s"] = t1 - t0
        res["boto3_upload_s"] = t2 - t1
        res["boto3_write_upload_s"] = t2 - t0
        log(f"boto3: dd local {t1 - t0:.2f} s + upload_file {t2 - t1:.2f} s")
    for name, d in dirs.items():
        res[f"{name}_dd_s"] = dd(src, d / "big.bin")
        log(f"{name}: dd {res[f'{name}_dd_s']:.2f} s")
    for name, prefix, _ in DELVE_PARTS.values():
        if name in dirs:
            head = client.head_object(Bucket=BUCKET, Key=f"{prefix}/big.bin")
            assert head["ContentLength"] == src.stat().st_size, name


def big_copy(client, dirs: dict[str, Path], res: dict, parts) -> None:
    """``cp`` of the big file inside each mount vs one server-side CopyObject (boto3)."""
    if "boto3" in parts:
        t = time.perf_counter()
        client.copy_object(Bucket=BUCKET, Key="boto3/big-copy.bin",
                           CopySource={"Bucket": BUCKET, "Key": "boto3/big.bin"})
        res["boto3_copy_s"] = time.perf_counter() - t
        log(f"boto3: copy_object {res['boto3_copy_s']:.2f} s")
    for name, d in dirs.items():
        t = time.perf_counter()
        subprocess.run(["cp", str(d / "big.bin"), str(d / "big-copy.bin")], check=True)
        res[f"{name}_cp_s"] = time.perf_counter() - t
        log(f"{name}: cp {res[f'{name}_cp_s']:.2f} s")
    for name, prefix, _ in DELVE_PARTS.values():
        if name in dirs:
            head = client.head_object(Bucket=BUCKET, Key=f"{prefix}/big-copy.bin")
            assert head["ContentLength"] == (dirs[name] / "big.bin").stat().st_size, name


def table(res: dict) -> str:
    """One row per operation: the reference, each file system run, each DelveFS variant's
    speed over the reference (above 1: faster), DelveFS's over the floor's and s3fs's."""
    mib = res["big_mib"]
    cols = [(label, name) for label, name in COLUMNS if any(k.startswith(name + "_") for k in res)]
    delves = [(label, name) for label, name in cols if name.startswith("delvefs")]
    rows = []

    def row(what, ref_key, target, key, unit, higher_better=True):
        def value(name):
            v = res.get(f"{name}_{key}") if name else res.get(ref_key)
            return None if v is None else (mib / v if unit == "MiB/s" else v)

        def fmt(v):
            return "—" if v is None else (f"{v:.0f} {unit}" if unit != "s" else f"{v:.2f} s")

        def speed(mine, other):  # the first's speed over the other's (above 1: it is faster)
            if mine is None or other is None:
                return "—"
            return f"{(mine / other if higher_better else other / mine):.2f}×"
        ref, delve = value(None), value("delvefs")
        cells = [fmt(ref)] + [fmt(value(name)) for _, name in cols]
        cells += [speed(value(name), ref) + (f" (≥ {target}×)" if name == "delvefs" else "") for _, name in delves]
        cells += [speed(delve, value("floor")), speed(delve, value("s3fs"))]
        rows.append(f"| {what} | " + " | ".join(cells) + " |")
    row("create + close, empty files", "boto3_put_per_s", 0.7, "create_per_s", "/s")
    row("unlink", "boto3_delete_per_s", 0.7, "unlink_per_s", "/s")
    row(f"dd {mib} MiB bs=1M + close", "boto3_write_upload_s", 0.8, "dd_s", "MiB/s")
    row(f"cp {mib} MiB inside the mount (reference: one CopyObject)", "boto3_copy_s", 0.9, "cp_s", "s",
        higher_better=False)
    head = ("| operation | reference (boto3) | " + " | ".join(label for label, _ in cols) + " | "
            + " | ".join(f"{label} / reference" for label, _ in delves) + " | DelveFS / floor | DelveFS / s3fs |")
    return head + "\n|" + "---|" * (head.count("|") - 1) + "\n" + "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=10, help="batches the small operations take turns in")
    ap.add_argument("--skip-s3fs", action="store_true")
    ap.add_argument("--only", help="comma-separated parts: " + ",".join(PARTS))
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    parts = [p for p in (args.only.split(",") if args.only else PARTS)
             if p in PARTS and not (p == "s3fs" and args.skip_s3fs)]
    modes = cpu_modes(args.cpus)
    BASE.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    with LocalServices(BASE / "services") as svc, tempfile.TemporaryDirectory(prefix="bench-write-") as d:
        work = Path(d)
        env = {**os.environ, **svc.env(), "DELVEFS_STATE_HOME": str(work / "state")}
        os.environ.update(svc.env())
        client = make_client(max_pool=64)
        ensure_bucket(client, BUCKET)
        clear_bucket(client)
        wire_notifications(client, BUCKET, svc.minio.notify_arn)
        src = work / "src.bin"
        with open(src, "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(args.big_mib):
                f.write(chunk)
        from eventhandler.devtools import HandlerProcess
        handler = HandlerProcess(svc.env(), work / "handler-state", token="bench")
        handler.start()
        env["DELVEFS_HANDLER_TOKEN"] = "bench"
        try:
            for mode in modes:
                log(f"--- {CPU_MODES[mode]}")
                res = results[mode] = {"files": args.files, "big_mib": args.big_mib, "rounds": args.rounds}
                here = work / mode
                here.mkdir()
                with cpu_mode(mode), contextlib.ExitStack() as mounts:
                    dirs = {}
                    for part, (name, prefix, options) in DELVE_PARTS.items():
                        if part in parts:
                            dirs[name] = mounts.enter_context(delvefs_mount(env, here, handler.url,
                                                                            prefix, options))
                    if "floor" in parts:
                        dirs["floor"] = mounts.enter_context(FloorMount(here / "floor-mnt"))
                    if "s3fs" in parts:
                        dirs["s3fs"] = mounts.enter_context(s3fs_mount(env, here))
                    # the mount makes its boto3 client (~0.3 s of CPU) 0.5 s after it is ready;
                    # the reference's client exists before its clock starts too
                    time.sleep(2)
                    small_ops(client if "boto3" in parts else None, dirs, args.files, args.rounds, res)
                    big_write(client, dirs, here, src, res, parts)
                    big_copy(client, dirs, res, parts)
                clear_bucket(client)
        finally:
            handler.close()
            clear_bucket(client)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "mount-write.json"
    out.write_text(json.dumps(results, indent=2))
    log(f"results: {out}")
    for mode in modes:
        print(f"\n{CPU_MODES[mode]}:\n")
        print(table(results[mode]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
