"""One stress worker, a process of its own: seeded random operations on its own directory
of the mount, each mirrored at once on a local directory (the reference), with the two
outcomes compared (success or the same errno, the same bytes read, the same sizes).

Files are opened and kept open (several descriptors at a time, also on one file), written
at random offsets (holes included), truncated, renamed and unlinked while descriptors
still hold them, fsynced, closed and reopened. The next operation is chosen from the
reference's state and the worker's random generator only, so a seed replays the same
sequence (as far as the time bound lets it run: ``--ops`` fixes the length).

A path whose outcomes differed once is *tainted*: the worker leaves it alone from then on
(its descriptors are closed) — one finding, not a cascade — and the final comparison skips
it unless only a read disagreed (then the reference still says what it must hold).

A share of the operations (``shared_share``) goes to a directory all workers share, on the
mount only: races between processes on the same names, without a model. There only the
errors count (ENOENT is a race lost, anything else a finding); the end compares what S3 and
the mount hold there.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import time
import traceback
from dataclasses import dataclass

SUBDIRS = ("d0", "d1")
NAMES = ([f"f{i}.bin" for i in range(8)]
         + [f"{d}/f{i}.bin" for d in SUBDIRS for i in range(4)])
SHARED_NAMES = [f"s{i}.bin" for i in range(6)]
MAX_SIZE = 12 << 20          # a file never grows beyond this (a few cross the 8 MiB part size)
MAX_HANDLES = 6

# operation -> weight
OPERATIONS = {
    "create": 10, "open": 7, "pwrite": 12, "pwrite_path": 7, "append": 4, "pread": 8,
    "read": 9, "truncate": 4, "ftruncate": 4, "fsync": 4, "close": 7, "reopen": 4,
    "rename": 6, "unlink": 5, "unlink_while_open": 3, "stat": 4, "fstat": 3, "listdir": 3,
    "save": 0,  # (off unless --weights gives it one: the seeds' sequences stay as they were)
}
# operations that change nothing: a path they disagree on keeps its expected content
READ_ONLY = {"read", "pread", "fstat", "stat", "listdir"}
HANDLE_OPERATIONS = {"pwrite", "pread", "ftruncate", "fsync", "close", "reopen", "fstat"}
PATH_OPERATIONS = {"pwrite_path", "append", "read", "truncate", "rename", "unlink", "stat"}
SAVE_MAX = 200_000  # bytes of a save: many small ones


def errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else repr(exc)


def attempt(action, *args):
    """``action(*args)``'s value, or the errno name of its OSError."""
    try:
        return action(*args)
    except OSError as exc:
        return errname(exc)


def summary(data: bytes) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()[:16]


def write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if offset is not None:
            offset += n
        view = view[n:]


