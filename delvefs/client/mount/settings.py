"""A mount's settings: one frozen :class:`MountSettings`, built once and handed to the
constructors of the parts that need them.

:meth:`MountSettings.from_args` reads, in this order: the flags of ``delvefs mount`` and
its ``-o`` options (the table of delvefs/client/mount/options.py; a flag wins), the config file
they name (its ``KEY=VALUE`` lines go into the environment, which the daemon inherits and
boto3 reads too), then the environment (delvefs/shared/config.py knows the variables).
:meth:`MountSettings.defaults` is every setting at its default, for tests.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from delvefs.shared import config
from . import options
from .mountpoints import default_cache_dir

# the kernel's limit on an unanswered FUSE request (Linux 6.14+; 0 or absent: none)
KERNEL_REQUEST_TIMEOUT = "/proc/sys/fs/fuse/default_request_timeout"


def capped_scan_wait(wait: float, limit_file: str = KERNEL_REQUEST_TIMEOUT) -> float:
    """``wait``, but at most half the kernel's FUSE request timeout where one is set: a
    request left unanswered past it would abort the whole mount."""
    try:
        with open(limit_file) as f:
            kernel = int(f.read())
    except (OSError, ValueError):
        kernel = 0
    return min(wait, kernel / 2) if kernel > 0 else wait


@dataclass(frozen=True)
class MountSettings:
    """Everything a mount is told, resolved (uid and gid are numbers, the cache directory
    and the handler URL are chosen): its options, what the environment says, and the
    constants of the file system core. ``writeback_cache`` (unless given) and
    ``fuse_options`` follow from the rest."""

    # what is mounted where (absolute paths; None in tests without a mount)
    views_path: str | None = None
    mountpoint: str | None = None
    # the options of delvefs/client/mount/options.py, read and resolved
    cache_dir: Path | None = None
    cache_size: int | None = None            # bound on clean cached data, bytes
    handler_url: str = config.DEFAULT_HANDLER_URL  # one URL, or the active one and standbys
    foreground: bool = False
    eager: bool = False
    write_back: float = 2.0                  # eager: seconds a closed file waits unchanged
    fsync: str = "upload"                    # fsync(2) waits for: upload, or (eager) journal
    read_only: bool = False
    allow_other: bool = False
    allow_root: bool = False
    default_permissions: bool = False
    auto_unmount: bool = False
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    umask: int = 0
    file_mode: int | None = None             # None: 0644 (0444 in a read-only view)
    dir_mode: int | None = None              # None: 0755 (0555)
    config_file: str | None = None
    log_level: str | None = None
    log_file: str | None = None
    debug: bool = False
    metrics_addr: tuple[str, int] | None = None  # (host, port) of the metrics' HTTP server
    metrics_textfile: str | None = None      # the metrics' file for node_exporter
    metrics_interval: float = 15.0           # seconds between writes of that file
    passthrough: str = "on"                  # FUSE passthrough: on (reads), rw (and writes), off
    stale_if_error: str = "on"               # on: a cached copy S3 cannot confirm is served
    prefetch: str = "index"                  # what an open fetches besides: off, index, dir
    # from the environment (delvefs/shared/config.py)
    handler_token: str | None = None
    handler_principal: str = config.DEFAULT_PRINCIPAL
    handler_timeout: float = 20.0
    proof_lifetime: int = config.DEFAULT_PROOF_LIFETIME
    s3: config.S3Settings = field(default_factory=lambda: config.S3Settings.from_env({}))
    s3_connect_timeout: float = 3.0
    s3_read_timeout: float = 8.0
    s3_attempts: int = 3
    state_dir: Path = field(default_factory=lambda: config.state_home({}))
    ready_timeout: float = 120.0
    upload_concurrency: int = 16
    upload_while_writing: bool = False
    stale_after: float = 2.0
    scan_wait: float = 3600.0
    copy_threshold: int = config.MAX_SINGLE_COPY
    # the file system core's constants
    page_size: int = 20000          # names asked of the handler per listing page
    retry_initial: float = 1.0      # first and longest delay between an upload's attempts
    retry_max: float = 60.0
    delete_gather: float = 0.02     # seconds without an unlink before queued DELETEs go
    overlay_bound: float = 120.0    # seconds a local change outranks the handler's view of it

    # the kernel's writeback cache; None: on for eager mounts (writes are journaled locally)
    # unless they write through passthrough instead (``passthrough=rw``: the kernel does not
    # combine the two; passthrough writes need no coalescing)
    writeback_cache: bool | None = None

    def __post_init__(self):
        if self.writeback_cache is None:
            object.__setattr__(self, "writeback_cache", self.eager and self.passthrough != "rw")

    @property
    def metrics(self) -> bool:
        """Whether the mount exports Prometheus metrics (delvefs/client/mount/metrics.py)."""
        return self.metrics_addr is not None or self.metrics_textfile is not None

    @property
    def fuse_options(self) -> set[str]:
        """The FUSE mount options (besides fsname/subtype) the settings ask for."""
        return {name for name in ("allow_other", "allow_root", "default_permissions", "auto_unmount")
                if getattr(self, name)}

    @classmethod
    def defaults(cls, **overrides) -> "MountSettings":
        """Every setting at its default (no flags, no environment) but ``overrides``."""
        return cls(**overrides)

    @classmethod
    def from_args(cls, args, environ=None) -> "MountSettings":
        """The settings of ``delvefs mount`` parsed as ``args`` (flags, ``-o``), its config
        file (read into ``environ``, default os.environ) and the environment.
        Raises options.OptionError."""
        env = os.environ if environ is None else environ
        given = options.read(args)
        if given["config_file"]:
            options.load_config(given["config_file"], env)
        mountpoint = os.path.realpath(args.mountpoint)
        state_dir = config.state_home(env)
        token = config.handler_token(env)
        given.update(
            cache_dir=(Path(given["cache_dir"]).resolve() if given["cache_dir"]
                       else default_cache_dir(mountpoint, state_dir)),
            handler_url=config.handler_url(given["handler_url"], env),
            uid=os.getuid() if given["uid"] is None else given["uid"],
            gid=os.getgid() if given["gid"] is None else given["gid"],
            log_file=os.path.abspath(given["log_file"]) if given["log_file"] else None,
            metrics_textfile=(os.path.abspath(given["metrics_textfile"]) if given["metrics_textfile"]
                              else None))
        return cls(
            **given,
            views_path=os.path.abspath(args.views),
            mountpoint=mountpoint,
            handler_token=token,
            handler_principal=config.handler_principal(token, env),
            handler_timeout=config.handler_timeout(env),
            proof_lifetime=config.proof_lifetime(env),
            s3=config.S3Settings.from_env(env),
            s3_connect_timeout=config.s3_connect_timeout(env),
            s3_read_timeout=config.s3_read_timeout(env),
            s3_attempts=config.s3_attempts(env),
            state_dir=state_dir,
            ready_timeout=config.mount_timeout(env),
            upload_concurrency=config.upload_concurrency(env),
            upload_while_writing=config.upload_while_writing(env),
            stale_after=config.stale_after(env),
            scan_wait=capped_scan_wait(config.scan_wait(env)),
            copy_threshold=config.copy_threshold(env),
        )

    def daemon_flags(self) -> list[str]:
        """The flags that give the daemon these settings: the options', but the config
        file (its variables are in the environment the daemon inherits), the log file
        and --foreground (the launcher gives those)."""
        return options.as_flags(self, skip=("config_file", "log_file", "foreground"))
