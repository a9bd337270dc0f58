"""Mount write path: DelveFS vs s3fs-fuse vs boto3 on the same MinIO, same run.

    .venv/bin/python -m benchmarks.bench_mount_write [--files 500] [--big-mib 1024] [--skip-s3fs]

Measures (docs/PERFORMANCE.md, "## Mount (write path)"):
  * create + close of empty files, one after the other (``open(O_CREAT|O_TRUNC)`` +
    ``close``: each close uploads) vs boto3 ``put_object`` of empty objects;
  * unlink of those files vs boto3 ``delete_object``;
  * ``dd bs=1M`` of a 1 GiB file into the mount (close included: the upload is part of it)
    vs ``dd`` to a local file + boto3 ``upload_file`` (8 MiB parts, 10 threads).
All sequential, one process; s3fs-fuse (``-o use_path_request_style``) on the same bucket.
MinIO's data directory is ~/.cache/delvefs/bench-mount/services (as bench_mount.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from delvefs.localservices import LocalServices
from delvefs.mount import mounted_fstype
from delvefs.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import BASE, DELVEFS, RESULTS, log, run_parts, wait_for

BUCKET = "bench-write"


def creates(directory: Path, n: int, prefix: str) -> float:
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(directory / f"{prefix}-{i:05d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.close(fd)
    return n / (time.perf_counter() - t)


def unlinks(directory: Path, n: int, prefix: str) -> float:
    names = [directory / f"{prefix}-{i:05d}" for i in range(n)]
    for p in names[:3]:   # the kernel knows the names (as after an ls)
        os.stat(p)
    t = time.perf_counter()
    for p in names:
        os.unlink(p)
    return n / (time.perf_counter() - t)


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


def bench_boto3(client, work: Path, src: Path, n: int, res: dict):
    t = time.perf_counter()
    for i in range(n):
        client.put_object(Bucket=BUCKET, Key=f"boto3/e-{i:05d}", Body=b"")
    res["boto3_put_per_s"] = n / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n):
        client.delete_object(Bucket=BUCKET, Key=f"boto3/e-{i:05d}")
    res["boto3_delete_per_s"] = n / (time.perf_counter() - t)
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
    log(f"boto3: put {res['boto3_put_per_s']:.0f}/s, delete {res['boto3_delete_per_s']:.0f}/s, "
        f"dd local {t1 - t0:.2f} s + upload_file {t2 - t1:.2f} s")


def bench_delvefs(env, work: Path, handler_url: str, src: Path, n: int, res: dict, client):
    views = work / "views-write.yaml"
    views.write_text(f"w:\n  bucket: {BUCKET}\n  object: \"delve/*\"\n  ttl: 60s\n")
    mp = work / "delve-mnt"
    mp.mkdir()
    r = subprocess.run([DELVEFS, "mount", str(views), str(mp), "--cache-dir", str(work / "delve-cache"),
                        "--handler", handler_url], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    try:
        os.listdir(mp / "w")
        res["delvefs_create_per_s"] = creates(mp / "w", n, "e")
        res["delvefs_unlink_per_s"] = unlinks(mp / "w", n, "e")
        res["delvefs_dd_s"] = dd(src, mp / "w/big.bin")
        head = client.head_object(Bucket=BUCKET, Key="delve/big.bin")
        assert head["ContentLength"] == src.stat().st_size
        log(f"delvefs: create {res['delvefs_create_per_s']:.0f}/s, unlink {res['delvefs_unlink_per_s']:.0f}/s, "
            f"dd 1 GiB {res['delvefs_dd_s']:.2f} s")
    finally:
        subprocess.run([DELVEFS, "umount", str(mp)], env=env, check=False)
        if mounted_fstype(str(mp)):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])


def bench_s3fs(env, work: Path, src: Path, n: int, res: dict):
    pw = work / "s3fs.passwd"
    pw.write_text(f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}\n")
    pw.chmod(0o600)
    mp = work / "s3fs-mnt"
    mp.mkdir()
    subprocess.run(["s3fs", BUCKET, str(mp), "-o", f"url={env['AWS_ENDPOINT_URL']},use_path_request_style,"
                    f"passwd_file={pw}"], check=True)
    wait_for(lambda: mounted_fstype(str(mp)) is not None, 30, "s3fs mount")
    try:
        d = mp / "s3fs"
        d.mkdir(exist_ok=True)
        res["s3fs_create_per_s"] = creates(d, n, "e")
        res["s3fs_unlink_per_s"] = unlinks(d, n, "e")
        res["s3fs_dd_s"] = dd(src, d / "big.bin")
        log(f"s3fs: create {res['s3fs_create_per_s']:.0f}/s, unlink {res['s3fs_unlink_per_s']:.0f}/s, "
            f"dd 1 GiB {res['s3fs_dd_s']:.2f} s")
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)])


def table(res: dict) -> str:
    mib = res["big_mib"]
    rows = []

    def row(what, ref, target, delve, s3fs, unit, higher_better=True):
        def fmt(v):
            return "—" if v is None else (f"{v:.0f} {unit}" if unit != "s" else f"{v:.2f} s")
        ratio = None if delve is None or ref is None else (delve / ref if higher_better else ref / delve)
        vs3 = None if delve is None or s3fs is None else (delve / s3fs if higher_better else s3fs / delve)
        rows.append(f"| {what} | {fmt(ref)} | {fmt(delve)} | {fmt(s3fs)} | "
                    f"{'—' if ratio is None else f'{ratio:.2f}×'} (≥ {target}×) | "
                    f"{'—' if vs3 is None else f'{vs3:.1f}×'} |")
    row("create + close, empty files", res.get("boto3_put_per_s"), 0.7, res.get("delvefs_create_per_s"),
        res.get("s3fs_create_per_s"), "/s")
    row("unlink", res.get("boto3_delete_per_s"), 0.7, res.get("delvefs_unlink_per_s"),
        res.get("s3fs_unlink_per_s"), "/s")
    thr = {k: (mib / res[k] if res.get(k) else None) for k in ("boto3_write_upload_s", "delvefs_dd_s", "s3fs_dd_s")}
    row(f"dd {mib} MiB bs=1M + close", thr["boto3_write_upload_s"], 0.8, thr["delvefs_dd_s"],
        thr["s3fs_dd_s"], "MiB/s")
    head = ("| operation | reference (boto3) | DelveFS | s3fs | DelveFS / reference (target) | DelveFS / s3fs |\n"
            "|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--skip-s3fs", action="store_true")
    ap.add_argument("--only", help="comma-separated parts: boto3,delvefs,s3fs")
    args = ap.parse_args(argv)
    BASE.mkdir(parents=True, exist_ok=True)
    res: dict = {"files": args.files, "big_mib": args.big_mib}
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
        from eventhandler.testing import HandlerProcess
        handler = HandlerProcess(svc.env(), work / "handler-state", token="bench")
        handler.start()
        env["DELVEFS_HANDLER_TOKEN"] = "bench"
        try:
            parts = [("boto3", lambda: bench_boto3(client, work, src, args.files, res)),
                     ("delvefs", lambda: bench_delvefs(env, work, handler.url, src, args.files, res, client))]
            if not args.skip_s3fs:
                parts.append(("s3fs", lambda: bench_s3fs(env, work, src, args.files, res)))
            run_parts(parts, args.only, res)
        finally:
            handler.close()
            clear_bucket(client)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "mount-write.json"
    out.write_text(json.dumps(res, indent=2))
    log(f"results: {out}")
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
