"""Work-queue groups on real MinIO, RabbitMQ, handlers and mounts: `delvefs watch --group
G --exec CMD` members share a view's files — each file processed once; a member SIGKILLed
mid-file loses its file to another; a file whose command always fails is set aside after N
attempts; a handler restart and a standby takeover in the middle lose nothing; members
run no command on a file their mount cannot show yet across many handler restarts; a
principal without the view's grant cannot join."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from delvefs.client.handler.api import HandlerError, SyncHandlerClient

from delvefs.shared import s3 as s3api
from eventhandler.auth import add_principal
from eventhandler.devtools import HandlerGroup

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import DELVEFS, Mounts, fuse_available, handler  # noqa: F401  (fixture)
from .test_watch import views

pytestmark = [pytest.mark.services, pytest.mark.fuse]

FILES = 200
LEASE = 2.0        # short: a dead member's file goes to another within seconds
MAX_FAILURES = 3
MEMBERS = 3
JOBS = 2
DONE_TIMEOUT = 180.0  # bound on 200 files through 3 members (a loaded machine)
RESTARTS = 20

# The members' command: reads the file through the mount, logs "KEY MEMBER" when done.
# Its first attempt at a "slow" file says so and hangs (until its member is killed); a
# "bad" file always fails.
WORK = """#!/bin/sh
set -e
log=$1 path=$2
echo "$DELVEFS_GROUP_KEY $DELVEFS_GROUP_ATTEMPT" >> "$log.attempts"
head -c 1 "$path" > /dev/null
case "$DELVEFS_GROUP_KEY" in
  *slow*) if [ "$DELVEFS_GROUP_ATTEMPT" = 1 ]; then echo "$DELVEFS_GROUP_MEMBER" > "$log.slow"; exec sleep 600; fi ;;
  *bad*) exit 7 ;;
