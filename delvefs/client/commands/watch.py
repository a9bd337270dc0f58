"""``delvefs watch MOUNT/VIEW [--existing]``: print each file that appears in a view.

The subscriber side of a publish/subscribe pipeline::

    delvefs watch /mnt/in | while read f; do align "$f"; done

Driven by the handler's change stream (``GET /v1/views/{id}/stream``, server-sent
events), not by polling listings. The mount tells watch which view a directory is
(``user.delvefs.view`` on the view directory) and is asked to catch up before a path
is printed (``setxattr user.delvefs.sync <version>``), so every printed path can be
opened at once. While the mount cannot catch up (its handler restarts: the stream gave a
change the mount cannot fetch yet), watch asks again with a growing delay and prints
nothing meanwhile; a path the caught-up mount does not show (the file left the view
again) is not printed.

Once watch follows the stream (every file that appears from then on is printed), it says
so: ``delvefs watch: ready: ...`` on stderr, and ``--ready-file PATH`` is created.

"Once per appearance": watch keeps the set of keys present in the view. A ``put`` of
a key not present prints it; a ``delete`` removes it (a later ``put`` prints again);
an update of a present key prints nothing. Across a reconnect the stream resumes
after the last version seen (``Last-Event-ID``), and when the handler answers
``resync`` (its change log no longer reaches back) the view is listed again and
only keys not present before are printed — so no file is printed twice or missed,
also when the handler restarts meanwhile.

When the view's bucket moves to another shard (``delvefs shards move``), the old owner
ends the stream with a ``moved`` event naming the new owner; watch opens it there. The new
owner does not know the view until the mount registers it there, so watch asks the mount
to (``setxattr user.delvefs.sync now``), and goes on after the new owner's first scan:
its versions are its own, so it answers ``resync``, and watch lists the view again and
prints the files that appeared meanwhile — none missed, none twice.

While the handler does not answer, watch says so on stderr, once ("event handler
unreachable ..."), and again when it answers ("... answers again"); stdout stays the list
of paths. (The mount meanwhile serves its last listing: ``user.delvefs.stale``.)
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from delvefs.shared.config import handler_token
from ..mount.fs.inodes import layout_values, relative_path, unshowable_values
from ..handler.api import HandlerError, HandlerUnavailable, Resync, SyncHandlerClient
from .viewdir import ViewFollower, WatchError, locate, log
from .viewdir import announce_ready, show_in_mount
from .workgroup import GroupMember

PAGE = 5000
# longer than the handler's keepalives on the change stream (every 15 s)
STREAM_READ_TIMEOUT = 45.0


class Watcher(ViewFollower):
    def __init__(self, view_dir: Path, out, *, token: str | None, ready_file: Path | None = None):
        super().__init__(view_dir)
        self.out = out
        self.ready_file = ready_file
        self.handler = SyncHandlerClient(self.view.handler, token, timeout=STREAM_READ_TIMEOUT)
        if self.view.bucket:
            self.handler.know_view(self.view.id, self.view.bucket)
        self.present: set[str] = set()
        self.version = 0

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
        located = [self.locate(rel, props) for rel, props in paths]
        shown = set(show_in_mount(self, version, located, limit=None))
        for path in located:
            if path in shown:
                self.out.write(f"{path}\n")
            else:
                log.warning("%s left the view before the mount showed it: not printed", path)
        self.out.flush()

    def locate(self, rel: str, props: dict | None) -> Path:
        return locate(self.view_dir, self.view, rel, props)

    def apply(self, change: dict) -> None:
        key = change["key"]
        self.version = max(self.version, change["v"])
        if change["op"] != "put":
            self.present.discard(key)
        elif key not in self.present:
            self.present.add(key)
            self.emit([(key, (change.get("object") or {}).get("properties"))], self.version)

    # --- the stream ----------------------------------------------------------------------

    def follow(self) -> None:
        """Consume the change stream from ``self.version`` on (raises Resync when the handler
        asks; follows the view's bucket to another shard)."""
        for change in self.handler.follow(self.view.id, self.version):
            self.mount_refreshed = False
            self.apply(change)

    def relist_until_answered(self, print_new: bool) -> None:
        self.until_answered(lambda: self.relist(print_new), f"view {self.view.name}")

    def run(self, existing: bool) -> None:
        self.relist_until_answered(print_new=existing)
        # the stream resumes from this listing's version: files that appear from now on are printed
        announce_ready(self.ready_file, f"watching {self.view_dir}: {len(self.present)} files present, "
                                        f"version {self.version}")
        delay = 0.1
        while True:
            try:
                self.follow()
            except Resync:
                log.warning("handler asked for a resync of view %s: listing it again", self.view.name)
                self.relist_until_answered(print_new=True)
                delay = 0.1
                continue
            except HandlerUnavailable as exc:
                self.unreachable(exc)
            except HandlerError as exc:
                if exc.status == 404 and self.register_again(exc):
                    pass  # asked again below, once the mount registered the view there
                elif exc.status in (401, 403, 404):
                    raise WatchError(f"handler refused view {self.view.name}: {exc}") from None
                else:
                    log.warning("change stream of %s interrupted (%s); reconnecting", self.view.name, exc)
            delay = self.pause(delay)
            try:
                # The handler may have been reset: a version it no longer knows is a 410.
                self.handler.health()
                self.answered()
                delay = 0.1
            except HandlerError as exc:
                self.unreachable(exc)


def run(args) -> int:
    logging.basicConfig(level=logging.INFO, format="delvefs watch: %(message)s", stream=sys.stderr)
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # SIGPIPE stays ignored: a write to a handler's closed connection must be an error the
    # client retries, not the end of the process; a closed stdout ends it below
    ready_file = Path(args.ready_file) if args.ready_file else None
    try:
        if ready_file is not None:
            # one left by an earlier run would say "ready" before this one is
            forget_ready_file(ready_file)
        if args.group is not None:
            GroupMember(Path(args.view_dir), args.group, sys.stdout, token=handler_token(),
                        command=args.exec, jobs=args.jobs, lease=args.lease,
                        max_failures=args.max_failures, ready_file=ready_file).run(args.existing)
        elif args.exec is not None:
            raise WatchError("--exec runs a command per file of a group: give --group NAME")
        else:
            Watcher(Path(args.view_dir), sys.stdout, token=handler_token(),
                    ready_file=ready_file).run(args.existing)
    except WatchError as exc:
        print(f"delvefs watch: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader of the paths went away (`watch | head`): end quietly (a member has left
        # its group on the way out, giving back the file it was printing)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if ready_file is not None:  # no longer watching
            try:
                forget_ready_file(ready_file)
            except WatchError:
                pass
    return 0


def forget_ready_file(ready_file: Path) -> None:
    try:
        ready_file.unlink(missing_ok=True)
    except OSError as exc:
        raise WatchError(f"--ready-file {ready_file}: {exc.strerror}") from None
    if not ready_file.parent.is_dir():
        raise WatchError(f"--ready-file {ready_file}: no directory {ready_file.parent}")
