"""Trees of small files: untar, ``tar c`` and ``rm -rf`` of a real source tree (the Python
standard library of this venv's Python: ~2,450 files, ~100 MB) through DelveFS (strict and
eager), the floor (benchmarks/floorfs.py, without and with the writeback cache), s3fs-fuse
and sequential boto3 requests, on the same MinIO, in one run — pinned to CPU 0 and
unpinned (``--cpus``), one table each.

    .venv/bin/python -m benchmarks.bench_tree [--files N] [--only local,boto3,floor,strict,eager,s3fs]
                                              [--cpus both|pinned|unpinned]
                                              [--save NAME] [--baseline NAME] [--plot docs/tree-small-files.png]
                                              [--eager-opts passthrough=rw]

Rows (docs/PERFORMANCE.md, "## Trees of small files"):
  * untar into a view: strict (each close uploads), eager (close returns once the file is
    in the local journal) and eager + ``delvefs sync`` (until S3 has every file);
  * ``tar c`` of the tree back (piped to ``wc -c``), from a fresh mount (nothing cached);
  * ``rm -rf``: strict, eager, eager + ``delvefs sync``;
compared with the local disk, with boto3 put_object / get_object / delete_object of the
same files one after the other, and with the floor: the same commands on a pyfuse3 file
system that keeps names, sizes and modes in memory (what the kernel, the binding and the
machine cost; the strict rows compare with it as it is, the eager rows with it using the
kernel's writeback cache as eager mounts do). ``--save NAME`` keeps the results as
``benchmarks/results/tree-NAME.json``; ``--baseline NAME`` adds that run's DelveFS strict
numbers as a column (the same benchmark run on the code of HEAD: docs/PERFORMANCE.md;
its run of the same CPU mode, else the one it has).
``--eager-opts OPTS`` mounts the eager part with ``-o OPTS`` (``passthrough=rw``: the kernel
writes the files itself instead of through its writeback cache; compare with the floor
without it). The tar is built once and cached in ~/.cache/delvefs/bench-tree/.
After the tables, where the CPU went (benchmarks/cpusplit.py) during boto3's PUTs and
during the eager untar + sync: the mount, MinIO, RabbitMQ, the handler, the rest, and how
busy the machine was — an untar + sync that keeps both CPUs busy is bound by their sum.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype
from delvefs.devtools.localservices import LocalServices
from delvefs.shared.s3 import ensure_bucket, make_client, wire_notifications

from .bench_mount import DELVEFS, RESULTS, log, wait_for
from .cpusplit import cpu_snapshot, cpu_split, describe
from .mounting import CPU_MODES, FloorMount, add_cpu_option, cpu_mode, cpu_modes, mount_s3fs

BASE = Path(os.environ.get("DELVEFS_BENCH_TREE_DIR", Path.home() / ".cache/delvefs/bench-tree"))
BUCKET = "bench-tree"
PARTS = ("local", "boto3", "floor", "strict", "eager", "s3fs")
FLOORS = (("floor", ()), ("floorwb", ("--writeback",)))  # as strict, as eager mounts
SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def source_tar(files: int | None) -> Path:
    """The standard library as one tar (at most ``files`` files), built once."""
    tar = BASE / f"stdlib-{files or 'all'}.tar"
    if tar.exists():
        return tar
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen = []
    for here, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        chosen += [Path(here) / n for n in sorted(names) if (Path(here) / n).is_file()
                   and not (Path(here) / n).is_symlink()]
    chosen = chosen[:files] if files else chosen
    BASE.mkdir(parents=True, exist_ok=True)
    partial = tar.with_suffix(".partial")
    with tarfile.open(partial, "w") as t:
        for p in chosen:
            t.add(p, arcname=f"stdlib/{p.relative_to(root)}", recursive=False)
    partial.rename(tar)
    return tar


def timed(*cmd: str, cwd=None, env=None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-500:]}")
    return took


def tree_ops(target: Path, tar: Path, res: dict, name: str, remount=None, env=None) -> Path:
    """untar into ``target``; ``remount()`` (a fresh mount; returns the new target) before
    ``tar c``; the timings into ``res`` as NAME_untar_s, NAME_tarc_s. Returns the target."""
    target.mkdir(parents=True, exist_ok=True)
    res[f"{name}_untar_s"] = timed("tar", "-x", "-f", str(tar), "-C", str(target), env=env)
    log(f"{name}: untar {res[f'{name}_untar_s']:.2f} s")
    if remount is not None:
        target = remount()
    res[f"{name}_tarc_s"] = timed("sh", "-c", f'tar -c -f - -C "{target}" stdlib | wc -c > /dev/null')
    log(f"{name}: tar c {res[f'{name}_tarc_s']:.2f} s")
    return target


def count_keys(client, prefix: str) -> int:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sum(1 for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/"))


def clear(client, prefix: str = "") -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys, "Quiet": True})


# --- the parts ---

def bench_local(work: Path, tar: Path, res: dict) -> None:
    d = tree_ops(work / "local", tar, res, "local")
    res["local_rm_s"] = timed("rm", "-rf", str(d / "stdlib"))
    log(f"local: rm -rf {res['local_rm_s']:.2f} s")


def bench_boto3(client, work: Path, tar: Path, res: dict) -> None:
    src = work / "boto3-src"
    src.mkdir()
    subprocess.run(["tar", "-x", "-f", str(tar), "-C", str(src)], check=True)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    keys = [f"boto3/{p.relative_to(src)}" for p in files]
    before, t = cpu_snapshot(), time.perf_counter()
    for p, k in zip(files, keys):
        client.put_object(Bucket=BUCKET, Key=k, Body=p.read_bytes())
    res["boto3_put_s"] = time.perf_counter() - t
    res["boto3_put_cpu"] = cpu_split(before, cpu_snapshot())
    t = time.perf_counter()
    for k in keys:
        client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
    res["boto3_get_s"] = time.perf_counter() - t
    t = time.perf_counter()
    for k in keys:
        client.delete_object(Bucket=BUCKET, Key=k)
    res["boto3_delete_s"] = time.perf_counter() - t
    res["files"] = len(files)
    res["bytes"] = sum(p.stat().st_size for p in files)
    shutil.rmtree(src)
    log(f"boto3: {len(files)} files, put {res['boto3_put_s']:.2f} s, get {res['boto3_get_s']:.2f} s, "
        f"delete {res['boto3_delete_s']:.2f} s")


def bench_floor(work: Path, tar: Path, res: dict) -> None:
    for name, options in FLOORS:
        floor = FloorMount(work / f"{name}-mnt", "--state", str(work / f"{name}.json"), *options)
        floor.mount()
        try:
            d = tree_ops(floor.mountpoint, tar, res, name, functools.partial(remount_floor, floor))
            res[f"{name}_rm_s"] = timed("rm", "-rf", str(d / "stdlib"))
            log(f"{name}: rm -rf {res[f'{name}_rm_s']:.2f} s")
        finally:
            floor.umount()


def remount_floor(floor: FloorMount) -> Path:
    floor.umount()  # (it keeps its tree in its --state file)
    return floor.mount()


class Delve:
    def __init__(self, env: dict, work: Path, handler_url: str):
        self.env, self.work, self.handler_url, self.n = env, work, handler_url, 0
        self.views = work / "tree-views.yaml"
        self.views.write_text("".join(f"""
{mode}:
  bucket: {BUCKET}
  object: "{mode}/*"
  ttl: 300s
