"""What the mount benchmarks compare with and how they run: s3fs-fuse on the benchmark's
MinIO; the floor (benchmarks/floorfs.py: a pyfuse3 file system that does nothing, mounted
as a DelveFS mount is) and the pass-through floor (benchmarks/pipeline/passfs.py: the same,
passing every request on to a local directory); the CPU modes — pinned to one CPU or not."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from delvefs.client.mount.mountpoints import mounted_fstype

FLOORFS = Path(__file__).resolve().parent / "floorfs.py"

# On this VM a wake-up across CPUs costs ~100 µs where one on the same CPU costs ~10:
# pinned, what is left is the file system's own cost; unpinned adds the machine's.
CPU_MODES = {"pinned": "Pinned to CPU 0 (`taskset -c 0`: the mount processes and the workload)",
             "unpinned": "Unpinned (any CPU)"}


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


class FloorMount:
    """The floor file system at ``mountpoint``, started with ``options`` (floorfs.py's)."""

    name = "floorfs"

    def __init__(self, mountpoint: Path, *options: str):
        self.mountpoint, self.options, self.proc = mountpoint, options, None
        mountpoint.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        return [sys.executable, str(FLOORFS), str(self.mountpoint), *self.options]

    def mount(self) -> Path:
        """Returns once the floor answers requests (as ``delvefs mount`` returns)."""
        self.proc = subprocess.Popen(self.command(), cwd=FLOORFS.parent.parent, stdout=subprocess.PIPE,
                                     text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.wait(30)
            raise RuntimeError(f"{self.name} at {self.mountpoint} exited with {self.proc.returncode}")
        return self.mountpoint

    def umount(self) -> None:
        subprocess.run(["fusermount3", "-u", str(self.mountpoint)], check=False)
        if mounted_fstype(str(self.mountpoint)):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)])
        self.proc.wait(60)  # (it writes its --state file on the way out)
        self.proc.stdout.close()

    def __enter__(self) -> Path:
        return self.mount()

    def __exit__(self, *exc) -> None:
        self.umount()


class PassMount(FloorMount):
    """benchmarks/pipeline/passfs.py over ``source`` at ``mountpoint`` (FloorMount's unmount)."""

    name = "passfs"

    def __init__(self, source: Path, mountpoint: Path, *options: str):
        super().__init__(mountpoint, *options)
        self.source = source

    def command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.pipeline.passfs", str(self.source), str(self.mountpoint),
                *self.options]


def add_cpu_option(ap) -> None:
    ap.add_argument("--cpus", choices=("both", *CPU_MODES), default="both",
                    help="run pinned to CPU 0, unpinned, or both one after the other (default)")


def cpu_modes(choice: str) -> list[str]:
    return list(CPU_MODES) if choice == "both" else [choice]


@contextlib.contextmanager
def cpu_mode(mode: str):
    """The calling thread, and every process and thread it starts meanwhile, on CPU 0 when
    ``mode`` is "pinned" (the services started before stay where they are)."""
    before = os.sched_getaffinity(0)
    if mode == "pinned":
        os.sched_setaffinity(0, {0})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
