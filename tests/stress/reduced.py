"""Short sequences reduced from what the stress runs found, each run on a directory of a
mounted view and on a local directory and compared (the outside-overwrite case against
docs/SEMANTICS.md's promise instead). Each is repeated on fresh names, as a failure may
depend on timing (an upload finishing between two operations).

    python -m tests.stress.reduced --mode default
    python -m tests.stress.reduced --mode eager --case unlink_then_write_past_the_end --repeat 5
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..waiting import ConditionTimeout, wait_until
from .stack import stack, views
from .workload import attempt, closed, read_all, write_all

KiB = 1024


def summary(data: bytes) -> str:
    """The bytes as runs of one byte ('a'*100 + 'b'*50): the cases write such runs, so a
    difference says whose bytes were read."""
    runs: list[list] = []
    for byte in data:
        if runs and runs[-1][0] == byte:
            runs[-1][1] += 1
        else:
            runs.append([byte, 1])
    shown = " + ".join(f"{chr(b)!r}*{n}" for b, n in runs[:6])
    return f"{len(data)} bytes: {shown}{' + ...' if len(runs) > 6 else ''}" if data else "0 bytes"


def _open(path: str, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    return os.open(path, flags, 0o644)


def _create(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read(path: str):
    with open(path, "rb") as f:
        return summary(f.read())


def _fd_state(fd: int) -> list:
    return [("fstat", attempt(lambda: os.fstat(fd).st_size)),
            ("pread", attempt(lambda: summary(read_all(fd, 0, 1 << 24))))]


def unlink_then_write_past_the_end(d: str) -> list:
    """open, write, unlink, write beyond the end through the descriptor, read it back."""
    f = os.path.join(d, "f.bin")
    fd = _open(f)
    steps = [("write", attempt(write_all, fd, b"a" * 100, 0)), ("unlink", attempt(os.unlink, f)),
             ("pwrite past the end", attempt(write_all, fd, b"b" * 100, 50)), *_fd_state(fd)]
    return steps + [("close", attempt(closed, fd))]


def unlink_then_ftruncate(d: str) -> list:
    f = os.path.join(d, "f.bin")
    fd = _open(f)
    steps = [("write", attempt(write_all, fd, b"a" * 1000, 0)), ("unlink", attempt(os.unlink, f)),
             ("ftruncate", attempt(os.ftruncate, fd, 10)), *_fd_state(fd)]
    return steps + [("close", attempt(closed, fd))]


def _write_by_path(f: str) -> None:
    """Another descriptor writes into the file and closes it (an upload)."""
    fd = os.open(f, os.O_RDWR)
    write_all(fd, b"y" * 738, 31_414)
    os.close(fd)


def write_after_fsync_and_another_writers_close(d: str) -> list:
    """open; fsync; another descriptor writes and closes; write through the first and close:
    the first descriptor's write must land (found by the stress run as ftruncate = ENOENT,
    seed 1, default mode, worker 0, ops 27-62, and reduced)."""
    f = os.path.join(d, "f.bin")
    _create(f, b"x" * 69_170)
    fd = _open(f, os.O_RDWR)
    steps = [("fsync", attempt(os.fsync, fd)), ("write by path", attempt(_write_by_path, f)),
             ("pwrite", attempt(write_all, fd, b"A" * 100, 0)), *_fd_state(fd),
             ("close", attempt(closed, fd))]
    return steps + [("read", attempt(_read, f))]


def ftruncate_after_fsync_and_another_writers_close(d: str) -> list:
    f = os.path.join(d, "f.bin")
    _create(f, b"x" * 69_170)
    fd = _open(f, os.O_RDWR)
    steps = [("fsync", attempt(os.fsync, fd)), ("write by path", attempt(_write_by_path, f)),
             ("ftruncate", attempt(os.ftruncate, fd, 78_392)), *_fd_state(fd),
             ("close", attempt(closed, fd))]
    return steps + [("read", attempt(_read, f))]


def read_through_an_open_descriptor_after_a_truncating_rewrite(d: str) -> list:
    """A descriptor open for writing; another open with O_TRUNC rewrites the file and closes;
    the first descriptor reads."""
    f = os.path.join(d, "f.bin")
    _create(f, b"o" * 118_000)
    fd = _open(f)
    steps = [("fsync", attempt(os.fsync, fd)),
             ("rewrite", attempt(_create, f, b"n" * 652)), *_fd_state(fd),
             ("close", attempt(closed, fd))]
    return steps + [("read", attempt(_read, f))]


def _append(f: str, data: bytes) -> None:
    fd = os.open(f, os.O_WRONLY | os.O_APPEND)
    try:
        write_all(fd, data, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def recreate_while_an_unlinked_descriptor_writes(d: str) -> list:
    """A descriptor of a file unlinked while open keeps writing while the name gets a new
    file (created, appended to); the old descriptor's close must leave the new file alone
    (found by the stress run as open(O_RDWR|O_CREAT) = ENOENT right after that close, seed
    2, default mode, worker 2, ops 2941-3058)."""
    f = os.path.join(d, "f.bin")
    _create(f, b"x" * 86_025)
    fd = _open(f, os.O_RDWR)
    steps = [("ftruncate", attempt(os.ftruncate, fd, 64_596)), ("unlink", attempt(os.unlink, f)),
             ("pwrite", attempt(write_all, fd, b"b" * 67_781, 652_205)),
             ("create", attempt(_create, f, b"c" * 1774)),
             ("ftruncate old", attempt(os.ftruncate, fd, 604_453)), ("read", attempt(_read, f)),
             ("fsync old", attempt(os.fsync, fd)), ("append", attempt(_append, f, b"d" * 3860)),
             ("read again", attempt(_read, f)), ("close old", attempt(closed, fd)),
             ("open", attempt(lambda: closed(os.open(f, os.O_RDWR | os.O_CREAT, 0o644))))]
    return steps + [("read at the end", attempt(_read, f))]


def read_after_a_rename_replaced_a_file_fsynced_while_open(d: str) -> list:
    """A file written past its end through a descriptor, fsync'd, then replaced by a rename
    while that descriptor is open: it reads its own file on, its old bytes included (found
    by the stress run as a pread at EOF, seed 2, default mode, worker 2, ops 10429-10504)."""
    f, other, first = os.path.join(d, "f.bin"), os.path.join(d, "g.bin"), os.path.join(d, "e.bin")
    _create(first, b"o" * 2_117_289)
    os.truncate(first, 1_610_909)
    os.rename(first, f)
    _create(other, b"g" * 29_130)
    fd = _open(f, os.O_RDWR)
    steps = [("pwrite", attempt(write_all, fd, b"w" * 3965, 925_776)), ("fsync", attempt(os.fsync, fd)),
             ("rename onto", attempt(os.rename, other, f)),
             ("pread old byte", attempt(lambda: summary(os.pread(fd, 1, 920_812)))), *_fd_state(fd),
             ("close", attempt(closed, fd))]
    return steps + [("read", attempt(_read, f))]


CASES = {f.__name__: f for f in (
    read_after_a_rename_replaced_a_file_fsynced_while_open,
    recreate_while_an_unlinked_descriptor_writes,
    unlink_then_write_past_the_end, unlink_then_ftruncate, write_after_fsync_and_another_writers_close,
    ftruncate_after_fsync_and_another_writers_close,
    read_through_an_open_descriptor_after_a_truncating_rewrite)}
OUTSIDE_CASE = "descriptor_keeps_its_version_over_an_outside_overwrite"


def outside_overwrite(st, mp: Path, i: int, ttl: float) -> str | None:
    """docs/SEMANTICS.md: a descriptor that read a file keeps reading that version after
    another client overwrote it (here with another size). None, or what went wrong."""
    key, path = f"data/outside{i}.bin", mp / "data" / f"outside{i}.bin"
    old, new = b"o" * 2367, b"n" * 1882
    st.s3.put_object(Bucket=st.bucket, Key=key, Body=old)
    try:
        wait_until(lambda: path.exists() and path.read_bytes() == old, ttl + 20, "the object")
    except ConditionTimeout as exc:
        return str(exc)
    fd = os.open(path, os.O_RDONLY)
    try:
        first = read_all(fd, 0, 1 << 20)
        st.s3.put_object(Bucket=st.bucket, Key=key, Body=new)
        try:
            wait_until(lambda: path.read_bytes() == new, ttl + 20, "the new version")
        except ConditionTimeout as exc:
            return str(exc)
        again = read_all(fd, 0, 1 << 20)
        if first != old or again != old:
            return (f"the descriptor read {summary(first)} first, {summary(again)} after the overwrite "
                    f"(old version {summary(old)}, new {summary(new)})")
        return None
    finally:
        os.close(fd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.stress.reduced", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["default", "eager"], default="default")
    ap.add_argument("--case", action="append", choices=[*CASES, OUTSIDE_CASE], help="default: all")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ttl", type=float, default=1.0)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"delvefs-reduced-{args.mode}-"))
    failed: dict[str, list] = {}
    with stack(work) as st:
        mp = st.mount(views(st.bucket, args.ttl), *(["--eager"] if args.mode == "eager" else []))
        for name in args.case or [*CASES, OUTSIDE_CASE]:
            for i in range(args.repeat):
                if name == OUTSIDE_CASE:
                    problem = outside_overwrite(st, mp, i, args.ttl)
                    if problem:
                        failed.setdefault(name, []).append({"round": i, "problem": problem})
                    continue
                mounted, local = mp / "data" / f"{name}-{i}", work / "reference" / f"{name}-{i}"
                mounted.mkdir(parents=True)
                local.mkdir(parents=True)
                got, want = CASES[name](str(mounted)), CASES[name](str(local))
                if got != want:
                    failed.setdefault(name, []).append(
                        {"round": i, "differ": [(g[0], g[1], w[1]) for g, w in zip(got, want) if g != w]})
            print(f"{'FAILS' if name in failed else 'ok   '} {name} ({len(failed.get(name, []))}/{args.repeat})",
                  flush=True)
        r = st.run("sync", str(mp))
        print(f"delvefs sync: exit {r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
        r = st.umount(mp, check=False)
        print(f"delvefs umount: exit {r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
    for name, rounds in failed.items():
        print(f"--- {name} ({args.mode}): first failing round, (step, mount, local):")
        print(json.dumps(rounds[0], indent=1))
    print(f"work dir: {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
