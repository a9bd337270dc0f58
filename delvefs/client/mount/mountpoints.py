"""Where mounts live: the checks of a mount point, what is mounted where, and the paths a
mount keeps under the state directory (``$DELVEFS_STATE_HOME``, default ~/.cache/delvefs):
its default cache directory ``mounts/<key>`` and its run file ``run/<key>.json`` (the
daemon's pid and cache directory; the control socket lies beside it), the key being a
hash of the mount point; and in the cache directory, the report of what an unmount left
behind."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path


class MountError(Exception):
    """A one-line, user-facing reason why mounting failed."""


def _key(mountpoint: str) -> str:
    """The hash of a mount point that names its cache directory, run file and socket."""
    return hashlib.sha256(mountpoint.encode()).hexdigest()[:16]


def default_cache_dir(mountpoint: str, state_dir: Path) -> Path:
    return state_dir / "mounts" / _key(mountpoint)


def run_file(mountpoint: str, state_dir: Path) -> Path:
    return state_dir / "run" / f"{_key(mountpoint)}.json"


def unmount_report(cache_dir: Path) -> Path:
    """What the last unmount could not upload (written by the daemon, printed by umount)."""
    return Path(cache_dir) / "unmount-report.txt"


def mounted_fstype(mountpoint: str) -> str | None:
    """The file system type mounted exactly at ``mountpoint``, or None."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        parts = line.split(" ")
        sep = parts.index("-")
        point = parts[4].encode().decode("unicode_escape") if "\\" in parts[4] else parts[4]
        if point == mountpoint:
            found = parts[sep + 1]
    return found


def check_mountpoint(mountpoint: str) -> None:
    """An existing directory with nothing mounted on it, else MountError."""
    if not os.path.isdir(mountpoint):
        raise MountError(f"mountpoint {mountpoint}: not an existing directory")
    if mounted_fstype(mountpoint) is not None or os.path.ismount(mountpoint):
        raise MountError(f"mountpoint {mountpoint} is in use (something is mounted there)")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
