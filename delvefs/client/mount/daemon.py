"""The mount's daemon: ``delvefs mount`` (:func:`launch`) re-executes itself with
``--foreground`` in a new session, logging to ``<cache-dir>/mount.log`` (or
``--log-file``; rotated, delvefs.shared.logsetup), and waits on a pipe for one line from
the child (:func:`run_foreground`): ``OK`` once the file system is mounted and answering,
or ``ERR <message>``. Every failure ends with a one-line ``delvefs mount: ...`` error,
exit status 1 and nothing left mounted. The child gets every setting as a flag; the
config file's variables are in the environment it inherits. Under systemd
(``--foreground``, ``Type=notify``) the mount sends ``READY=1`` once it answers and
``STOPPING=1`` when unmounting starts (delvefs.shared.sdnotify).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from .mountpoints import MountError, mounted_fstype, run_file
from .viewsfile import ViewsFileError, load_views

log = logging.getLogger("delvefs.client.mount")

READY_FD_ENV = "DELVEFS_READY_FD"
LOG_CAPTURE_ENV = "DELVEFS_LOG_CAPTURE"  # set by launch: stdout/stderr are the log file


def launch(settings) -> int:
    """Start the daemon of the mount ``settings`` describe; 0 once it is ready."""
    log_path = Path(settings.log_file) if settings.log_file else settings.cache_dir / "mount.log"
    cmd = [sys.executable, "-m", "delvefs", "mount", settings.views_path, settings.mountpoint,
           "--foreground", *settings.daemon_flags(), "--log-file", str(log_path)]
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log_path, "ab")
    except OSError as exc:
        print(f"delvefs mount: log file {log_path}: {exc.strerror}", file=sys.stderr)
        return 1
    r, w = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(w), LOG_CAPTURE_ENV: "1"})
    # a daemon is not the service systemd started (units run `mount --foreground`)
    env.pop("NOTIFY_SOCKET", None)
    with logf:
        proc = subprocess.Popen(cmd, env=env, pass_fds=(w,), stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=logf, start_new_session=True, cwd="/")
    os.close(w)
    text = _read_answer(r, settings.ready_timeout)
    if text == "OK":
        return 0
    # failed: make sure nothing stays behind
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if mounted_fstype(settings.mountpoint) is not None:
        subprocess.run(["fusermount3", "-u", "-z", settings.mountpoint], capture_output=True)
    if text.startswith("ERR "):
        msg = text[4:]
    elif not text and proc.returncode is not None:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
        msg = f"mount process exited with {proc.returncode}" + (f": {tail[0]}" if tail else "")
    else:
        msg = f"not ready after {settings.ready_timeout:.0f} s (log: {log_path})"
    print(f"delvefs mount: {msg}", file=sys.stderr)
    return 1


def _read_answer(fd: int, timeout: float) -> str:
    """The child's line on the pipe ``fd`` ('' if none came within ``timeout`` seconds)."""
    line = b""
    deadline = time.monotonic() + timeout
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                break
            chunk = pipe.read(4096)
            if not chunk:
                break
            line += chunk
    return line.decode(errors="replace").strip()


def run_foreground(settings) -> int:
    """Run the mount in this process until it is unmounted; tell the launcher (if any)
    on the ready pipe, and record the daemon in the mount's run file while it is ready."""
    import trio

    from delvefs.shared import logsetup
    from .composition import serve

    # the daemon's stdout and stderr are its log file (launch): they follow its rotation
    logsetup.setup(settings.log_level, settings.log_file, debug=settings.debug,
                   capture_std=bool(os.environ.pop(LOG_CAPTURE_ENV, "")))
    ready_fd = int(os.environ.pop(READY_FD_ENV, "-1"))

    def tell(line: str) -> None:
        nonlocal ready_fd
        if ready_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(ready_fd, (line + "\n").encode())
                os.close(ready_fd)
            ready_fd = -1

    rf = run_file(settings.mountpoint, settings.state_dir)

    def ready() -> None:
        rf.parent.mkdir(parents=True, exist_ok=True)
        rf.write_text(json.dumps({"pid": os.getpid(), "mountpoint": settings.mountpoint,
                                  "cache_dir": str(settings.cache_dir)}))
        tell("OK")

    try:
        views = load_views(settings.views_path, settings.read_only)
        trio.run(functools.partial(serve, settings, views, ready))
    except (MountError, ViewsFileError) as exc:
        tell(f"ERR {exc}")
        print(f"delvefs mount: {exc}", file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 — report, then exit non-zero
        if isinstance(exc, KeyboardInterrupt):
            return 0
        log.exception("mount failed")
        tell(f"ERR {type(exc).__name__}: {exc}")
        return 1
    finally:
        with contextlib.suppress(OSError):
            if json.loads(rf.read_text()).get("pid") == os.getpid():
                rf.unlink()
    return 0
