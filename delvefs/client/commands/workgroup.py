"""``delvefs watch MOUNT/VIEW --group NAME [--exec CMD [-j K]]``: one member of a
work-queue group of the view (the handler's side: eventhandler/groups.py).

Each file that appears in the view goes to one member of the group. This member claims
files from the handler (a long poll), holds each for a lease that it renews while it works,
and reports each as done or failed:

- without ``--exec`` it prints each file's path, one a line, and acknowledges the file once
  printed: a reader of the lines that dies loses what it read;
- with ``--exec CMD`` it runs ``CMD`` per file (``{}`` is the path, quoted for ``sh``;
  without ``{}`` the path is the last argument), up to ``K`` at a time, and acknowledges the
  file when the command exits 0; any other status is a failed attempt. The command gets
  ``DELVEFS_GROUP_KEY`` (the object key), ``DELVEFS_GROUP_ATTEMPT`` (1 for the first) and
  ``DELVEFS_GROUP_MEMBER``. Commands run in this process's process group.

Before a path is printed or a command started, the mount is asked to catch up to the
file's version (``user.delvefs.sync``), as ``delvefs watch`` does, and the path must exist
there (:func:`show_in_mount`): the handler may answer a claim just before it stops, and the
mount then cannot catch up until it is back. The catch-up is asked again with a growing
delay for up to ``CATCH_UP_LIMIT`` seconds; a file the mount still does not show is given
back to the group, its attempt not counted (``give_back``), and never run here.
The member follows the handler as ``watch`` does (every URL of the mount, standbys
included; retries while none answers). When the view's bucket moves to another shard, the
member's long poll is answered 421 and sent to the new owner, where the mount registers
the view again (asked as ``watch`` asks it) and the member joins the group anew: the
group's bookkeeping stays with the old owner, so the new owner's group starts from the
files present when the member joins (docs/SEMANTICS.md, "Work-queue groups"). On SIGTERM
or SIGINT it stops its commands and leaves the group: the files it held go to the other
members, no attempt counted.
"""
from __future__ import annotations

import os
import shlex
import socket
import subprocess
import threading
import uuid
from pathlib import Path

from ..mount.fs.inodes import layout_values, relative_path, unshowable_values
from ..handler.api import HandlerError, HandlerUnavailable, SyncHandlerClient
from .viewdir import ViewFollower, WatchError, announce_ready, locate, log, show_in_mount

CLAIM_WAIT = 20.0  # seconds a claim waits for a file before it is asked again
# seconds a member waits for its mount to show a claimed file before giving the file back
# (a restarted handler answers again within a second or two)
CATCH_UP_LIMIT = 30.0


