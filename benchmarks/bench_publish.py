"""Atomic directory publish against separate files, end to end: a writer mount produces 20
files, and a subscriber (``delvefs watch`` on another mount of the view) prints them.

    .venv/bin/python -m benchmarks.bench_publish [--files 20] [--rounds 10]

Each round, taking turns:
  * **directory**: the 20 files are written into a scratch directory ``.tmp-dN`` of the view
    (nothing is uploaded), then ``rename`` to ``dN``: the mount uploads the 20 files (16 at a
    time) with the batch id, then the manifest; the handler shows them in one commit;
  * **separate**: the 20 files are written straight into ``fN/`` (each close uploads one).
Measured from the first write to the subscriber printing the last of the 20 files (the time
a pipeline's next stage waits), and the *spread*: from the first of the 20 printed to the
last (how long a subscriber could see a part of the result). Markdown table on stdout
(docs/PERFORMANCE.md, "## Atomic directory publish"); JSON in benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.devtools.localservices import LocalServices
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import BASE, DELVEFS, RESULTS, log

BUCKET = "bench-publish"


def clear_bucket(client) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objs:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": objs})


class Watch:
    """``delvefs watch`` of a view directory; the time each path was printed."""

    def __init__(self, view_dir: Path, env: dict):
        self.proc = subprocess.Popen([DELVEFS, "watch", str(view_dir)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        line = self.proc.stderr.readline()  # "delvefs watch: watching ...": following the stream
        if "watching" not in line:
            raise RuntimeError(f"delvefs watch: {line}")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.lock:
                self.seen[line.strip()] = time.perf_counter()

    def times(self, paths: list[str]) -> list[float] | None:
        with self.lock:
            found = [self.seen.get(p) for p in paths]
        return None if None in found else found

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def mount(env, work: Path, name: str) -> Path:
    """A mount of view ``out`` (keys out/d* and out/f*: a directory ``.tmp-dN`` is scratch)."""
    views = work / "views.yaml"
    views.write_text(f'out:\n  bucket: {BUCKET}\n  object: "out/[df]*"\n  writable: true\n  ttl: 60s\n')
    mp = work / name
    mp.mkdir()
    r = subprocess.run([DELVEFS, "mount", str(views), str(mp), "--cache-dir", str(work / f"{name}-cache")],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr)
    os.listdir(mp / "out")
    return mp


def write_files(d: Path, n: int, payload: bytes) -> None:
    for i in range(n):
        (d / f"part-{i:02d}.txt").write_bytes(payload)


def one_round(kind: str, r: int, out: Path, seen_in: Path, watch: Watch, n: int,
              payload: bytes) -> dict:
    """One round: the files written in ``out`` (the writer's), their paths printed by
    ``watch`` of ``seen_in`` (the reader's view directory)."""
    name = f"{'d' if kind == 'directory' else 'f'}{r:03d}"
    paths = [str(seen_in / name / f"part-{i:02d}.txt") for i in range(n)]
    t0 = time.perf_counter()
    if kind == "directory":
        tmp = out / f".tmp-{name}"
        tmp.mkdir()
        write_files(tmp, n, payload)
        t_rename = time.perf_counter()
        os.rename(tmp, out / name)
        rename_s = time.perf_counter() - t_rename
    else:
        (out / name).mkdir()
        write_files(out / name, n, payload)
        rename_s = None
    written = time.perf_counter() - t0
    times = wait_for_times(watch, paths)
    return {"kind": kind, "end_to_end_s": max(times) - t0, "spread_s": max(times) - min(times),
            "write_s": written, "rename_s": rename_s}


def wait_for_times(watch: Watch, paths: list[str], timeout: float = 120) -> list[float]:
    deadline = time.monotonic() + timeout
    while True:
        times = watch.times(paths)
        if times is not None:
            return times
        if time.monotonic() > deadline:
            raise RuntimeError(f"the subscriber did not print {paths[0]} ... within {timeout} s")
        time.sleep(0.002)


def summary(rows: list[dict], kind: str, field: str) -> tuple[float, float]:
    values = sorted(r[field] for r in rows if r["kind"] == kind)
    return statistics.median(values), values[min(len(values) - 1, int(len(values) * 0.9))]


def table(res: dict) -> str:
    rows = res["rounds_data"]
    n = res["files"]
    out = ["| publish of {n} files ({size} B each) | end to end, median (p90) | subscriber sees a part of it for, median (p90) | writer's own time, median |".format(n=n, size=res["size"]),
           "|---|---|---|---|"]
    for kind, what in (("directory", "a directory: write into `.tmp-dN/`, `mv` to `dN/`"),
                       ("separate", f"{n} separate files written into `fN/`")):
        e, ep = summary(rows, kind, "end_to_end_s")
        s, sp = summary(rows, kind, "spread_s")
        w = statistics.median(r["write_s"] for r in rows if r["kind"] == kind)
        out.append(f"| {what} | {e * 1000:.0f} ms ({ep * 1000:.0f} ms) | {s * 1000:.1f} ms ({sp * 1000:.1f} ms) | {w * 1000:.0f} ms |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--size", type=int, default=4096, help="bytes per file")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args(argv)
    BASE.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(args.size)
    res: dict = {"files": args.files, "size": args.size, "rounds": args.rounds, "rounds_data": []}
    with LocalServices(BASE / "services") as svc, tempfile.TemporaryDirectory(prefix="bench-publish-") as d:
        work = Path(d)
        os.environ.update(svc.env())
        client = make_client()
        ensure_bucket(client, BUCKET)
        clear_bucket(client)
        wire_notifications(client, BUCKET, svc.minio.notify_arn)
        from eventhandler.devtools import HandlerProcess
        handler = HandlerProcess(svc.env(), work / "handler-state", token="bench")
        handler.start()
        env = {**os.environ, **svc.env(), "DELVEFS_STATE_HOME": str(work / "state"),
               "DELVEFS_HANDLER_URL": handler.url, "DELVEFS_HANDLER_TOKEN": "bench"}
        mps, watch = [], None
        try:
            writer = mount(env, work, "writer")
            mps.append(writer)
            reader = mount(env, work, "reader")
            mps.append(reader)
            time.sleep(2)  # the mounts' boto3 clients are made after they are ready
            watch = Watch(reader / "out", env)
            for r in range(args.rounds):
                for kind in (("directory", "separate") if r % 2 == 0 else ("separate", "directory")):
                    row = one_round(kind, r, writer / "out", reader / "out", watch, args.files,
                                    payload)
                    res["rounds_data"].append(row)
                    log(f"round {r} {kind}: end to end {row['end_to_end_s'] * 1000:.0f} ms, "
                        f"spread {row['spread_s'] * 1000:.1f} ms")
        finally:
            if watch is not None:
                watch.close()
            for mp in mps:
                subprocess.run([DELVEFS, "umount", str(mp)], env=env, check=False)
                if mounted_fstype(str(mp)):
                    subprocess.run(["fusermount3", "-u", "-z", str(mp)])
            handler.close()
            clear_bucket(client)
    save(res)
    return 0


def save(res: dict) -> None:
    """The results as JSON in benchmarks/results/, the table on stdout."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "publish.json").write_text(json.dumps(res, indent=2))
    log(f"results: {RESULTS / 'publish.json'}")
    print(table(res))


if __name__ == "__main__":
    sys.exit(main())
