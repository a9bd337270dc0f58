"""Seeded random operations through a real mount, against a local directory as the model.

The same sequence of create / write / append / truncate / rename (files and directories)
/ unlink / mkdir / rmdir / read is applied to a local temp directory and to a directory of
a mounted view (real MinIO, RabbitMQ, handler, FUSE). Each operation must have the same
outcome (success, the same errno, the same bytes read); after each batch the two trees are
compared (names, types, sizes, content), and at the end S3 itself: at once in strict mode
(close uploads), after `delvefs sync` in eager mode. A failure names the seed, the
operation and the ones before it; `DELVEFS_RANDOM_OPS_SEED` runs another seed. Sequences
it found failing are kept, reduced, in ``REDUCED`` below.
"""
from __future__ import annotations

import errno
import hashlib
import os
import random

import pytest

from .mounts import handler, listdir, mounts  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

# another seed explores other sequences: DELVEFS_RANDOM_OPS_SEED=7 pytest ...
SEED = int(os.environ.get("DELVEFS_RANDOM_OPS_SEED", "20261123"))
OPERATIONS = 240          # per mode
BATCH = 30                # operations between two comparisons of the whole trees

KINDS = ["create", "write", "append", "truncate", "rename", "unlink", "mkdir", "rmdir",
         "read", "rename_dir"]
WEIGHTS = [20, 12, 10, 8, 10, 8, 6, 5, 15, 2]


def scan(root: str) -> tuple[list[str], dict[str, int]]:
    """Directories (relative, '' the root) and files with their sizes, sorted."""
    dirs, files = [], {}
    for here, subdirs, names in os.walk(root):
        rel = os.path.relpath(here, root)
        rel = "" if rel == "." else rel
        dirs.append(rel)
        for n in names:
            path = os.path.join(rel, n)
            files[path] = os.path.getsize(os.path.join(root, path))
    return sorted(dirs), dict(sorted(files.items()))


def data(rng: random.Random) -> bytes:
    size = rng.choice([0, rng.randrange(1, 200), rng.randrange(1000, 70_000)])
    return rng.randbytes(size)


def plan(rng: random.Random, model_root: str) -> tuple:
    """The next operation, chosen from the model's state (so the sequence depends on the
    seed alone)."""
    dirs, files = scan(model_root)
    names = list(files)
    kind = rng.choices(KINDS, WEIGHTS)[0]
    if kind in ("write", "append", "truncate", "rename", "unlink", "read") and not names:
        kind = "create"
    if kind in ("rmdir", "rename_dir") and len(dirs) == 1:
        kind = "mkdir"
    if kind == "create":
        parent = rng.choice(dirs)
        return ("create", os.path.join(parent, f"f{rng.randrange(40)}.bin"), data(rng))
    if kind == "write":
        f = rng.choice(names)
        return ("write", f, rng.randrange(files[f] + 1), data(rng))
    if kind == "append":
        return ("append", rng.choice(names), data(rng))
    if kind == "truncate":
        f = rng.choice(names)
        return ("truncate", f, rng.randrange(files[f] + 5000))
    if kind == "rename":
        src, parent = rng.choice(names), rng.choice(dirs)
        dst = os.path.join(parent, f"f{rng.randrange(40)}.bin")
        return ("rename", src, dst) if dst != src and dst not in dirs else ("read", src)
    if kind == "unlink":
        return ("unlink", rng.choice(names))
    if kind == "mkdir":
        parent = rng.choice([d for d in dirs if d.count("/") < 2])
        return ("mkdir", os.path.join(parent, f"d{rng.randrange(8)}"))
    if kind == "rmdir":
        return ("rmdir", rng.choice(dirs[1:]))
    if kind == "rename_dir":
        src = rng.choice(dirs[1:])
        targets = [d for d in dirs if d != src and not d.startswith(src + "/") and d.count("/") < 2]
        dst = os.path.join(rng.choice(targets), f"d{rng.randrange(8)}")
        if dst in dirs or dst in files or dst == src:
            return ("read", rng.choice(names)) if names else ("mkdir", dst)
        return ("rename_dir", src, dst)
    return ("read", rng.choice(names))


def apply(root: str, op: tuple):
    """Carry out ``op`` below ``root``: None, the bytes read (as a digest and length) or
    the errno name of the failure."""
    kind, path = op[0], os.path.join(root, op[1])
    try:
        if kind == "create":
            with open(path, "wb") as f:
                f.write(op[2])
        elif kind == "write":
            with open(path, "r+b") as f:
                f.seek(op[2])
                f.write(op[3])
        elif kind == "append":
            with open(path, "ab") as f:
                f.write(op[2])
        elif kind == "truncate":
            os.truncate(path, op[2])
        elif kind in ("rename", "rename_dir"):
            os.rename(path, os.path.join(root, op[2]))
        elif kind == "unlink":
            os.unlink(path)
        elif kind == "mkdir":
            os.mkdir(path)
        elif kind == "rmdir":
            os.rmdir(path)
        elif kind == "read":
            with open(path, "rb") as f:
                got = f.read()
            return len(got), hashlib.sha256(got).hexdigest()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return None