esac
echo "$DELVEFS_GROUP_KEY $DELVEFS_GROUP_MEMBER" >> "$log"
"""


class Stack:
    """Handlers (a principals file with ``bob`` besides the token's ``default``), a mount
    whose handler URLs name all of them, and group members."""

    def __init__(self, services, service_env, s3, bucket, tmp_path):
        if not fuse_available():
            service_unavailable("/dev/fuse or fusermount3 missing")
        self.s3, self.bucket, self.tmp = s3, bucket, tmp_path
        self.state = tmp_path / "handler-state"
        self.bob = add_principal(self.state / "principals.json", "bob")
        self.handlers = HandlerGroup(service_env, services.rabbit.url)
        self.active = self.handlers.start(self.state)
        self.standby = None
        self.mounts = None
        self.members: list[subprocess.Popen] = []
        self.log = tmp_path / "done.log"
        self.work = tmp_path / "work.sh"
        self.work.write_text(WORK)

    def mount(self, urls: str):
        env = {**os.environ, **self.handlers.env, "DELVEFS_HANDLER_URL": urls,
               "DELVEFS_HANDLER_TOKEN": self.active.token,
               "DELVEFS_STATE_HOME": str(self.tmp / "state")}
        self.mounts = Mounts(self.tmp, env)
        self.view_dir = self.mounts.mount(views(self.bucket)) / "fastq"
        return self.view_dir

    def member(self, *extra, env=None) -> subprocess.Popen:
        """A member running the work command, in a process group of its own (a SIGKILL of
        the group is a dead node: the member and its commands)."""
        errors = open(self.tmp / f"member-{len(self.members)}.err", "w+")
        proc = subprocess.Popen(
            [DELVEFS, "watch", str(self.view_dir), "--group", "align",
             "--exec", f"sh {self.work} {self.log} {{}}", "-j", str(JOBS),
             "--lease", str(LEASE), "--max-failures", str(MAX_FAILURES), *extra],
            env=env or self.mounts.env, stdout=subprocess.DEVNULL, stderr=errors,
            start_new_session=True)
        proc.errors = errors
        self.members.append(proc)
        wait_until(lambda: "waiting for files" in self.stderr(proc) or proc.poll() is not None,
                   60, "the member to join")
        assert proc.poll() is None, self.stderr(proc)
        return proc

    @staticmethod
    def stderr(proc) -> str:
        proc.errors.seek(0)
        return proc.errors.read()

    def put(self, names) -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda n: self.s3.put_object(Bucket=self.bucket, Key=f"runs/{n}",
                                                       Body=b"@r\nACGT\n+\nIIII\n"), names))

    def done(self) -> collections.Counter:
        """How often each key was processed to the end (by the log), and by whom."""
        if not self.log.exists():
            return collections.Counter()
        return collections.Counter(line.split()[0] for line in self.log.read_text().splitlines())

    def done_by(self, key: str) -> list[str]:
        return [line.split()[1] for line in self.log.read_text().splitlines() if line.split()[0] == key]

    def group(self, token=None) -> dict:
        with SyncHandlerClient(self.mounts.env["DELVEFS_HANDLER_URL"], token or self.active.token) as api:
            return api.group_status(self.view_id(), "align")

    def view_id(self) -> str:
        import json
        return json.loads(os.getxattr(self.view_dir, "user.delvefs.view"))["id"]

    def close(self) -> None:
        for proc in self.members:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            proc.errors.close()
        if self.mounts is not None:
            self.mounts.cleanup()
        self.handlers.close()


@pytest.fixture
def stack(services, service_env, s3, bucket, tmp_path):
    st = Stack(services, service_env, s3, bucket, tmp_path)
    yield st
    st.close()


def names(n: int, prefix: str = "f") -> list[str]:
    return [f"{prefix}{i:04d}.fastq" for i in range(n)]


def wait_all_done(stack: Stack, keys: set[str], what: str) -> collections.Counter:
    wait_until(lambda: keys <= set(stack.done()), DONE_TIMEOUT, what, interval=0.1)
    wait_until(lambda: stack.group()["done"] >= len(keys), 30, "the acknowledgements")
    return stack.done()


def test_each_file_goes_to_one_member_once(stack):
    stack.mount(stack.active.url)
    for _ in range(MEMBERS):
        stack.member()
    stack.put(names(FILES))
    keys = {f"runs/{n}" for n in names(FILES)}
    done = wait_all_done(stack, keys, "every file processed")
    assert set(done) == keys and set(done.values()) == {1}
    group = stack.group()
    assert (group["done"], group["failed"], group["in_flight"], group["backlog"]) == (FILES, 0, 0, 0)
    assert len(group["members"]) == MEMBERS


def test_a_killed_members_file_is_done_by_another_and_nothing_is_lost(stack):
    stack.mount(stack.active.url)
    members = [stack.member() for _ in range(MEMBERS)]
    files = names(FILES)
    files[FILES // 2] = "slow.fastq"
    stack.put(files)
    slow = stack.tmp / "done.log.slow"
    holder = wait_until(lambda: slow.exists() and slow.read_text().strip(), DONE_TIMEOUT,
                        "a member to start on the slow file")
    victim = next(m for m in members if f":{m.pid}:" in holder)
    os.killpg(victim.pid, signal.SIGKILL)  # mid-file: its command hangs in its first attempt
    victim.wait(10)
    keys = {f"runs/{n}" for n in files}
    done = wait_all_done(stack, keys, "every file processed, the slow one by another member")
    assert set(done) == keys
    # A command that ended at the killed member just before the kill, its report never sent,
    # runs again elsewhere once the lease runs out (docs/SEMANTICS.md, "Once, and at most the
    # files in flight twice"): only such files, at most its -j of them, are done twice.
    twice = {k: stack.done_by(k) for k, n in done.items() if n > 1}
    assert len(twice) <= JOBS and all(len(by) == 2 and holder in by for by in twice.values()), twice
    assert stack.done_by("runs/slow.fastq") != [holder]
    group = stack.group()
    assert (group["done"], group["failed"], group["in_flight"]) == (FILES, 0, 0)


def test_a_file_that_always_fails_is_set_aside_after_n_attempts(stack):
    stack.mount(stack.active.url)
    stack.member()
    stack.member()
    stack.put(["bad.fastq", *names(5)])
    wait_until(lambda: stack.group()["failed"] == 1, DONE_TIMEOUT, "the bad file set aside")
    wait_until(lambda: stack.group()["done"] == 5, DONE_TIMEOUT, "the good files done")
    group = stack.group()
    assert group["failed_files"][0]["key"] == "runs/bad.fastq"
    assert group["failed_files"][0]["attempts"] == MAX_FAILURES
    assert "exit status 7" in group["failed_files"][0]["error"]
    attempts = [line for line in (stack.tmp / "done.log.attempts").read_text().splitlines()
                if line.startswith("runs/bad.fastq ")]
    assert [line.split()[1] for line in attempts] == ["1", "2", "3"]
    # `delvefs status --handler` shows the group and its failed file
    r = stack.mounts.run("status", "--handler")
    assert r.returncode == 0, r.stderr
    assert "align" in r.stdout and "runs/bad.fastq" in r.stdout, r.stdout


def test_a_standby_takeover_and_a_handler_restart_lose_nothing(stack):
    stack.standby = stack.handlers.start(stack.state, standby=True, queue=stack.active.queue)
    stack.mount(f"{stack.active.url},{stack.standby.url}")
    for _ in range(MEMBERS):
        stack.member()
    files = names(FILES)
    keys = {f"runs/{n}" for n in files}
    writer = threading.Thread(target=stack.put, args=(files,))
    writer.start()
    try:
        wait_until(lambda: len(stack.done()) >= FILES // 4, DONE_TIMEOUT, "a quarter of the files done")
        stack.active.kill()  # the standby takes over
        wait_until(lambda: stack.standby.role() == "active", 60, "the standby to take over")
        wait_until(lambda: len(stack.done()) >= FILES // 2, DONE_TIMEOUT, "half of the files done")
        stack.standby.stop()  # a restart on the same state directory
        stack.standby.start()
    finally:
        writer.join()
    done = wait_all_done(stack, keys, "every file processed after the takeover and the restart")
    assert set(done) == keys
    # at most the files in flight at each of the two moments: members x jobs each
    duplicates = sum(n - 1 for n in done.values())
    assert duplicates <= 2 * MEMBERS * JOBS, done.most_common(5)


def test_handler_restarts_cost_no_attempt_and_run_no_file_twice(stack):
    """A handler stopping (SIGTERM) still answers the claims waiting in it for a moment
    while its port is closed: a member then holds a file its mount cannot fetch until the
    handler is back. Files keep appearing through 20 restarts; with --max-failures 1 any
    command run on a file the mount does not show (or any lapsed lease) would set a file
    aside. No file fails, each runs once, at its first attempt."""
    stack.mount(stack.active.url)
    for _ in range(MEMBERS):  # a lease well beyond a restart: no lease runs out
        stack.member("--lease", "30", "--max-failures", "1")
    attempts_log = stack.tmp / "done.log.attempts"

    def started() -> int:
        return len(attempts_log.read_text().splitlines()) if attempts_log.exists() else 0
    put: list[str] = []
    writing = threading.Event()
    writing.set()

    def writer() -> None:
        # a few files ahead of the commands started, so that files arrive also while a
        # handler stops
        while writing.is_set():
            wait_until(lambda: not writing.is_set() or len(put) - started() < MEMBERS * JOBS,
                       DONE_TIMEOUT, "the members to catch up with the writer")
            if writing.is_set():
                key = f"runs/r{len(put):05d}.fastq"
                stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=b"@r\nACGT\n+\nIIII\n")
                put.append(key)
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(RESTARTS):
            progress = started()
            wait_until(lambda: started() >= progress + MEMBERS, DONE_TIMEOUT,
                       "commands started since the last restart", interval=0.01)
            stack.active.stop()
            stack.active.start()
    finally:
        writing.clear()
        thread.join(DONE_TIMEOUT)
    assert [m.poll() for m in stack.members] == [None] * MEMBERS, [stack.stderr(m)[-2000:] for m in stack.members]

    def settled() -> dict | None:
        group = stack.group()
        finished = set(stack.done()) | {f["key"] for f in group["failed_files"]}
        return group if finished >= set(put) and group["in_flight"] == 0 else None
    group = wait_until(settled, DONE_TIMEOUT, "every file done or set aside", interval=0.1)
    assert (group["failed"], group["failed_files"]) == (0, []), group
    done = stack.done()
    assert set(done) == set(put) and set(done.values()) == {1}, done.most_common(3)
    attempts = attempts_log.read_text().splitlines()
    # every command ran on a file its mount showed (head found it), once, at attempt 1
    assert sorted(attempts) == sorted(f"{key} 1" for key in put), \
        collections.Counter(attempts).most_common(3)
    waited = sum(stack.stderr(m).count("the mount cannot show version") for m in stack.members)
    print(f"{len(put)} files, {RESTARTS} restarts; {waited} catch-ups waited for the handler")


def test_a_file_given_back_costs_no_attempt_and_leaves_the_group_once_out_of_the_view(
        handler, s3, bucket):  # noqa: F811
    proof = s3api.presigned_list_url(s3, bucket, principal="default")
    answer = handler.register({"fastq": {"bucket": bucket, "object": "runs/*.fastq"}}, {bucket: proof})
    assert answer.status_code == 200, answer.text
    vid = answer.json()["views"][0]["id"]
    api = handler.api
    api.group_join(vid, "g", "m1", max_failures=1)
    api.group_join(vid, "g", "m2")
    for name in ("a", "b"):
        s3.put_object(Bucket=bucket, Key=f"runs/{name}.fastq", Body=b"@r\n")
    claimed = []

    def claimed_both() -> bool:
        claimed.extend(api.group_claim(vid, "g", "m1", 2 - len(claimed), wait=5)["files"])
        return len(claimed) == 2
    wait_until(claimed_both, 30, "both files claimed")
    assert [f["attempt"] for f in claimed] == [1, 1]

    def give_back(member: str, key: str) -> str:
        return api.group_give_back(vid, "g", member, key, "the mount did not show it")["state"]
    assert give_back("m2", "runs/a.fastq") == "in_flight"  # only its holder gives it back
    assert give_back("m1", "runs/a.fastq") == "pending"
    (again,) = api.group_claim(vid, "g", "m2", 1, wait=0)["files"]
    assert (again["key"], again["attempt"]) == ("runs/a.fastq", 1)  # no attempt counted
    # b leaves the view while in flight: given back, it leaves the group
    s3.delete_object(Bucket=bucket, Key="runs/b.fastq")
    wait_until(lambda: api.lookup(bucket, "runs/b.fastq") is None, 30, "the deletion applied")
    assert give_back("m1", "runs/b.fastq") == "removed"
    assert api.group_done(vid, "g", "m2", "runs/a.fastq")["state"] == "done"
    report = api.group_status(vid, "g")
    assert (report["done"], report["failed"], report["in_flight"], report["backlog"]) == (1, 0, 0, 0)


def test_another_principal_cannot_join_or_read_the_group(stack):
    stack.mount(stack.active.url)
    stack.member()
    with SyncHandlerClient(stack.active.url, stack.bob) as bob:
        with pytest.raises(HandlerError) as refused:
            bob.group_join(stack.view_id(), "align", "bob-1")
        assert refused.value.status == 404
        with pytest.raises(HandlerError) as refused:
            bob.group_claim(stack.view_id(), "align", "bob-1", wait=0)
        assert refused.value.status == 404
        assert bob.status()["groups"] == []
    r = subprocess.run([DELVEFS, "watch", str(stack.view_dir), "--group", "align"],
                       env={**stack.mounts.env, "DELVEFS_HANDLER_TOKEN": stack.bob},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "refused group align" in r.stderr, r.stderr
    assert stack.group()["members"][0]["id"].count(":") == 2  # the one member is still alone
    assert len(stack.group()["members"]) == 1


def test_a_member_without_exec_prints_each_file_to_one_reader(stack):
    stack.put(["old-1.fastq", "old-2.fastq"])
    view_dir = stack.mount(stack.active.url)
    outputs = []
    for _ in range(2):  # the first makes the group with the files already there
        out = open(stack.tmp / f"paths-{len(outputs)}.txt", "w+")
        errors = open(stack.tmp / f"print-{len(outputs)}.err", "w+")
        proc = subprocess.Popen([DELVEFS, "watch", str(view_dir), "--group", "count", "--existing"],
                                env=stack.mounts.env, stdout=out, stderr=errors, start_new_session=True)
        proc.errors = errors
        stack.members.append(proc)
        outputs.append(out)
    stack.put([f"new-{i}.fastq" for i in range(6)])

    def printed() -> list[str]:
        lines = []
        for out in outputs:
            out.seek(0)
            lines += out.read().splitlines()
        return lines
    wait_until(lambda: len(printed()) >= 8, DONE_TIMEOUT, "every file printed")
    lines = printed()
    assert sorted(lines) == sorted(str(view_dir / n) for n in
                                   ["old-1.fastq", "old-2.fastq", *(f"new-{i}.fastq" for i in range(6))])
    for path in lines:  # each printed path opens at once (the view's ttl is 30 s)
        with open(path, "rb") as f:
            assert f.read(1) == b"@"
    with SyncHandlerClient(stack.active.url, stack.active.token) as api:
        wait_until(lambda: api.group_status(stack.view_id(), "count")["done"] == 8, 30, "all acknowledged")
    for out in outputs:
        out.close()