""" for mode in ("strict", "eager")))
        self.mountpoint = work / "delvefs-mnt"
        self.mountpoint.mkdir()

    def mount(self, *extra: str) -> Path:
        self.n += 1
        r = subprocess.run([DELVEFS, "mount", str(self.views), str(self.mountpoint), "--cache-dir",
                            str(self.work / f"cache-{self.n}"), "--handler", self.handler_url, *extra],
                           env=self.env, capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"delvefs mount: {r.stderr}")
        return self.mountpoint

    def umount(self) -> None:
        r = subprocess.run([DELVEFS, "umount", str(self.mountpoint)], env=self.env,
                           capture_output=True, text=True)
        if mounted_fstype(str(self.mountpoint)):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)])
        if r.returncode:
            raise RuntimeError(f"delvefs umount: {r.stderr}")

    def sync(self, when_in_s3=None) -> tuple[float, float]:
        """(seconds until S3 has everything: ``sync --no-wait-handler``, then seconds more
        until the handler has it too: a plain ``sync``, what a mount started next relies on);
        ``when_in_s3()`` between the two."""
        s3 = timed(DELVEFS, "sync", "--no-wait-handler", str(self.mountpoint), env=self.env)
        if when_in_s3 is not None:
            when_in_s3()
        return s3, timed(DELVEFS, "sync", str(self.mountpoint), env=self.env)


def bench_strict(delve: Delve, client, tar: Path, res: dict) -> None:
    mp = delve.mount()
    try:
        def remount():
            delve.umount()
            return delve.mount() / "strict"
        d = tree_ops(mp / "strict", tar, res, "strict", remount)
        res["strict_rm_s"] = timed("rm", "-rf", str(d / "stdlib"))
        log(f"strict: rm -rf {res['strict_rm_s']:.2f} s")
    finally:
        delve.umount()
    assert count_keys(client, "strict/") == 0, "strict rm -rf left objects"


def bench_eager(delve: Delve, client, tar: Path, res: dict, opts: tuple = ()) -> None:
    mp = delve.mount("--eager", *opts)
    try:
        before = cpu_snapshot()

        def remount():
            res["eager_sync_s"], res["eager_sync_handler_s"] = delve.sync(
                lambda: res.update(eager_untar_sync_cpu=cpu_split(before, cpu_snapshot())))
            res["eager_untar_sync_s"] = res["eager_untar_s"] + res["eager_sync_s"]
            log(f"eager: + sync {res['eager_sync_s']:.2f} s (the handler: {res['eager_sync_handler_s']:.2f} s more)")
            uploaded = count_keys(client, "eager/")
            assert uploaded == res.get("files", uploaded), f"eager: {uploaded} objects after sync"
            res["eager_files"] = uploaded
            delve.umount()
            return delve.mount("--eager", *opts) / "eager"
        d = tree_ops(mp / "eager", tar, res, "eager", remount)
        res["eager_rm_s"] = timed("rm", "-rf", str(d / "stdlib"))
        s3, handler = delve.sync()
        res["eager_rm_sync_s"], res["eager_rm_sync_handler_s"] = res["eager_rm_s"] + s3, handler
        log(f"eager: rm -rf {res['eager_rm_s']:.2f} s, + sync {res['eager_rm_sync_s']:.2f} s "
            f"(the handler: {handler:.2f} s more)")
    finally:
        delve.umount()
    assert count_keys(client, "eager/") == 0, "eager rm -rf + sync left objects"


def bench_s3fs(env: dict, work: Path, tar: Path, res: dict) -> None:
    mp = work / "s3fs-mnt"
    mp.mkdir()

    def mount() -> Path:
        mount_s3fs(env, work, BUCKET, mp)
        return mp / "s3fs"

    def umount() -> None:
        subprocess.run(["fusermount3", "-u", str(mp)])
        wait_for(lambda: mounted_fstype(str(mp)) is None, 30, "s3fs unmounted")

    d = mount()
    try:
        def remount():
            umount()
            return mount()
        d = tree_ops(d, tar, res, "s3fs", remount)
        res["s3fs_rm_s"] = timed("rm", "-rf", str(d / "stdlib"))
        log(f"s3fs: rm -rf {res['s3fs_rm_s']:.2f} s")
    finally:
        if mounted_fstype(str(mp)):
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])


# --- the table and the plot ---

def least_eager_untar(res: dict) -> float | None:
    """What an eager untar cannot go below: the floor's requests (with the writeback cache)
    plus writing the same files to the local disk, which an eager mount does to keep each
    file until its upload (the floor keeps no bytes and creates no file)."""
    floor, local = res.get("floorwb_untar_s"), res.get("local_untar_s")
    return None if floor is None or local is None else floor + local


def table(res: dict, baseline: dict | None) -> str:
    def fmt(v):
        return "—" if v is None else f"{v:.2f} s"

    def ratio(a, b):
        return "—" if a is None or b is None else f"{a / b:.2f}×"
    g = res.get
    base = baseline or {}
    rows = [
        ("untar", g("local_untar_s"), g("boto3_put_s"), g("s3fs_untar_s"), g("floor_untar_s"),
         g("floorwb_untar_s"), g("strict_untar_s"), base.get("strict_untar_s"), g("eager_untar_s"),
         f"eager / floor with writeback {ratio(g('eager_untar_s'), g('floorwb_untar_s'))} (≤ 1.5×); "
         f"eager / local {ratio(g('eager_untar_s'), g('local_untar_s'))} (≤ 3×); "
         f"(floor with writeback + local) / floor with writeback {ratio(least_eager_untar(res), g('floorwb_untar_s'))}, "
         f"eager / (floor with writeback + local) {ratio(g('eager_untar_s'), least_eager_untar(res))}"),
        ("untar + `delvefs sync` (S3 has it)", None, g("boto3_put_s"), None, None, None, None, None,
         g("eager_untar_sync_s"),
         f"boto3 PUTs / eager+sync {ratio(g('boto3_put_s'), g('eager_untar_sync_s'))} (≥ 1.5×); "
         f"until the handler has it too: {fmt(g('eager_sync_handler_s'))} more"),
        ("`tar c` (fresh mount)", g("local_tarc_s"), g("boto3_get_s"), g("s3fs_tarc_s"), g("floor_tarc_s"),
         g("floorwb_tarc_s"), g("strict_tarc_s"), base.get("strict_tarc_s"), g("eager_tarc_s"),
         f"boto3 GETs / strict {ratio(g('boto3_get_s'), g('strict_tarc_s'))}"),
        ("`rm -rf`", g("local_rm_s"), g("boto3_delete_s"), g("s3fs_rm_s"), g("floor_rm_s"), g("floorwb_rm_s"),
         g("strict_rm_s"), base.get("strict_rm_s"), g("eager_rm_s"), ""),
        ("`rm -rf` + `delvefs sync` (S3 has it)", None, g("boto3_delete_s"), None, None, None, None, None,
         g("eager_rm_sync_s"),
         f"boto3 DELETEs / eager+sync {ratio(g('boto3_delete_s'), g('eager_rm_sync_s'))} (≥ 5×); "
         f"until the handler has it too: {fmt(g('eager_rm_sync_handler_s'))} more"),
    ]
    head = ("| operation | local disk | boto3, sequential | s3fs | floor | floor, writeback cache "
            "| DelveFS strict | strict at HEAD | DelveFS eager | ratio (target) |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    head_eager = {"untar": "eager_untar_s", "untar + `delvefs sync` (S3 has it)": "eager_untar_sync_s",
                  "`tar c` (fresh mount)": "eager_tarc_s", "`rm -rf`": "eager_rm_s",
                  "`rm -rf` + `delvefs sync` (S3 has it)": "eager_rm_sync_s"}
    lines = [head]
    for what, local, boto, s3fs, floor, floorwb, strict, head_strict, eager, note in rows:
        if strict is not None and head_strict is not None:
            note += f"{'; ' if note else ''}strict / HEAD {ratio(strict, head_strict)} (≤ 1×)"
        if eager is not None and base.get(head_eager.get(what)) is not None:
            note += f"{'; ' if note else ''}eager / HEAD {ratio(eager, base[head_eager[what]])}"
        lines.append(f"| {what} | {fmt(local)} | {fmt(boto)} | {fmt(s3fs)} | {fmt(floor)} | {fmt(floorwb)} | "
                     f"{fmt(strict)} | {fmt(head_strict)} | {fmt(eager)} | {note} |")
    return "\n".join(lines)


def ratio_table(res: dict) -> str:
    """DelveFS's times divided by the others' (below 1: DelveFS took less time). Strict
    compares with the floor as it is, eager with the floor using the writeback cache."""
    g = res.get
    rows = [("untar", "strict", "strict_untar_s", "floor_untar_s", "local_untar_s", "boto3_put_s", "s3fs_untar_s"),
            ("untar", "eager", "eager_untar_s", "floorwb_untar_s", "local_untar_s", "boto3_put_s", "s3fs_untar_s"),
            ("untar + `delvefs sync`", "eager", "eager_untar_sync_s", None, None, "boto3_put_s", None),
            ("`tar c` (fresh mount)", "strict", "strict_tarc_s", "floor_tarc_s", "local_tarc_s", "boto3_get_s",
             "s3fs_tarc_s"),
            ("`tar c` (fresh mount)", "eager", "eager_tarc_s", "floorwb_tarc_s", "local_tarc_s", "boto3_get_s",
             "s3fs_tarc_s"),
            ("`rm -rf`", "strict", "strict_rm_s", "floor_rm_s", "local_rm_s", "boto3_delete_s", "s3fs_rm_s"),
            ("`rm -rf`", "eager", "eager_rm_s", "floorwb_rm_s", "local_rm_s", "boto3_delete_s", "s3fs_rm_s"),
            ("`rm -rf` + `delvefs sync`", "eager", "eager_rm_sync_s", None, None, "boto3_delete_s", None)]
    lines = ["| operation | DelveFS | ÷ floor | ÷ local disk | ÷ boto3, sequential | ÷ s3fs |",
             "|---|---|---|---|---|---|"]
    for what, mode, delve, *others in rows:
        if g(delve) is None:
            continue
        cells = ["—" if k is None or not g(k) else f"{g(delve) / g(k):.2f}×" for k in others]
        lines.append(f"| {what} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(res: dict, baseline: dict | None, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = [("untar", "untar_s", "put_s"), ("untar + sync", "untar_sync_s", "put_s"),
           ("tar c", "tarc_s", "get_s"), ("rm -rf", "rm_s", "delete_s"),
           ("rm -rf + sync", "rm_sync_s", "delete_s")]
    systems = [("local disk", "local"), ("boto3 sequential", "boto3"), ("s3fs", "s3fs"), ("floor", "floor"),
               ("floor, writeback cache", "floorwb"),
               ("DelveFS strict (HEAD)", "head"), ("DelveFS strict", "strict"), ("DelveFS eager", "eager")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(systems)
    for i, (label, s) in enumerate(systems):
        values = []
        for _, suffix, boto in ops:
            if s == "boto3":
                v = res.get(f"boto3_{boto}")
            elif s == "head":
                v = (baseline or {}).get(f"strict_{suffix}")
            else:
                v = res.get(f"{s}_{suffix}")
            values.append(v if v is not None else 0)
        ax.bar([j + i * width for j in range(len(ops))], values, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ops))], [o[0] for o in ops])
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log scale)")
    ax.set_title(f"{res.get('files', '?')} files, {res.get('bytes', 0) / 2**20:.0f} MiB "
                 "(Python standard library), MinIO on loopback")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


@contextlib.contextmanager
def services(prefix: str, base: Path = BASE, s3_endpoint=None):
    """The benchmark's setting: local MinIO and RabbitMQ (their data in ``base``), its bucket
    (emptied, wired) and a handler, in a work directory: (work, the mounts' environment, an
    S3 client, the handler). ``s3_endpoint(work, MinIO's URL)``, when given, returns the S3
    URL of the handler and of the mounts' environment (e.g. a link at a distance); the
    client returned stays on MinIO's own."""
    with LocalServices(base / "services") as svc, tempfile.TemporaryDirectory(prefix=prefix) as d:
        work = Path(d)
        far = {"AWS_ENDPOINT_URL": s3_endpoint(work, svc.minio.endpoint)} if s3_endpoint else {}
        env = {**os.environ, **svc.env(), "DELVEFS_STATE_HOME": str(work / "state"),
               "DELVEFS_HANDLER_TOKEN": "bench", **far}
        os.environ.update(svc.env())
        client = make_client(max_pool=16)
        ensure_bucket(client, BUCKET)
        clear(client)
        wire_notifications(client, BUCKET, svc.minio.notify_arn)
        from eventhandler.devtools import HandlerProcess
        handler = HandlerProcess({**svc.env(), **far}, work / "handler-state", token="bench")
        handler.start()
        try:
            yield work, env, client, handler
        finally:
            handler.close()
            clear(client)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=None, help="only the first N files of the tree")
    ap.add_argument("--only", help="comma-separated parts: " + ",".join(PARTS))
    ap.add_argument("--save", metavar="NAME", help="keep the results as results/tree-NAME.json")
    ap.add_argument("--baseline", metavar="NAME", help="compare with results/tree-NAME.json")
    ap.add_argument("--plot", metavar="PNG", help="write a bar chart (of the last CPU mode run)")
    ap.add_argument("--eager-opts", metavar="OPTS", default="",
                    help="mount options of the eager part (-o OPTS), e.g. passthrough=rw")
    add_cpu_option(ap)
    args = ap.parse_args(argv)
    parts = [p for p in (args.only.split(",") if args.only else PARTS) if p in PARTS]
    modes = cpu_modes(args.cpus)
    tar = source_tar(args.files)
    with tarfile.open(tar) as t:
        members = [m for m in t.getmembers() if m.isfile()]
    tree = {"files": len(members), "bytes": sum(m.size for m in members)}
    results: dict = dict(tree, eager_opts=args.eager_opts)
    log(f"tree: {tree['files']} files, {tree['bytes'] / 2**20:.1f} MiB ({tar})")
    with services("bench-tree-") as (work, env, client, handler):
        for mode in modes:
            log(f"--- {CPU_MODES[mode]}")
            res = results[mode] = dict(tree)
            here = work / mode
            here.mkdir()
            delve = Delve(env, here, handler.url)
            with cpu_mode(mode):
                for part in parts:
                    try:
                        if part == "local":
                            bench_local(here, tar, res)
                        elif part == "boto3":
                            bench_boto3(client, here, tar, res)
                        elif part == "floor":
                            bench_floor(here, tar, res)
                        elif part == "strict":
                            bench_strict(delve, client, tar, res)
                        elif part == "eager":
                            bench_eager(delve, client, tar, res,
                                        ("-o", args.eager_opts) if args.eager_opts else ())
                        elif part == "s3fs":
                            bench_s3fs(env, here, tar, res)
                    except Exception as exc:  # noqa: BLE001 — recorded; the other parts still run
                        log(f"{part} failed: {exc}")
                        res[f"{part}_error"] = str(exc)
            clear(client)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"tree-{args.save or 'last'}.json"
    out.write_text(json.dumps(results, indent=2))
    log(f"results: {out}")
    saved = json.loads((RESULTS / f"tree-{args.baseline}.json").read_text()) if args.baseline else None
    for mode in modes:
        # a baseline saved before the CPU modes is one unpinned run
        baseline = None if saved is None else (saved.get(mode) or saved.get("unpinned") or saved.get("pinned")
                                               or saved)
        print(f"\n{CPU_MODES[mode]}:\n")
        print(table(results[mode], baseline))
        print()
        print(ratio_table(results[mode]))
        for what, key in (("boto3's PUTs", "boto3_put_cpu"), ("eager untar + sync", "eager_untar_sync_cpu")):
            if results[mode].get(key):
                print(f"\n{what}: {describe(results[mode][key])}")
    if args.plot:
        plot(results[modes[-1]], baseline, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
