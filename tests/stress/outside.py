"""Another S3 client writing beside the mount: PUTs new objects, overwrites objects with
another size (also while the mount holds a descriptor open on them, having read them),
deletes objects — all under a prefix of its own that the mounted view also shows — and
checks that the mount converges to show exactly what it wrote (names, sizes, bytes)
within the bound docs/SEMANTICS.md promises (``ttl`` + the event delay; longer while the
handler is down).

What it checks of an overwrite with another size through a descriptor opened and read
before it (docs/SEMANTICS.md, *One version per open file*): the descriptor keeps reading
the old version; a new open reads the new one; under the eager mode's writeback cache the
file gets a new inode (*The kernel's writeback cache*).
"""
from __future__ import annotations

import json
import os
import random
import threading
import time

from ..waiting import ConditionTimeout, wait_until
from .trees import differences, digest, local_tree


class OutsideWriter(threading.Thread):
    def __init__(self, s3, bucket: str, prefix: str, mount_dir: str, *, seed: int, deadline: float,
                 converge_timeout: float, eager: bool, log_path: str):
        super().__init__(name="outside-writer", daemon=True)
        self.s3, self.bucket, self.prefix, self.mount_dir = s3, bucket, prefix, mount_dir
        self.rng = random.Random(f"{seed}-outside")
        self.deadline = deadline
        self.converge_timeout = converge_timeout
        self.eager = eager
        self.log = open(log_path, "w", buffering=1)
        self.model: dict[str, bytes] = {}
        self.findings: list[dict] = []
        self.convergence_seconds: list[float] = []
        self.counts: dict[str, int] = {}
        self.crash: str | None = None
        self.serial = 0

    # --- bookkeeping ---

    def note(self, **event) -> None:
        self.log.write(json.dumps({"t": round(time.time(), 3), **event}) + "\n")

    def finding(self, what: str, **details) -> None:
        found = {"t": round(time.time(), 3), "what": what, **details}
        self.findings.append(found)
        self.note(finding=found)

    def expected(self) -> dict:
        return {name: digest(body) for name, body in self.model.items()}

    def payload(self, not_size: int | None = None) -> bytes:
        size = self.rng.choice([0, self.rng.randrange(1, 5000), self.rng.randrange(5000, 300_000),
                                self.rng.randrange(2 << 20, 3 << 20)] if self.rng.random() < 0.1
                               else [self.rng.randrange(1, 5000), self.rng.randrange(5000, 300_000)])
        if size == not_size:
            size += 1
        return self.rng.randbytes(size)

    def put(self, name: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=body)
        self.model[name] = body

    # --- the loop ---

    def run(self) -> None:
        try:
            self.loop()
        except BaseException:  # noqa: BLE001 — reported, never a silent dead thread
            import traceback
            self.crash = traceback.format_exc()
            self.note(crash=self.crash)

    def loop(self) -> None:
        n = 0
        while time.time() < self.deadline:
            n += 1
            kinds = ["put_new", "overwrite_other_size", "overwrite_while_open", "delete"]
            weights = [4, 3, 2, 2] if len(self.model) > 2 else [1, 0, 0, 0]
            kind = self.rng.choices(kinds, weights)[0]
            self.counts[kind] = self.counts.get(kind, 0) + 1
            getattr(self, kind)()
            if n % 4 == 0:
                self.converge(f"after outside operation {n}")
            time.sleep(self.rng.uniform(0.2, 1.2))
        self.converge("at the end of the run")

    def put_new(self) -> None:
        self.serial += 1
        name = f"o{self.serial}.bin" if self.rng.random() < 0.8 else f"sub/o{self.serial}.bin"
        body = self.payload()
        self.note(op="put_new", name=name, size=len(body))
        self.put(name, body)

    def overwrite_other_size(self) -> None:
        name = self.rng.choice(sorted(self.model))
        body = self.payload(not_size=len(self.model[name]))
        self.note(op="overwrite_other_size", name=name, old=len(self.model[name]), new=len(body))
        self.put(name, body)

    def delete(self) -> None:
        name = self.rng.choice(sorted(self.model))
        self.note(op="delete", name=name)
        self.s3.delete_object(Bucket=self.bucket, Key=self.prefix + name)
        del self.model[name]

    def overwrite_while_open(self) -> None:
        """Read a file through the mount and keep it open; overwrite it in S3 with another
        size; once the mount shows the new version, the old descriptor must still read the
        old bytes."""
        name = self.rng.choice(sorted(self.model))
        old = self.model[name]
        path = os.path.join(self.mount_dir, name)
        if not self.converge(f"before overwriting {name} under an open descriptor"):
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            before = os.fstat(fd).st_ino
            first = read_all(fd)
            if first != old:
                self.finding("a fresh open read other bytes than S3 holds", path=name,
                             expected=len(old), got=len(first))
            new = self.payload(not_size=len(old))
            self.note(op="overwrite_while_open", name=name, old=len(old), new=len(new))
            self.put(name, new)
            start = time.monotonic()
            try:
                wait_until(lambda: self.read_path(path) == new, self.converge_timeout,
                           f"{name} to show its new version", interval=0.1)
            except ConditionTimeout:
                self.finding("the mount did not show an overwrite with another size", path=name,
                             timeout=self.converge_timeout, expected=len(new),
                             got=self.describe_path(path))
                return
            self.convergence_seconds.append(time.monotonic() - start)
            kept = read_all(fd)
            if kept != old:
                self.finding("a descriptor opened before an overwrite did not keep the old version",
                             path=name, old=len(old), new=len(new), read=len(kept),
                             what_it_read=relation(kept, old, new))
            after = os.stat(path).st_ino
            self.note(op="inode", name=name, before=before, after=after)
            if self.eager and after == before:
                self.finding("eager mode: a file changed by another client to another size "
                             "kept its inode", path=name, inode=before)
        finally:
            try:
                os.close(fd)
            except OSError as exc:
                self.finding("closing a read-only descriptor failed", path=name, error=str(exc))

    # --- what the mount shows ---

    def read_path(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def describe_path(self, path: str) -> str:
        data = self.read_path(path)
        return "unreadable" if data is None else f"{len(data)} bytes"

    def shown(self) -> dict:
        if not os.path.isdir(self.mount_dir):
            return {}
        return local_tree(self.mount_dir)[0]

    def converge(self, when: str) -> bool:
        """Wait until the mount shows exactly the model; a finding if it does not in time."""
        expected = self.expected()
        start = time.monotonic()
        try:
            wait_until(lambda: self.shown() == expected, self.converge_timeout,
                       f"the mount to show the outside writer's objects {when}", interval=0.2)
        except ConditionTimeout:
            self.finding(f"the mount did not converge {when}", timeout=self.converge_timeout,
                         differences=differences(expected, self.shown(), "mount")[:20])
            return False
        self.convergence_seconds.append(time.monotonic() - start)
        return True

    def result(self) -> dict:
        seconds = sorted(self.convergence_seconds)
        return {"counts": self.counts, "objects_at_end": len(self.model), "findings": self.findings,
                "crash": self.crash,
                "convergence_seconds": {"checks": len(seconds),
                                        "max": round(seconds[-1], 2) if seconds else None,
                                        "median": round(seconds[len(seconds) // 2], 2) if seconds else None}}


def read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def relation(data: bytes, old: bytes, new: bytes) -> str:
    """What ``data`` is made of, in terms of two versions of a file."""
    if data == new:
        return "the new version"
    if data == old[:len(data)]:
        return f"the old version's first {len(data)} bytes"
    if data == new[:len(data)]:
        return f"the new version's first {len(data)} bytes"
    if not data.strip(b"\0"):
        return "zeros"
    same_old = sum(a == b for a, b in zip(data, old))
    same_new = sum(a == b for a, b in zip(data, new))
    return f"neither: {same_old} bytes agree with the old version, {same_new} with the new one"
