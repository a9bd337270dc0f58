"""The commands ``delvefs mount``, ``delvefs umount`` and ``delvefs sync``.

``run_mount`` reads the settings (flags, ``-o`` options, config file, environment:
delvefs/client/mount/settings.py), checks what it can at once (mount point, cache directory),
then starts the daemon and returns once the mount answers (delvefs/client/mount/daemon.py),
or, with ``--foreground`` or ``--debug``, runs the mount itself. Refused options exit 2;
every other failure ends with a one-line ``delvefs mount: ...`` error and exit status 1.
The daemon validates the views file (and says what is wrong through its pipe): the
parent stays light, so "mount returns when ready" is mostly the daemon's start.

``run_umount`` runs ``fusermount3 -u``, waits for the mount's daemon to exit (its pid is
recorded in the mount's run file) and prints the daemon's unmount report.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from delvefs.shared.config import state_home, umount_timeout
from ..mount.mountpoints import (MountError, check_mountpoint, mounted_fstype, process_alive, run_file,
                          unmount_report)
from ..mount.options import OptionError, check_allow_other
from ..mount.settings import MountSettings


def run_mount(args) -> int:
    """``delvefs mount VIEWS.yaml MOUNTPOINT [flags] [-o OPTIONS]``."""
    try:
        settings = MountSettings.from_args(args)
    except OptionError as exc:
        print(f"delvefs mount: {exc}", file=sys.stderr)
        return 2
    try:
        check_allow_other(settings)
        check_mountpoint(settings.mountpoint)
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
    except (MountError, OptionError) as exc:
        print(f"delvefs mount: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"delvefs mount: cache directory: {exc}", file=sys.stderr)
        return 1
    from ..mount import daemon
    if settings.foreground or settings.debug:
        return daemon.run_foreground(settings)
    return daemon.launch(settings)


def run_umount(args) -> int:
    """``delvefs umount MOUNTPOINT``: unmount, wait for the daemon's uploads, print what
    it could not upload (exit status 1 then)."""
    mountpoint = os.path.realpath(args.mountpoint)
    fstype = mounted_fstype(mountpoint)
    if fstype is None:
        print(f"delvefs umount: {mountpoint} is not mounted", file=sys.stderr)
        return 1
    if fstype != "fuse.delvefs":
        print(f"delvefs umount: {mountpoint} is a {fstype} mount, not DelveFS", file=sys.stderr)
        return 1
    pid = cache_dir = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads(run_file(mountpoint, state_home()).read_text())
        pid, cache_dir = info["pid"], info.get("cache_dir")
    report = unmount_report(Path(cache_dir)) if cache_dir else None
    if report is not None:
        with contextlib.suppress(OSError):
            report.unlink()
    r = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip().splitlines() or [f"fusermount3 exited with {r.returncode}"])[-1]
        print(f"delvefs umount: {msg}", file=sys.stderr)
        return 1
    if pid is not None:
        # the daemon uploads dirty files before it exits: large ones take their time
        deadline = time.monotonic() + umount_timeout()
        while process_alive(pid):
            if time.monotonic() > deadline:
                print(f"delvefs umount: unmounted, but daemon {pid} still runs", file=sys.stderr)
                return 1
            time.sleep(0.05)
    status = 0
    if report is not None and report.exists():
        for line in report.read_text().splitlines():
            print(f"delvefs umount: {line}", file=sys.stderr)
            if line.startswith("not uploaded"):
                status = 1
    return status


def run_sync(args) -> int:
    """`delvefs sync MOUNT`: wait until every upload and DELETE the mount has queued has
    reached S3, then until the event handler has them (a mount started afterwards lists
    them). Each failure on stderr (``PATH: reason``) and exit status 1; everything in S3 but
    not yet seen by the handler within ``--handler-wait``: exit status 2."""
    from ..mount.control import ControlError, request
    try:
        answer = request(args.mountpoint, "sync", timeout=args.timeout,
                         wait_handler=not args.no_wait_handler, handler_wait=args.handler_wait)
    except ControlError as exc:
        print(f"delvefs sync: {exc}", file=sys.stderr)
        return 1
    failed = answer.get("failed") or []
    for line in failed:
        print(f"delvefs sync: not in S3: {line}", file=sys.stderr)
    unseen = answer.get("unseen") or []
    for line in unseen:
        print(f"delvefs sync: not yet in the event handler: {line}", file=sys.stderr)
    return 1 if failed else 2 if unseen else 0
