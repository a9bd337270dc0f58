"""``delvefs reload MOUNT``: the mount reads its views file again (the mount's side:
delvefs/client/mount/reload.py)."""
from __future__ import annotations

import sys

from ..mount.control import ControlError, request
from ..mount.reload import summary_lines


def run(args) -> int:
    """``delvefs reload MOUNT``."""
    try:
        summary = request(args.mountpoint, "reload", timeout=args.timeout)
    except ControlError as exc:
        print(f"delvefs reload: {exc}", file=sys.stderr)
        return 1
    for line in summary_lines(summary):
        print(line)
    return 0