def tree(root: str) -> dict[str, object]:
    """Every entry below ``root``: directories as 'dir', files as (size, sha256)."""
    dirs, files = scan(root)
    found: dict[str, object] = {d: "dir" for d in dirs}
    for f, size in files.items():
        with open(os.path.join(root, f), "rb") as fh:
            found[f] = (size, hashlib.sha256(fh.read()).hexdigest())
    return found


def describe(op: tuple) -> str:
    return repr(tuple(f"<{len(a)} bytes>" if isinstance(a, bytes) else a for a in op))


def s3_tree(s3, bucket: str, prefix: str) -> dict[str, object]:
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            found[o["Key"][len(prefix):]] = (len(body), hashlib.sha256(body).hexdigest())
    return found


@pytest.mark.parametrize("mode", ["strict", "eager"])
def test_random_operations_match_a_local_directory_and_s3(mounts, s3, bucket, tmp_path, mode):
    mp = mounts.mount(f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: 1s
    """, *(("--eager",) if mode == "eager" else ()))
    model, mounted = str(tmp_path / "model"), str(mp / "data" / "rnd")
    os.mkdir(model)
    os.mkdir(mounted)
    rng = random.Random(SEED)
    done: list[tuple] = []
    for n in range(OPERATIONS):
        op = plan(rng, model)
        expected, got = apply(model, op), apply(mounted, op)
        done.append(op)
        assert got == expected, (
            f"seed {SEED}, {mode}, operation {n}: {describe(op)}: mount {got!r}, local {expected!r}; "
            f"the operations before: {[describe(o) for o in done[-12:-1]]}")
        if n % BATCH == BATCH - 1 or n == OPERATIONS - 1:
            assert tree(mounted) == tree(model), f"seed {SEED}, {mode}, after operation {n}"
    if mode == "eager":
        r = mounts.run("sync", str(mp))
        assert r.returncode == 0, r.stdout + r.stderr
    files = {k: v for k, v in tree(model).items() if v != "dir"}
    assert s3_tree(s3, bucket, "data/rnd/") == files
    assert listdir(mp / "data") == ["rnd"]


# Short sequences the random test found failing in eager mode (seeds 1, 3 and 5), reduced;
# each is repeated on fresh names because the failure depends on timing (the background
# upload of the file finishing between two operations), and applied to an eager mount and
# to a local directory (the random test covers strict mode). Found: in eager mode, truncate(2) or an open for
# appending of a file created and closed moments before fails with ENOENT, without a log
# line (create_truncate, create_read_append: a few rounds in ten); and EIO for the close
# of an append of 0 bytes right after the create (create_append_empty): the mount log
# shows `TypeError` in `WrittenFiles._write` (`entry.meta` is None: the background upload
# finished and unjournaled the file before the second close persisted it), logged as an
# unexpected error in flush. Strict mode passes. Run them with
# `pytest tests/integration/test_random_ops.py -k reduced`.
REDUCED = {
    "create_read_append": [("create", "f.bin", b"c" * 31), ("read", "f.bin"), ("append", "f.bin", b"a" * 179)],
    "create_truncate": [("create", "f.bin", b"y" * 86), ("truncate", "f.bin", 995)],
    "create_append_empty": [("create", "f.bin", b"x" * 51472), ("append", "f.bin", b"")],
    "create_rename_append": [("create", "f.bin", b"z" * 63135), ("rename", "f.bin", "g.bin"),
                             ("append", "g.bin", b"more")],
}
REPEAT = 10


def renamed(op: tuple, i: int) -> tuple:
    return tuple(a.replace(".bin", f"{i}.bin") if isinstance(a, str) else a for a in op)


@pytest.mark.parametrize("case", sorted(REDUCED))
def test_reduced_sequences_in_eager_mode(mounts, bucket, tmp_path, case):
    mp = mounts.mount(f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: 1s
    """, "--eager")
    model, mounted = tmp_path / "model", mp / "data" / case
    model.mkdir()
    mounted.mkdir()
    for i in range(REPEAT):
        for op in map(renamed, REDUCED[case], [i] * len(REDUCED[case])):
            assert apply(str(mounted), op) == apply(str(model), op), f"round {i}: {describe(op)}"
    assert tree(str(mounted)) == tree(str(model))
