"""A view's directory in a mount, as ``delvefs watch`` and the members of a work-queue group
see it (delvefs/client/watch.py, delvefs/client/workgroup.py): which view it is
(``user.delvefs.view``), where a key's file shows below it, and how to make the mount catch
up to a version (``user.delvefs.sync``)."""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .fs.inodes import layout_values, value_dir

VIEW_XATTR = "user.delvefs.view"
SYNC_XATTR = "user.delvefs.sync"
RETRY_MAX = 2.0  # seconds between attempts to reach the handler, at most


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


def locate(view_dir: Path, view: ViewInfo, rel: str, props: dict | None) -> Path:
    """Where the mount shows the file named ``rel``: in a layout by properties (flat
    names one directory level per property down), below the directories of its values,
    which the handler's listings and changes carry (``props``)."""
    by = view.layout_by
    if not by:
        return view_dir / rel
    return view_dir.joinpath(*(value_dir(v) for v in layout_values(by, props or {})), rel)
