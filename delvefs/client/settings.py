"""PLACEHOLDER (replaced by the settings module of the mount): the core's fields only."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class MountSettings:
    uid: int = dataclasses.field(default_factory=os.getuid)
    gid: int = dataclasses.field(default_factory=os.getgid)
    eager: bool = False
    upload_concurrency: int = 16
    upload_while_writing: bool = False
    file_mode: int | None = None
    dir_mode: int | None = None
    umask: int = 0
    stale_after: float = 2.0
    scan_wait: float = 3600.0
    page_size: int = 20000
    retry_initial: float = 1.0
    retry_max: float = 60.0
    delete_gather: float = 0.02
    overlay_bound: float = 120.0
    writeback_cache: bool = False

    @classmethod
    def defaults(cls, **overrides) -> "MountSettings":
        return cls(**overrides)
