"""`delvefs watch`: each file that appears in a mounted view is printed once, with a path
that opens at once — driven by the handler's change stream, also across a handler restart;
its readiness (the `ready:` line, `--ready-file`) for a watch and a group member; a reader
that goes away ends it quietly."""
from __future__ import annotations

import os
import subprocess
import threading

import pytest

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, DELVEFS, handler, mounts  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.services, pytest.mark.fuse]

EVENT_DELAY = 20.0


class WatchProcess:
    """`delvefs watch` with its stdout collected line by line on a thread."""

    def __init__(self, view_dir, env, *args, ready: str | None = "delvefs watch: ready: "):
        self.proc = subprocess.Popen([DELVEFS, "watch", str(view_dir), *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.log: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True),
                        threading.Thread(target=self._read, args=(self.proc.stderr, self.log), daemon=True)]
        for reader in self.readers:
            reader.start()
        # ready: a line of its log (docs/SEMANTICS.md: "delvefs watch: ready: ..."); None: the
        # caller waits
        if ready is not None:
            wait_until(lambda: any(ready in line for line in self.log) or self.proc.poll() is not None,
                       timeout=EVENT_DELAY, what="watch to be ready")
            assert self.proc.poll() is None, self.log

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_lines(self, n: int, what: str):
        wait_until(lambda: len(self.lines) >= n or self.proc.poll() is not None,
                   timeout=EVENT_DELAY, what=what)
        assert self.proc.poll() is None, self.log
        return self.lines

    def stop(self) -> str:
        self.proc.terminate()
        self.proc.wait(10)
        for reader in self.readers:
            reader.join(5)
        return "\n".join(self.log)


def views(bucket):
    return f"""
    fastq:
      bucket: {bucket}
      object: "runs/*.fastq"
      root: "runs/"
      ttl: 30s
    """


def put(s3, bucket, key, body=b"@r\nACGT\n+\nIIII\n"):
    s3.put_object(Bucket=bucket, Key=key, Body=body)


def test_watch_prints_existing_then_each_new_file_once(mounts, handler, s3, bucket):  # noqa: F811
    put(s3, bucket, "runs/old-1.fastq")
    put(s3, bucket, "runs/lane1/old-2.fastq")
    mnt = mounts.mount(views(bucket))
    watch = WatchProcess(mnt / "fastq", mounts.env, "--existing")
    try:
        lines = watch.wait_lines(2, "the existing files")
        assert sorted(lines) == [str(mnt / "fastq/lane1/old-2.fastq"), str(mnt / "fastq/old-1.fastq")]

        put(s3, bucket, "runs/new-1.fastq")
        put(s3, bucket, "runs/other.txt")            # not in the view
        put(s3, bucket, "runs/old-1.fastq", b"@x\nA\n+\nI\n")  # an update is no new appearance
        put(s3, bucket, "runs/lane2/new-2.fastq")
        lines = watch.wait_lines(4, "the new files")
        assert lines[2:] == [str(mnt / "fastq/new-1.fastq"), str(mnt / "fastq/lane2/new-2.fastq")]
        # Each printed path opens at once, even though the view's ttl (30 s) has not passed.
        for path in lines:
            with open(path, "rb") as f:
                assert f.read(1) == b"@"

        s3.delete_object(Bucket=bucket, Key="runs/new-1.fastq")
        # once the handler applied the deletion (a deletion and a re-creation of the same
        # content in one batch of events are no change, docs/CONFIGURATION.md)
        wait_until(lambda: handler.api.lookup(bucket, "runs/new-1.fastq") is None, CHANGE_TIMEOUT,
                   "the deletion applied")
        put(s3, bucket, "runs/new-1.fastq")          # gone and back: a new appearance
        lines = watch.wait_lines(5, "the re-created file")
        assert lines[4] == str(mnt / "fastq/new-1.fastq")
        assert len(lines) == 5
    finally:
        watch.stop()


