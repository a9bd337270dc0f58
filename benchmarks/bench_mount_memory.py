"""Client memory with a huge view: RSS of the mount process after ``ls -l`` of a view of
N (default 1,000,000) files.

    .venv/bin/python -m benchmarks.bench_mount_memory [--objects 1000000]

The listing comes from a stand-in handler that serves docs/API.md pages of N synthetic
objects (putting a million real objects into MinIO takes hours on a small machine; the
client cannot tell the difference: it only sees the handler's pages). MinIO is real (the
mount checks the bucket and signs the proof). ``ls -l`` makes the kernel look up every
entry, so every file ends up with a node *and* an inode-table slot: the worst case.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
from aiohttp import web

from delvefs.devtools.localservices import LocalServices, free_port
from delvefs.shared.s3 import ensure_bucket, make_client

from benchmarks.bench_mount import DELVEFS, RESULTS, log, rss_mib

BUCKET = "synthetic"


def synthetic_app(n: int) -> web.Application:
    def key(i):
        return f"files/run-{i // 1000:04d}-sample-{i:07d}.fastq"

    async def health(request):
        return web.json_response({"status": "ok"})

    async def register(request):
        body = await request.json()
        return web.json_response({"views": [{"name": v["name"], "id": "syn", "version": 1}
                                            for v in body["views"]]})

    async def objects(request):
        after = request.query.get("after")
        limit = int(request.query.get("limit", 5000))
        start = 0 if after is None else int(after.rsplit("-", 1)[1].split(".")[0]) + 1
        stop = min(n, start + limit)
        objs = [{"key": key(i), "size": 1000 + i % 5000, "mtime": 1.7e9 + i,
                 "etag": f"{i:032x}"} for i in range(start, stop)]
        body = {"version": 1, "objects": objs, "next": key(stop - 1) if stop < n else None}
        return web.Response(body=msgpack.packb(body), content_type="application/msgpack")

    async def changes(request):
        return web.Response(body=msgpack.packb({"version": 1, "changes": [], "more": False}),
                            content_type="application/msgpack")

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/v1/views", register)
    app.router.add_get("/v1/views/{id}/objects", objects)
    app.router.add_get("/v1/views/{id}/changes", changes)
    return app


def serve_in_thread(app, port):
    loop = asyncio.new_event_loop()

    def run():
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()
    threading.Thread(target=run, daemon=True).start()


def mount_and_list(work: Path, env: dict, views_yaml: str, view: str, handler_url: str, *,
                   expect: int, repeat_ls: int = 2) -> dict:
    """Mount ``views_yaml`` (against ``handler_url``) in ``work``, ``ls -l`` the view directory
    ``view`` ``repeat_ls`` times (it must hold ``expect`` files), unmount: the mount's RSS
    idle and after listing, and each ``ls -l``'s time."""
    res = {}
    work.mkdir(parents=True, exist_ok=True)
    views = work / "views.yaml"
    views.write_text(views_yaml)
    mp = work / "mnt"
    mp.mkdir()
    subprocess.run([DELVEFS, "mount", str(views), str(mp), "--cache-dir", str(work / "cache"),
                    "--handler", handler_url], env=env, check=True)
    try:
        pid = int(subprocess.run(["pgrep", "-f", f"delvefs mount .* {mp} --foreground"],
                                 capture_output=True, text=True).stdout.split()[0])
        res["rss_mounted_mib"] = rss_mib(pid)
        for i in range(repeat_ls):
            t0 = time.perf_counter()
            r = subprocess.run(["ls", "-l", str(mp / view)], stdout=subprocess.PIPE, check=True)
            dt = time.perf_counter() - t0
            lines = r.stdout.count(b"\n") - 1
            res[f"ls_l_{i}_s"] = dt
            log(f"ls -l #{i}: {dt:.2f} s, {lines} entries, RSS {rss_mib(pid):.0f} MiB")
        assert lines == expect, lines
        res["rss_listed_mib"] = rss_mib(pid)
    finally:
        subprocess.run([DELVEFS, "umount", str(mp)], env=env)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--repeat-ls", type=int, default=2)
    args = ap.parse_args(argv)
    res = {"objects": args.objects}
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as d, LocalServices(Path(d) / "svc") as svc:
        work = Path(d)
        os.environ.update(svc.env())
        ensure_bucket(make_client(), BUCKET)
        port = free_port()
        serve_in_thread(synthetic_app(args.objects), port)
        time.sleep(0.5)
        env = {**os.environ, "DELVEFS_STATE_HOME": str(work / "state")}
        res.update(mount_and_list(work, env, f"syn:\n  bucket: {BUCKET}\n  object: \"files/*\"\n  ttl: 3600s\n",
                                  "syn", f"http://127.0.0.1:{port}", expect=args.objects,
                                  repeat_ls=args.repeat_ls))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"mount-memory-{args.objects}.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