class GroupMember(ViewFollower):
    def __init__(self, view_dir: Path, group: str, out, *, token: str | None, command: str | None,
                 jobs: int = 1, lease: float | None = None, max_failures: int | None = None,
                 ready_file: Path | None = None):
        if jobs < 1:
            raise WatchError("-j must be 1 or more")
        super().__init__(view_dir)
        self.group = group
        self.out = out
        self.command = command
        self.jobs = jobs if command else 1
        self.lease_wanted, self.max_failures = lease, max_failures
        self.ready_file = ready_file
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # long polls on one client; renewals and reports from the other threads on another
        self.claims = SyncHandlerClient(self.view.handler, token, timeout=60)
        self.control = SyncHandlerClient(self.view.handler, token, timeout=30)
        if self.view.bucket:
            for client in (self.claims, self.control):
                client.know_view(self.view.id, self.view.bucket)
        self.control_lock = threading.Lock()
        self.slots = threading.Semaphore(self.jobs)
        self.lease = 60.0
        # keys in flight here, renewed while they are: their commands (None while the mount
        # catches up, or the path is printed)
        self.held: dict[str, subprocess.Popen | None] = {}
        self.held_lock = threading.Lock()

    # --- the handler ---------------------------------------------------------------------------

    def _control(self, call, *args, **kw):
        with self.control_lock:
            return call(*args, **kw)

    def _join(self, existing: bool) -> dict:
        return self.claims.group_join(
            self.view.id, self.group, self.id, existing=existing, lease=self.lease_wanted,
            max_failures=self.max_failures, client=f"{socket.gethostname()}:{os.getpid()}")

    def join(self, existing: bool) -> None:
        try:
            answer = self.until_answered(lambda: self._join(existing), self.refused)
        except HandlerError as exc:
            raise WatchError(f"handler refused {self.refused}: {exc}") from None
        self.lease = answer["lease"]

    @property
    def refused(self) -> str:
        return f"group {self.group} of view {self.view.name}"

    def claim(self, n: int) -> list[dict]:
        def claim_or_join() -> dict:
            try:
                return self.claims.group_claim(self.view.id, self.group, self.id, n, CLAIM_WAIT)
            except HandlerError as exc:
                if exc.status != 404:
                    raise
            # (a 404 of the join: the handler does not know the view either, e.g. after a move)
            log.warning("the handler does not know group %s (any more): joining it again", self.group)
            self.lease = self._join(existing=False)["lease"]
            return {"files": []}
        try:
            return self.until_answered(claim_or_join, self.refused)["files"]
        except HandlerError as exc:
            raise WatchError(f"claiming files of group {self.group}: {exc}") from None

    def finish(self, key: str, ok: bool, error: str | None = None) -> None:
        """Report the file's end until the handler has it."""
        try:
            state = self.until_answered(lambda: self._control(
                self.control.group_done, self.view.id, self.group, self.id, key, ok, error),
                self.refused)["state"]
        except (HandlerError, WatchError) as exc:
            log.warning("could not report %s as %s: %s", key, "done" if ok else "failed", exc)
            return
        if not ok:
            log.warning("%s failed (%s): now %s", key, error, state.replace("_", " "))

    def give_back(self, key: str, reason: str) -> None:
        """Return a file unworked: the group gives it out again, no attempt counted."""
        try:
            state = self.until_answered(lambda: self._control(
                self.control.group_give_back, self.view.id, self.group, self.id, key, reason),
                self.refused)["state"]
        except (HandlerError, WatchError) as exc:
            log.warning("could not give %s back (%s): it is given out again when its lease runs out",
                        key, exc)
            return
        log.warning("gave %s back to the group unworked (%s): now %s", key, reason, state)

    def path_of(self, f: dict) -> Path | None:
        """Where the mount shows the file; None for a key the view shows no file for
        (docs/SEMANTICS.md, "Which keys are shown")."""
        rel = relative_path(self.view, f["key"])
        props = f["object"].get("properties")
        if not rel or rel.endswith("/") or (
                self.view.layout_by and unshowable_values(layout_values(self.view.layout_by, props or {}))):
            return None
        return locate(self.view_dir, self.view, rel, props)

    def run_command(self, f: dict, path: Path) -> None:
        quoted = shlex.quote(str(path))
        line = self.command.replace("{}", quoted) if "{}" in self.command else f"{self.command} {quoted}"
        env = {**os.environ, "DELVEFS_GROUP_KEY": f["key"], "DELVEFS_GROUP_ATTEMPT": str(f["attempt"]),
               "DELVEFS_GROUP_MEMBER": self.id}
        try:
            try:
                proc = subprocess.Popen(["/bin/sh", "-c", line], env=env, stdin=subprocess.DEVNULL)
            except OSError as exc:
                self.finish(f["key"], False, f"could not start the command: {exc}")
                return
            with self.held_lock:
                self.held[f["key"]] = proc
            status = proc.wait()
            if not self.stopping.is_set():
                self.finish(f["key"], status == 0, None if status == 0 else f"exit status {status}")
        finally:
            with self.held_lock:
                self.held.pop(f["key"], None)
            self.slots.release()

    def let_go(self, key: str) -> None:
        """A file claimed here that no command runs on: no longer renewed, its slot free."""
        with self.held_lock:
            self.held.pop(key, None)
        self.slots.release()

    def hand_out(self, files: list[dict]) -> None:
        """Print or start each claimed file once the mount shows it; give back the others."""
        with self.held_lock:
            for f in files:
                self.held[f["key"]] = None  # renewed while the mount catches up
        paths = {}
        for f in files:
            path = self.path_of(f)
            if path is None:
                self.let_go(f["key"])
                self.finish(f["key"], False, "the view shows no file for this key")
            else:
                paths[f["key"]] = path
        if not paths:
            return
        shown = set(show_in_mount(self, max(f["version"] for f in files), list(paths.values()),
                                  CATCH_UP_LIMIT))
        for f in files:
            path = paths.get(f["key"])
            if path is None:
                continue
            if path not in shown:
                self.let_go(f["key"])
                self.give_back(f["key"], f"the mount did not show {path}")
                continue
            if self.command is None:
                self.out.write(f"{path}\n")
                self.out.flush()
                self.finish(f["key"], True)
                self.let_go(f["key"])
            else:
                threading.Thread(target=self.run_command, args=(f, path), daemon=True,
                                 name=f"delvefs-group-{f['key'][:40]}").start()

    # --- leases --------------------------------------------------------------------------------

    def renew_loop(self) -> None:
        """Renew the leases of the files in flight here while they run."""
        while not self.stopping.wait(self.lease / 3):
            with self.held_lock:
                if not self.held:
                    continue
            try:
                held = set(self._control(self.control.group_renew, self.view.id, self.group, self.id)["held"])
            except HandlerError as exc:
                if isinstance(exc, HandlerUnavailable):
                    self.unreachable(exc)
                continue
            self.answered()
            with self.held_lock:
                lost = [k for k in self.held if k not in held]
            for key in lost:
                log.warning("lost the lease of %s (it may be given to another member)", key)

    # --- the member ------------------------------------------------------------------------------

    def take_slots(self) -> int:
        """Wait for a free slot; take every free one (how many)."""
        while not self.slots.acquire(timeout=1.0):
            if self.stopping.is_set():
                raise WatchError("stopped")
        n = 1
        while n < self.jobs and self.slots.acquire(blocking=False):
            n += 1
        return n

    def run(self, existing: bool) -> None:
        self.join(existing)
        announce_ready(self.ready_file, f"member {self.id} of group {self.group} of view "
                                        f"{self.view.name}: waiting for files")
        threading.Thread(target=self.renew_loop, daemon=True, name="delvefs-group-renew").start()
        try:
            while True:
                n = self.take_slots()
                files = self.claim(n)
                for _ in range(n - len(files)):
                    self.slots.release()
                if files:
                    self.hand_out(files)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the commands and leave the group (the files held here go to the others)."""
        self.stopping.set()
        with self.held_lock:
            procs = [p for p in self.held.values() if p is not None]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            self._control(self.control.group_leave, self.view.id, self.group, self.id)
        except HandlerError as exc:
            log.warning("could not leave group %s (%s): its files come back after their leases", self.group, exc)
        self.claims.close()
        self.control.close()
