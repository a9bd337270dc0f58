"""The mount's control channel (delvefs/client/mount/control.py) with a real mount: the
operations `delvefs sync`, `status` and `reload` are sent over."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .mounts import handler, mounts, tree_views  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

ASK = ("import json, sys\n"
       "from delvefs.client.mount import control\n"
       "try:\n"
       "    print(json.dumps(control.request(sys.argv[1], sys.argv[2], timeout=30)))\n"
       "except control.ControlError as exc:\n"
       "    print('ERROR', exc)\n")


def ask(mounts, mountpoint, op) -> str:
    # a process of its own, with the mount's environment (the socket lives in its state dir)
    r = subprocess.run([sys.executable, "-c", ASK, str(mountpoint), op], env=mounts.env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_mount_answers_its_user_and_names_what_it_knows(mounts, bucket, tmp_path):
    mp = mounts.mount(tree_views(bucket))
    reply = ask(mounts, mp, "ping")
    assert f'"pid": {mounts.daemon_pid(mp)}' in reply
    unknown = ask(mounts, mp, "no-such-operation")
    assert unknown.startswith("ERROR unknown operation 'no-such-operation'") and "ping" in unknown
    plain = tmp_path / "plain"
    plain.mkdir()
    assert ask(mounts, plain, "ping") == f"ERROR {plain} is not mounted"
    mounts.umount(mp)
    assert ask(mounts, mp, "ping") == f"ERROR {mp} is not mounted"
