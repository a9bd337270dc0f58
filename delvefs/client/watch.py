"""``delvefs watch MOUNT/VIEW [--existing]``: print each file that appears in a view.

The subscriber side of a publish/subscribe pipeline::

    delvefs watch /mnt/in | while read f; do align "$f"; done

Driven by the handler's change stream (``GET /v1/views/{id}/stream``, server-sent
events), not by polling listings. The mount tells watch which view a directory is
(``user.delvefs.view`` on the view directory) and is asked to catch up before a path
is printed (``setxattr user.delvefs.sync <version>``), so every printed path can be
opened at once.

"Once per appearance": watch keeps the set of keys present in the view. A ``put`` of
a key not present prints it; a ``delete`` removes it (a later ``put`` prints again);
an update of a present key prints nothing. Across a reconnect the stream resumes
after the last version seen (``Last-Event-ID``), and when the handler answers
``resync`` (its change log no longer reaches back) the view is listed again and
only keys not present before are printed — so no file is printed twice or missed,
also when the handler restarts meanwhile.

While the handler does not answer, watch says so on stderr, once ("event handler
unreachable ..."), and again when it answers ("... answers again"); stdout stays the list
of paths. (The mount meanwhile serves its last listing: ``user.delvefs.stale``.)
"""
from __future__ import annotations

import errno
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..shared.config import handler_token
from .fs.inodes import layout_values, relative_path, unshowable_values, value_dir
from .handler_api import HandlerError, HandlerUnavailable, Resync, SyncHandlerClient

log = logging.getLogger("delvefs.client.watch")
VIEW_XATTR = "user.delvefs.view"
SYNC_XATTR = "user.delvefs.sync"
PAGE = 5000
RETRY_MAX = 2.0
# longer than the handler's keepalives on the change stream (every 15 s)
STREAM_READ_TIMEOUT = 45.0


class WatchError(Exception):
    """Something the user must fix (not a view directory, mount gone): one line, exit 1."""


@dataclass(frozen=True)
class ViewInfo:
    id: str
    name: str
    handler: str  # its URLs, or the shard map
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
        return cls(info["id"], info["name"], info["handler"], info["root"], info["layout"],
                   tuple(by) if by else None, info.get("bucket"))


class Watcher:
    def __init__(self, view_dir: Path, out, *, token: str | None):
        self.view_dir = view_dir
        self.view = ViewInfo.of(view_dir)
        self.out = out
        self.handler = SyncHandlerClient(self.view.handler, token, timeout=STREAM_READ_TIMEOUT)
        if self.view.bucket:
            self.handler.know_view(self.view.id, self.view.bucket)
        self.present: set[str] = set()
        self.version = 0
        self.outage: str | None = None  # why the handler does not answer, while it does not

    # --- state ---------------------------------------------------------------------------

    def relist(self, print_new: bool) -> None:
        version, objects = self.handler.list_all(self.view.id, PAGE)
        new = [(k, obj.get("properties")) for k, obj in objects.items() if k not in self.present]
        self.present = set(objects)
        self.version = version
        if print_new:
            self.emit(new, version)

    # --- output --------------------------------------------------------------------------

    def emit(self, objects: list[tuple[str, dict | None]], version: int) -> None:
        """Print the paths of ``objects``: (key, its ``properties`` as the handler lists them
        for a layout by properties, else None)."""
        # Folder markers ("sub/") are directories, not files that appear.
        # Keys the view does not show (docs/SEMANTICS.md, "Which keys are shown") print nothing.
        by = self.view.layout_by
        paths = [(rel, props) for rel, props in ((relative_path(self.view, k), props) for k, props in objects)
                 if rel and not rel.endswith("/")
                 and not (by and unshowable_values(layout_values(by, props or {})))]
        if not paths:
            return
        # Make the mount catch up to `version` so each printed path opens at once.
        os.setxattr(self.view_dir, SYNC_XATTR, str(version).encode())
        for rel, props in paths:
            self.out.write(f"{self.locate(rel, props)}\n")
        self.out.flush()

    def locate(self, rel: str, props: dict | None) -> Path:
        """Where the mount shows the file named ``rel``: in a layout by properties (flat
        names one directory level per property down), below the directories of its values,
        which the handler's listings and changes carry (``props``)."""
        by = self.view.layout_by
        if not by:
            return self.view_dir / rel
        return self.view_dir.joinpath(*(value_dir(v) for v in layout_values(by, props or {})), rel)

    def apply(self, change: dict) -> None:
        key = change["key"]
        self.version = max(self.version, change["v"])
        if change["op"] != "put":
            self.present.discard(key)
        elif key not in self.present:
            self.present.add(key)
            self.emit([(key, (change.get("object") or {}).get("properties"))], self.version)

    # --- the handler's outages -----------------------------------------------------------

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

    def until_answered(self, request) -> None:
        """Call ``request`` until the handler answers it (retries after a growing delay)."""
        delay = 0.1
        while True:
            try:
                request()
            except HandlerUnavailable as exc:
                self.unreachable(exc)
            else:
                self.answered()
                return
            if not self.view_dir.is_dir():
                raise WatchError(f"{self.view_dir} is gone (unmounted?)")
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    # --- the stream ----------------------------------------------------------------------

    def follow(self) -> None:
        """Consume the change stream from ``self.version`` on (raises Resync when the handler asks)."""
        for change in self.handler.follow(self.view.id, self.version):
            self.apply(change)

    def run(self, existing: bool) -> None:
        self.until_answered(lambda: self.relist(print_new=existing))
        # Files that appear from now on are printed; scripts may wait for this line.
        log.info("watching %s: %d files present, version %d", self.view_dir, len(self.present), self.version)
        delay = 0.1
        while True:
            try:
                self.follow()
            except Resync:
                log.warning("handler asked for a resync of view %s: listing it again", self.view.name)
                self.until_answered(lambda: self.relist(print_new=True))
                delay = 0.1
                continue
            except HandlerUnavailable as exc:
                self.unreachable(exc)
            except HandlerError as exc:
                if exc.status in (401, 403, 404):
                    raise WatchError(f"handler refused view {self.view.name}: {exc}") from None
                log.warning("change stream of %s interrupted (%s); reconnecting", self.view.name, exc)
            if not self.view_dir.is_dir():
                raise WatchError(f"{self.view_dir} is gone (unmounted?)")
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
            try:
                # The handler may have been reset: a version it no longer knows is a 410.
                self.handler.health()
                self.answered()
                delay = 0.1
            except HandlerError as exc:
                self.unreachable(exc)


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, format="delvefs watch: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `watch | head` ends quietly
    try:
        Watcher(Path(args.view_dir), sys.stdout, token=handler_token()).run(args.existing)
    except WatchError as exc:
        print(f"delvefs watch: {exc}", file=sys.stderr)
        return 1
    return 0
