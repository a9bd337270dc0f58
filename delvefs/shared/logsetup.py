"""Logging of the long-running commands (``mount``, ``eventhandler``): one set-up.

The level is ``--log-level``, else DEBUG with ``--debug``, else ``$DELVEFS_LOG_LEVEL``, else
INFO. Lines go to stderr, or with ``--log-file`` to a file rotated by size (``MAX_BYTES``,
``BACKUPS`` old files kept: ``FILE.1`` ... ``FILE.5``). A daemon whose stdout and stderr
are that file (``capture_std``) keeps them on the current file across rotations, so a
traceback printed outside logging (a dying thread, faulthandler) lands beside the log lines.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5
FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
# chatty libraries: their INFO lines are per request
QUIET = ("botocore", "boto3", "s3transfer", "urllib3", "pika")


class _StdRotatingHandler(logging.handlers.RotatingFileHandler):
    """Also points fds 1 and 2 at the current file after each rotation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._capture()

    def _capture(self) -> None:
        if self.stream is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self.stream.fileno(), 1)
            os.dup2(self.stream.fileno(), 2)

    def doRollover(self) -> None:
        super().doRollover()
        self._capture()


def level_of(log_level: str | None, debug: bool = False) -> int:
    name = (log_level or ("DEBUG" if debug else None) or os.environ.get("DELVEFS_LOG_LEVEL") or "INFO").upper()
    level = logging.getLevelName(name)
    return level if isinstance(level, int) else logging.INFO


def setup(log_level: str | None = None, log_file: str | None = None, *, debug: bool = False,
          capture_std: bool = False) -> None:
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        cls = _StdRotatingHandler if capture_std else logging.handlers.RotatingFileHandler
        handler: logging.Handler = cls(log_file, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    level = level_of(log_level, debug)
    root.setLevel(level)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