def read_all(fd: int, offset: int, length: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def closed(fd: int) -> None:
    os.close(fd)


def open_write_close(path: str, flags: int, data: bytes, offset: int | None) -> None:
    """open + write + close, the first error of any of them (close's counts: it uploads)."""
    fd = os.open(path, flags, 0o644)
    failure = None
    try:
        write_all(fd, data, offset)
    except OSError as exc:
        failure = exc
    try:
        os.close(fd)
    except OSError as exc:
        failure = failure or exc
    if failure:
        raise failure


def write_fsync_close(path: str, data: bytes) -> None:
    """A new file: create (truncating), write, fsync (in eager mode: uploaded now), close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> tuple[int, str]:
    with open(path, "rb") as f:
        return summary(f.read())


def file_size(path: str):
    st = os.stat(path)
    return ("file" if os.path.isfile(path) else "other", st.st_size)


@dataclass
class Handle:
    id: int            # the worker's serial number of the descriptor pair (in the log)
    path: str | None   # its name now (renames followed); None once unlinked or replaced
    mount_fd: int
    ref_fd: int


class Worker:
    def __init__(self, config: dict):
        self.index = config["index"]
        self.seed = config["seed"]
        self.rng = random.Random(f"{self.seed}-worker-{self.index}")
        self.mount_dir = config["mount_dir"]
        self.ref_dir = config["ref_dir"]
        self.shared_dir = config.get("shared_dir")
        self.shared_share = config.get("shared_share", 0.0) if self.shared_dir else 0.0
        self.deadline = config["deadline"]
        self.max_ops = config.get("max_ops") or float("inf")
        left_out = set(config.get("without") or ())
        weights = {**OPERATIONS, **(config.get("weights") or {})}
        self.operations = {op: w for op, w in weights.items() if op not in left_out and w > 0}
        self.log = open(config["log_path"], "w", buffering=1)
        self.handles: list[Handle] = []
        self.tainted: set[str] = set()
        self.unknown: set[str] = set()  # tainted by an operation that changes it: state unknown
        self.mismatches: list[dict] = []
        self.shared_errors: list[dict] = []
        self.counts: dict[str, int] = {}
        self.ops = 0
        self.op: dict = {}
        self.handle_serial = 0

    # --- the loop ---

    def run(self) -> dict:
        for d in ("", *SUBDIRS):
            self.compare({"op": "mkdir", "path": d},
                         attempt(os.makedirs, os.path.join(self.mount_dir, d), 0o755, True),
                         attempt(os.makedirs, os.path.join(self.ref_dir, d), 0o755, True), [])
        while time.time() < self.deadline and self.ops < self.max_ops:
            self.ops += 1
            if self.rng.random() < self.shared_share:
                self.shared_step()
            else:
                self.step()
        for h in list(self.handles):
            self.begin({"op": "close", "handle": h.id, "path": h.path, "at_end": True})
            self.close_handle(h)
        return {"index": self.index, "ops": self.ops, "counts": self.counts,
                "mismatches": self.mismatches, "tainted": sorted(self.tainted),
                "unknown": sorted(self.unknown), "shared_errors": self.shared_errors}

    def begin(self, op: dict) -> None:
        """Log the operation before it runs (a hang leaves it as the last line)."""
        self.op = {"n": self.ops, "t": round(time.time(), 3), **op}
        self.log.write(json.dumps(self.op) + "\n")
        self.counts[op["op"]] = self.counts.get(op["op"], 0) + 1

    def compare(self, op: dict, mount, ref, paths: list[str | None], handle: Handle | None = None) -> bool:
        if mount == ref:
            return True
        found = {**self.op, **op, "mount": mount, "reference": ref}
        self.mismatches.append(found)
        self.log.write(json.dumps({"mismatch": found}) + "\n")
        read_only = self.op.get("op") in READ_ONLY or op.get("step") == "read"
        for p in paths:
            if p is not None:
                self.taint(p, read_only)
        if handle is not None and handle in self.handles:  # also one of a file without a name
            self.drop(handle)
        return False

    def taint(self, path: str, read_only: bool = False) -> None:
        self.tainted.add(path)
        if not read_only:
            self.unknown.add(path)
        for h in [h for h in self.handles if h.path == path]:
            self.drop(h)

    def drop(self, h: Handle) -> None:
        """Forget a descriptor pair whose outcomes differed (closed, errors ignored)."""
        self.handles.remove(h)
        for fd in (h.mount_fd, h.ref_fd):
            attempt(closed, fd)

    # --- choosing ---

    def existing(self) -> list[str]:
        return [n for n in NAMES if n not in self.tainted
                and os.path.isfile(os.path.join(self.ref_dir, n))]

    def any_name(self) -> str | None:
        free = [n for n in NAMES if n not in self.tainted]
        return self.rng.choice(free) if free else None

    def payload(self, room: int = MAX_SIZE) -> bytes:
        r = self.rng.random()
        if r < 0.1:
            size = 0
        elif r < 0.5:
            size = self.rng.randrange(1, 4096)
        elif r < 0.9:
            size = self.rng.randrange(4096, 200_000)
        elif r < 0.985:
            size = self.rng.randrange(1 << 20, 3 << 20)   # beyond a whole-object first read
        else:
            size = self.rng.randrange(8 << 20, 10 << 20)  # a multipart upload
        return self.rng.randbytes(max(0, min(size, room)))

    def offset(self, size: int) -> int:
        hole = self.rng.choice([0, 0, 0, 10, 4096, 100_000, 600_000])
        return min(self.rng.randrange(size + 1) + (hole if self.rng.random() < 0.3 else 0), MAX_SIZE)

    def step(self) -> None:
        kind = self.rng.choices(list(self.operations), list(self.operations.values()))[0]
        files = self.existing()
        if kind in HANDLE_OPERATIONS and not self.handles:
            kind = "open"
        if kind == "open" and len(self.handles) >= MAX_HANDLES:
            kind = "close"
        if kind in PATH_OPERATIONS and not files:
            kind = "create"
        getattr(self, f"do_{kind}")(files)

    # --- operations on both trees ---

    def both(self, action, path: str, *args):
        return (attempt(action, os.path.join(self.mount_dir, path), *args),
                attempt(action, os.path.join(self.ref_dir, path), *args))

    def do_create(self, files) -> None:
        path = self.any_name()
        if path is None:
            return
        data = self.payload()
        self.begin({"op": "create", "path": path, "data": summary(data)})
        m, r = self.both(open_write_close, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, data, None)
        self.compare({}, m, r, [path])

    def do_open(self, files) -> None:
        path = self.rng.choice(files) if files and self.rng.random() < 0.7 else self.any_name()
        if path is None:
            return
        flags = os.O_RDWR | (os.O_CREAT if self.rng.random() < 0.6 else 0)
        if self.rng.random() < 0.1:
            flags |= os.O_TRUNC
        self.begin({"op": "open", "path": path, "flags": flags})
        m, r = self.both(os.open, path, flags, 0o644)
        if isinstance(m, int) and isinstance(r, int):
            self.handles.append(self.new_handle(path, m, r))
            return
        if self.compare({}, "fd" if isinstance(m, int) else m, "fd" if isinstance(r, int) else r, [path]):
            return
        for fd in (m, r):
            if isinstance(fd, int):
                attempt(closed, fd)

    def new_handle(self, path: str, mount_fd: int, ref_fd: int) -> Handle:
        self.handle_serial += 1
        self.log.write(json.dumps({"handle": self.handle_serial, "opened": path}) + "\n")
        return Handle(self.handle_serial, path, mount_fd, ref_fd)

    def handle(self) -> Handle:
        return self.rng.choice(self.handles)

    def on_handle(self, h: Handle, op: dict, action, *args) -> bool:
        """Run ``action(fd, *args)`` on both descriptors of ``h``; compare."""
        self.begin({**op, "handle": h.id, "path": h.path})
        return self.compare({}, attempt(action, h.mount_fd, *args), attempt(action, h.ref_fd, *args),
                            [h.path], h)

    def ref_size(self, h: Handle) -> int:
        return os.fstat(h.ref_fd).st_size

    def do_pwrite(self, files) -> None:
        h = self.handle()
        at = self.offset(self.ref_size(h))
        data = self.payload(MAX_SIZE - at)
        self.on_handle(h, {"op": "pwrite", "offset": at, "data": summary(data)},
                       lambda fd: write_all(fd, data, at))

    def do_pread(self, files) -> None:
        h = self.handle()
        size = self.ref_size(h)
        at = self.rng.randrange(size + 10)
        length = self.rng.choice([1, 100, 4096, 70_000, size + 1])
        self.on_handle(h, {"op": "pread", "offset": at, "length": length},
                       lambda fd: summary(read_all(fd, at, length)))

    def do_ftruncate(self, files) -> None:
        h = self.handle()
        size = min(self.rng.randrange(self.ref_size(h) + 100_000), MAX_SIZE)
        self.on_handle(h, {"op": "ftruncate", "size": size}, os.ftruncate, size)

    def do_fsync(self, files) -> None:
        self.on_handle(self.handle(), {"op": "fsync"}, os.fsync)

    def do_fstat(self, files) -> None:
        self.on_handle(self.handle(), {"op": "fstat"}, lambda fd: os.fstat(fd).st_size)

    def close_handle(self, h: Handle) -> bool:
        self.handles.remove(h)
        return self.compare({}, attempt(closed, h.mount_fd), attempt(closed, h.ref_fd), [h.path])

    def do_close(self, files) -> None:
        h = self.handle()
        self.begin({"op": "close", "handle": h.id, "path": h.path})
        self.close_handle(h)

    def do_reopen(self, files) -> None:
        """Close a descriptor, open its file again, read it whole."""
        h = self.handle()
        self.begin({"op": "reopen", "handle": h.id, "path": h.path})
        if not self.close_handle(h) or h.path is None:
            return
        m, r = self.both(os.open, h.path, os.O_RDWR)
        if not (isinstance(m, int) and isinstance(r, int)):
            self.compare({"step": "open"}, m if not isinstance(m, int) else "fd",
                         r if not isinstance(r, int) else "fd", [h.path])
            for fd in (m, r):
                if isinstance(fd, int):
                    attempt(closed, fd)
            return
        again = self.new_handle(h.path, m, r)
        self.handles.append(again)
        size = self.ref_size(again)
        self.compare({"step": "read"}, attempt(lambda fd: summary(read_all(fd, 0, size + 1)), m),
                     attempt(lambda fd: summary(read_all(fd, 0, size + 1)), r), [h.path], again)

    def do_pwrite_path(self, files) -> None:
        path = self.rng.choice(files)
        at = self.offset(os.path.getsize(os.path.join(self.ref_dir, path)))
        data = self.payload(MAX_SIZE - at)
        self.begin({"op": "pwrite_path", "path": path, "offset": at, "data": summary(data)})
        m, r = self.both(open_write_close, path, os.O_RDWR, data, at)
        self.compare({}, m, r, [path])

    def do_append(self, files) -> None:
        path = self.rng.choice(files)
        room = MAX_SIZE - os.path.getsize(os.path.join(self.ref_dir, path))
        data = self.payload(room)
        self.begin({"op": "append", "path": path, "data": summary(data)})
        m, r = self.both(open_write_close, path, os.O_WRONLY | os.O_APPEND, data, None)
        self.compare({}, m, r, [path])

    def do_read(self, files) -> None:
        path = self.rng.choice(files)
        self.begin({"op": "read", "path": path})
        m, r = self.both(read_file, path)
        self.compare({}, m, r, [path])

    def do_truncate(self, files) -> None:
        path = self.rng.choice(files)
        size = min(self.rng.randrange(os.path.getsize(os.path.join(self.ref_dir, path)) + 100_000), MAX_SIZE)
        self.begin({"op": "truncate", "path": path, "size": size})
        m, r = self.both(os.truncate, path, size)
        self.compare({}, m, r, [path])

    def do_stat(self, files) -> None:
        path = self.rng.choice(files) if self.rng.random() < 0.8 else self.any_name()
        if path is None:
            return
        self.begin({"op": "stat", "path": path})
        m, r = self.both(file_size, path)
        self.compare({}, m, r, [path])

    def do_listdir(self, files) -> None:
        d = self.rng.choice(("", *SUBDIRS))
        self.begin({"op": "listdir", "path": d})
        m, r = self.both(lambda p: sorted(os.listdir(p)), d)
        if m != r and isinstance(m, list) and isinstance(r, list):
            # a name shown on one side only is a finding about that name
            odd = sorted(set(m) ^ set(r))
            self.compare({"only_mount": sorted(set(m) - set(r)), "only_reference": sorted(set(r) - set(m))},
                         m, r, [os.path.join(d, n) for n in odd])
        else:
            self.compare({}, m, r, [])

    def do_rename(self, files) -> None:
        src, dst = self.rng.choice(files), self.any_name()
        if dst is None or dst == src:
            return
        self.begin({"op": "rename", "path": src, "to": dst,
                    "replaces": os.path.exists(os.path.join(self.ref_dir, dst))})
        m = attempt(os.rename, os.path.join(self.mount_dir, src), os.path.join(self.mount_dir, dst))
        r = attempt(os.rename, os.path.join(self.ref_dir, src), os.path.join(self.ref_dir, dst))
        if self.compare({}, m, r, [src, dst]) and r is None:
            for h in self.handles:
                if h.path == dst:
                    h.path = None
                elif h.path == src:
                    h.path = dst

    def do_save(self, files) -> None:
        """An editor's save (dbench's LWPSAV0.TMP): the content written to a temporary name
        and fsync'd (uploaded, in eager mode too), then renamed onto the file's name; the
        temporary name is gone until the next save creates it again. Other operations look
        at both names afterwards (a name removed here must not come back)."""
        tmp, dst = self.any_name(), self.any_name()
        if tmp is None or dst is None or tmp == dst:
            return
        data = self.payload(SAVE_MAX)
        self.begin({"op": "save", "path": tmp, "to": dst, "data": summary(data),
                    "replaces": os.path.exists(os.path.join(self.ref_dir, dst))})

        def sequence(root: str) -> list:
            t, d = os.path.join(root, tmp), os.path.join(root, dst)
            steps = [("write", attempt(write_fsync_close, t, data))]
            steps.append(("rename", attempt(os.rename, t, d)))
            steps.append(("exists", os.path.exists(t)))
            return steps
        m, r = sequence(self.mount_dir), sequence(self.ref_dir)
        if self.compare({}, m, r, [tmp, dst]) and r[1][1] is None:
            for h in self.handles:
                if h.path == dst:
                    h.path = None
                elif h.path == tmp:
                    h.path = dst

    def do_unlink(self, files) -> None:
        path = self.rng.choice(files)
        self.begin({"op": "unlink", "path": path, "open_handles": sum(h.path == path for h in self.handles)})
        m, r = self.both(os.unlink, path)
        if self.compare({}, m, r, [path]) and r is None:
            for h in self.handles:
                if h.path == path:
                    h.path = None

    def do_unlink_while_open(self, files) -> None:
        """open, write, unlink, keep writing and reading through the descriptor, close."""
        path = self.any_name()
        if path is None or any(h.path == path for h in self.handles):
            return
        first, second = self.payload(1 << 20), self.payload(1 << 20)
        at = self.rng.randrange(len(first) + 1)
        self.begin({"op": "unlink_while_open", "path": path, "data": summary(first),
                    "then": summary(second), "at": at})

        def sequence(root: str) -> list:
            steps = []
            full = os.path.join(root, path)
            fd = attempt(os.open, full, os.O_RDWR | os.O_CREAT, 0o644)
            if not isinstance(fd, int):
                return [("open", fd)]
            steps.append(("write", attempt(write_all, fd, first, 0)))
            steps.append(("unlink", attempt(os.unlink, full)))
            steps.append(("exists", os.path.exists(full)))
            steps.append(("write", attempt(write_all, fd, second, at)))
            steps.append(("fstat", attempt(lambda: os.fstat(fd).st_size)))
            steps.append(("read", attempt(lambda: summary(read_all(fd, 0, MAX_SIZE)))))
            steps.append(("close", attempt(closed, fd)))
            steps.append(("exists", os.path.exists(full)))
            return steps

        m, r = sequence(self.mount_dir), sequence(self.ref_dir)
        # what only the descriptor saw is no reason to leave the name alone
        named = [a for a, b in zip(m, r) if a != b and a[0] in ("open", "write", "unlink", "exists")]
        self.compare({}, m, r, [path] if named or len(m) != len(r) else [])

    # --- the shared directory: races, no model ---

    def shared_step(self) -> None:
        kind = self.rng.choice(["create", "pwrite_path", "truncate", "rename", "unlink", "read"])
        name = self.rng.choice(SHARED_NAMES)
        path = os.path.join(self.shared_dir, name)
        self.begin({"op": f"shared_{kind}", "path": name})
        if kind == "create":
            result = attempt(open_write_close, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                             self.payload(300_000), None)
        elif kind == "pwrite_path":
            result = attempt(open_write_close, path, os.O_RDWR, self.payload(300_000),
                             self.rng.randrange(200_000))
        elif kind == "truncate":
            result = attempt(os.truncate, path, self.rng.randrange(300_000))
        elif kind == "rename":
            result = attempt(os.rename, path, os.path.join(self.shared_dir, self.rng.choice(SHARED_NAMES)))
        elif kind == "unlink":
            result = attempt(os.unlink, path)
        else:
            result = attempt(read_file, path)
        if isinstance(result, str) and result != "ENOENT":
            found = {**self.op, "error": result}
            self.shared_errors.append(found)
            self.log.write(json.dumps({"shared_error": found}) + "\n")


def main(config: dict) -> None:
    """A worker process's entry point: its result goes to ``config["result_path"]``."""
    worker = Worker(config)
    try:
        result = worker.run()
    except BaseException:  # noqa: BLE001 — the report says how the worker died
        result = {"index": worker.index, "ops": worker.ops, "crash": traceback.format_exc(),
                  "last_op": worker.op, "mismatches": worker.mismatches,
                  "tainted": sorted(worker.tainted), "shared_errors": worker.shared_errors,
                  "counts": worker.counts}
    with open(config["result_path"], "w") as f:
        json.dump(result, f, indent=1)
