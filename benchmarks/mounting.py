"""The comparison file systems of the mount benchmarks: s3fs-fuse on the benchmark's MinIO."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from delvefs.client.mountpoints import mounted_fstype


def mount_s3fs(env: dict, work: Path, bucket: str, mountpoint: Path, timeout: float = 30) -> None:
    """s3fs-fuse of ``bucket`` at ``mountpoint`` (path-style requests to AWS_ENDPOINT_URL,
    the keys from ``env`` in a password file in ``work``); returns once it is mounted."""
    pw = work / "s3fs.passwd"
    pw.write_text(f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}\n")
    pw.chmod(0o600)
    subprocess.run(["s3fs", bucket, str(mountpoint), "-o", f"url={env['AWS_ENDPOINT_URL']},"
                    f"use_path_request_style,passwd_file={pw}"], check=True)
    deadline = time.monotonic() + timeout
    while mounted_fstype(str(mountpoint)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"s3fs did not mount {mountpoint} within {timeout} s")
        time.sleep(0.05)
