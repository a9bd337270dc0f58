"""A view's directory in a mount, as ``delvefs watch`` and the members of a work-queue group
see it (delvefs/client/commands/watch.py, delvefs/client/commands/workgroup.py): which view it is
(``user.delvefs.view``), where a key's file shows below it, how to make the mount catch
up to a version (``user.delvefs.sync``), and how both follow the handler through its
outages and through a move of the view's bucket to another shard (:class:`ViewFollower`).
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..mount.fs.inodes import layout_values, value_dir
from ..handler.api import HandlerError, HandlerUnavailable

log = logging.getLogger("delvefs.client.commands.watch")

VIEW_XATTR = "user.delvefs.view"
SYNC_XATTR = "user.delvefs.sync"
RETRY_MAX = 2.0  # seconds between attempts to reach the handler, at most


class WatchError(Exception):
    """Something the user must fix (not a view directory, mount gone): one line, exit 1."""


@dataclass(frozen=True)
class ViewInfo:
    id: str
    name: str
    handler: str  # the mount's handler setting: its URLs, or the shard map
    root: str
    layout: str
    layout_by: tuple[str, ...] | None = None  # layout "by": the property of each directory level
    bucket: str | None = None  # where a sharded client sends the view's requests

    @classmethod
    def of(cls, view_dir: Path) -> "ViewInfo":
        try:
            raw = os.getxattr(view_dir, VIEW_XATTR)
        except OSError as exc:
            if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.ENOENT):
                raise WatchError(f"{view_dir} is not a view directory of a DelveFS mount") from None
            raise WatchError(f"{view_dir}: {exc.strerror}") from None
        info = json.loads(raw)
        by = info.get("layout_by")
        # "handlers": the whole setting ("handler" is the serving URL; mounts that predate
        # "handlers" gave the setting there)
        setting = info.get("handlers") or info["handler"]
        return cls(info["id"], info["name"], setting, info["root"], info["layout"],
                   tuple(by) if by else None, info.get("bucket"))


def locate(view_dir: Path, view: ViewInfo, rel: str, props: dict | None) -> Path:
    """Where the mount shows the file named ``rel``: in a layout by properties (flat
    names one directory level per property down), below the directories of its values,
    which the handler's listings and changes carry (``props``)."""
    by = view.layout_by
    if not by:
        return view_dir / rel
    return view_dir.joinpath(*(value_dir(v) for v in layout_values(by, props or {})), rel)


def refresh_view(view_dir: Path) -> OSError | None:
    """Ask the mount to refresh the view now (``user.delvefs.sync`` ``now``): where the
    handler no longer knows the view, the mount registers its views again — at the new
    owner, when the view's bucket moved to another shard. None, or the mount's error (the
    handler could not give the refresh yet: e.g. the new owner's first scan runs)."""
    try:
        os.setxattr(view_dir, SYNC_XATTR, b"now")
    except OSError as exc:
        return exc
    return None


class ViewFollower:
    """What ``delvefs watch`` and a group member share: the view of a directory, and
    asking the handler again until it answers. An outage is said on stderr once, and again
    when it ends. A view the handler does not know (404) — its bucket was moved to another
    shard, whose 421 the client followed, or the handler lost its state — is registered
    again by the mount (:func:`refresh_view`); only a 404 right after the mount refreshed the
    view is a refusal."""

    def __init__(self, view_dir: Path):
        self.view_dir = view_dir
        self.view = ViewInfo.of(view_dir)
        self.stopping = threading.Event()
        self.outage: str | None = None  # why the handler does not answer, while it does not
        self.mount_refreshed = False  # the mount refreshed the view since the handler last answered for it

    def unreachable(self, exc: HandlerError) -> None:
        """The handler did not answer: said once per outage."""
        if self.outage is None:
            if exc.code == "scanning":
                log.warning("the event handler is still scanning the bucket of view %s (%s "
                            "objects listed so far): waiting for it", self.view.name,
                            exc.body.get("listed", "?"))
            else:
                log.warning("event handler unreachable (%s): no new files are printed until it "
                            "answers again; retrying", exc)
        self.outage = str(exc)

    def answered(self) -> None:
        if self.outage is not None:
            log.warning("event handler answers again: catching up on view %s", self.view.name)
            self.outage = None

    def view_answered(self) -> None:
        """The handler answered a request about the view itself."""
        self.mount_refreshed = False
        self.answered()

    def register_again(self, exc: HandlerError) -> bool:
        """The handler answered 404 about the view: ask the mount to register it again.
        True: ask the handler again (after a delay); False: the mount refreshed the view and
        the handler still does not know it — a refusal."""
        if self.mount_refreshed:
            return False
        if self.outage is None:
            log.warning("the event handler does not know view %s (%s): its bucket moved to "
                        "another shard, or the handler lost its state; the mount registers it "
                        "again", self.view.name, exc)
        self.outage = str(exc)
        error = refresh_view(self.view_dir)
        if error is None:
            self.mount_refreshed = True
        else:
            log.debug("the mount could not refresh view %s yet: %s", self.view.name, error)
        return True

    def pause(self, delay: float) -> float:
        """Wait ``delay`` seconds before asking again (raises when the mount is gone or the
        follower stops); the next delay."""
        if not self.view_dir.is_dir():
            raise WatchError(f"{self.view_dir} is gone (unmounted?)")
        if self.stopping.wait(delay):
            raise WatchError("stopped")
        return min(delay * 2, RETRY_MAX)

    def until_answered(self, request, refused: str):
        """``request()``'s answer, asked again after a growing delay while the handler does
        not answer or does not know the view yet; a refusal (401, 403, 404) is the user's to
        fix (``refused``: what was refused)."""
        delay = 0.1
        while True:
            try:
                answer = request()
            except HandlerUnavailable as exc:
                self.unreachable(exc)
            except HandlerError as exc:
                if exc.status == 404 and self.register_again(exc):
                    pass
                elif exc.status in (401, 403, 404):
                    raise WatchError(f"handler refused {refused}: {exc}") from None
                else:
                    raise
            else:
                self.view_answered()
                return answer
            delay = self.pause(delay)


