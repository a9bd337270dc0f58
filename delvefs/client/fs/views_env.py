"""TEMPORARY: settings of the core from the mount's arguments (replaced on merge)."""
import os

from ..settings import MountSettings
from ...shared.config import upload_concurrency, upload_while_writing


def core_settings(mount_args):
    wait = float(os.environ.get("DELVEFS_SCAN_WAIT", "3600"))
    try:
        with open("/proc/sys/fs/fuse/default_request_timeout") as f:
            kernel = int(f.read())
    except (OSError, ValueError):
        kernel = 0
    eager = bool(getattr(mount_args, "eager", False))
    kw = dict(eager=eager, writeback_cache=eager, upload_concurrency=upload_concurrency(),
              upload_while_writing=upload_while_writing(),
              file_mode=getattr(mount_args, "file_mode", None),
              dir_mode=getattr(mount_args, "dir_mode", None),
              umask=getattr(mount_args, "umask", None) or 0,
              stale_after=float(os.environ.get("DELVEFS_STALE_AFTER", "2")),
              scan_wait=min(wait, kernel / 2) if kernel > 0 else wait)
    for name in ("uid", "gid"):
        if getattr(mount_args, name, None) is not None:
            kw[name] = getattr(mount_args, name)
    return MountSettings.defaults(**kw)