def test_watch_without_existing_prints_only_new_files(mounts, s3, bucket):
    put(s3, bucket, "runs/before.fastq")
    mnt = mounts.mount(views(bucket))
    watch = WatchProcess(mnt / "fastq", mounts.env)
    try:
        put(s3, bucket, "runs/after.fastq")
        assert watch.wait_lines(1, "the new file") == [str(mnt / "fastq/after.fastq")]
    finally:
        watch.stop()


def test_files_created_while_the_handler_restarts_are_printed_once(mounts, handler, s3, bucket):
    mnt = mounts.mount(views(bucket))
    watch = WatchProcess(mnt / "fastq", mounts.env, "--existing")
    try:
        put(s3, bucket, "runs/a.fastq")
        watch.wait_lines(1, "the first file")
        handler.stop()
        put(s3, bucket, "runs/b.fastq")  # waits in the handler's durable queue
        put(s3, bucket, "runs/c.fastq")
        handler.start()
        put(s3, bucket, "runs/d.fastq")
        lines = watch.wait_lines(4, "the files created around the restart")
        assert sorted(lines) == sorted(str(mnt / f"fastq/{n}.fastq") for n in "abcd")
    finally:
        stderr = watch.stop()
    assert len(watch.lines) == 4, stderr


def test_watch_refuses_a_directory_that_is_no_view(tmp_path, mounts):
    r = subprocess.run([DELVEFS, "watch", str(tmp_path)], env=mounts.env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1
    assert "is not a view directory of a DelveFS mount" in r.stderr


def test_the_ready_line_and_file_say_when_every_new_file_is_seen(mounts, s3, bucket, tmp_path):
    mnt = mounts.mount(views(bucket))
    watch_ready, member_ready = tmp_path / "watch.ready", tmp_path / "member.ready"
    watch_ready.write_text("left by an earlier run\n")  # removed at start: not ready yet
    watch = WatchProcess(mnt / "fastq", mounts.env, "--ready-file", str(watch_ready), ready=None)
    member = WatchProcess(mnt / "fastq", mounts.env, "--group", "g", "--ready-file", str(member_ready),
                          ready=None)
    try:
        for proc, path in ((watch, watch_ready), (member, member_ready)):
            wait_until(lambda: path.exists() and path.read_text() == f"{proc.proc.pid}\n", EVENT_DELAY,
                       f"{path.name} written")
        # the line was written before the file (read here on another thread)
        wait_until(lambda: any(line.startswith(f"delvefs watch: ready: watching {mnt / 'fastq'}: ")
                               for line in watch.log), EVENT_DELAY, "the watch's ready line")
        wait_until(lambda: any(line.startswith("delvefs watch: ready: member ")
                               and line.endswith(": waiting for files") for line in member.log),
                   EVENT_DELAY, "the member's ready line")
        put(s3, bucket, "runs/right-after.fastq")  # seen by both: put once they are ready
        assert watch.wait_lines(1, "the file put once ready") == [str(mnt / "fastq/right-after.fastq")]
        assert member.wait_lines(1, "the file put once ready") == [str(mnt / "fastq/right-after.fastq")]
    finally:
        watch.stop()
        member.stop()
    assert not watch_ready.exists() and not member_ready.exists()  # no longer watching


def test_watch_ends_quietly_when_its_reader_goes_away(mounts, s3, bucket, tmp_path):
    put(s3, bucket, "runs/first.fastq")
    mnt = mounts.mount(views(bucket))
    ready = tmp_path / "ready"
    proc = subprocess.Popen([DELVEFS, "watch", str(mnt / "fastq"), "--existing", "--ready-file", str(ready)],
                            env=mounts.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == f"{mnt / 'fastq/first.fastq'}\n"
        wait_until(ready.exists, EVENT_DELAY, "watch ready")
        proc.stdout.close()  # `delvefs watch | head -n 1`: the reader is gone
        put(s3, bucket, "runs/second.fastq")
        assert proc.wait(EVENT_DELAY + 10) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not ready.exists()