# seconds a path may stay missing after a successful catch-up: the kernel drops its cached
# "no such name" a moment after the mount learns the file; later, the file left the view
SHOWN_LIMIT = 2.0
# what user.delvefs.sync fails with while the mount's handler does not answer (EIO: refused,
# 503, no answer in time) or still scans the bucket (EAGAIN): asked again
PASSING_SYNC_ERRORS = frozenset({errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR, errno.EBUSY})
READY = "ready: "  # the line's fixed start (after "delvefs watch: ") once a watch or member is ready


def show_in_mount(follower: ViewFollower, version: int, paths: list[Path],
                  limit: float | None) -> list[Path]:
    """Make the mount catch up to ``version`` (``user.delvefs.sync``) and return the paths of
    ``paths`` it shows then. A catch-up that fails while the handler is away is asked again
    after a growing delay (at most ``RETRY_MAX``), for up to ``limit`` seconds (None: until it
    succeeds); a path still missing ``SHOWN_LIMIT`` seconds after a successful catch-up is
    left out (its file left the view). Raises WatchError when the mount is gone or refuses
    the catch-up for good (another errno)."""
    started = time.monotonic()
    deadline = math.inf if limit is None else started + limit
    missing = list(paths)
    failing: OSError | None = None
    delay = 0.05
    while True:
        try:
            os.setxattr(follower.view_dir, SYNC_XATTR, str(version).encode())
        except OSError as exc:
            if exc.errno not in PASSING_SYNC_ERRORS:
                raise WatchError(f"the mount refused to catch up to version {version} of view "
                                 f"{follower.view.name}: {exc.strerror}") from None
            if failing is None:
                log.warning("the mount cannot show version %d of view %s yet (%s): asking again",
                            version, follower.view.name, exc.strerror)
            failing = exc
        else:
            if failing is not None:
                log.warning("the mount caught up to version %d of view %s", version, follower.view.name)
                failing = None
            missing = [p for p in missing if not os.path.lexists(p)]
            if not missing:
                return list(paths)
            deadline = min(deadline, time.monotonic() + SHOWN_LIMIT)
        if time.monotonic() + delay > deadline:
            if failing is not None:
                log.warning("the mount could not catch up to version %d of view %s in %.1f s (%s)",
                            version, follower.view.name, time.monotonic() - started, failing.strerror)
            gone = set(missing)
            return [p for p in paths if p not in gone]
        delay = follower.pause(delay)


def announce_ready(ready_file: Path | None, what: str) -> None:
    """Say that every file that appears from now on is seen: the line ``delvefs watch: ready:
    WHAT`` on stderr and, with ``--ready-file``, that file (holding the pid; written beside
    and renamed, so that it is whole once it exists)."""
    log.info("%s%s", READY, what)
    if ready_file is None:
        return
    partial = ready_file.with_name(f".{ready_file.name}.{os.getpid()}.partial")
    try:
        partial.write_text(f"{os.getpid()}\n")
        os.replace(partial, ready_file)
    except OSError as exc:
        raise WatchError(f"--ready-file {ready_file}: {exc.strerror}") from None
