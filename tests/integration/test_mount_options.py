"""Mount conventions with real kernel mounts: an fstab line mounted by mount(8) through
/sbin/mount.fuse.delvefs (a temporary fstab, `mount -T`), owner and modes as stat shows
them, read-only mounts, allow_other with the kernel's permission checks, auto_unmount
after a SIGKILL, and FUSE requests in the debug log (docs/CONFIGURATION.md)."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from delvefs.client.mount.mountpoints import mounted_fstype

from ..conftest import service_unavailable
from ..waiting import wait_until
from .mounts import DELVEFS, handler, mounts, put  # noqa: F401

pytestmark = [pytest.mark.services, pytest.mark.fuse]

HELPER = "/sbin/mount.fuse.delvefs"


def views_of(bucket: str, writable: bool = True) -> str:
    return f"""
    data:
      bucket: {bucket}
      object: "data/*"
      ttl: 1s
      writable: {str(writable).lower()}
    """


def test_fstab_line_mounts_with_owner_and_modes(mounts, s3, bucket, tmp_path):
    if os.getuid() != 0 or not os.path.exists(HELPER) or not shutil.which("mount"):
        service_unavailable(f"mount(8) as root and {HELPER} (linked by scripts/bootstrap.sh) are needed")
    put(s3, bucket, "data/a.txt", b"hello")
    views = mounts.views(views_of(bucket))
    mp = tmp_path / "fstab-mnt"
    mp.mkdir()
    # an fstab mount has no shell environment: S3 and the handler come from the config file
    config = tmp_path / "mount.env"
    keep = ("AWS_", "DELVEFS_HANDLER_URL", "DELVEFS_HANDLER_TOKEN", "DELVEFS_STATE_HOME")
    config.write_text("".join(f"{k}={v}\n" for k, v in mounts.env.items() if k.startswith(keep)))
    config.chmod(0o600)
    fstab = tmp_path / "fstab"
    opts = (f"rw,nodev,_netdev,x-systemd.automount,uid=1234,gid=4321,umask=027,file_mode=0664,"
            f"cache_dir={tmp_path / 'fstab-cache'},config={config}")
    fstab.write_text(f"# a test fstab\n{views} {mp} fuse.delvefs {opts} 0 0\n")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # mount(8) at boot: no user environment
    r = subprocess.run(["mount", "-T", str(fstab), str(mp)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    mounts.mounted.append(str(mp))
    assert mounted_fstype(str(mp)) == "fuse.delvefs"
    st = os.stat(mp / "data/a.txt")
    assert (st.st_uid, st.st_gid) == (1234, 4321)
    assert stat.S_IMODE(st.st_mode) == 0o640  # 0664 less umask 027
    assert stat.S_IMODE(os.stat(mp / "data/").st_mode) == 0o750  # 0755 less 027
    assert (mp / "data/a.txt").read_bytes() == b"hello"
    assert mounts.umount(mp).returncode == 0
    # without the helper, mount(8) runs fuse3's mount.fuse3, which runs `delvefs VIEWS DIR -o ...`
    fuse3 = shutil.which("mount.fuse3", path="/usr/sbin:/sbin")
    if fuse3:
        r = subprocess.run([fuse3, str(views), str(mp), "-t", "fuse.delvefs", "-o", opts.replace("umask=027", "umask=077")],
                           env={"PATH": f"{Path(DELVEFS).parent}:{env['PATH']}"}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        mounts.mounted.append(str(mp))
        assert stat.S_IMODE(os.stat(mp / "data/a.txt").st_mode) == 0o600
        assert mounts.umount(mp).returncode == 0


def test_read_only_mount_refuses_writes_and_shows_no_write_bits(mounts, s3, bucket):
    put(s3, bucket, "data/a.txt", b"hello")
    mp = mounts.mount(views_of(bucket), "-o", "ro,log_level=debug")
    f = mp / "data/a.txt"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o444
    for attempt in (lambda: f.write_bytes(b"changed"), lambda: (mp / "data/new").write_bytes(b"x"),
                    lambda: f.unlink(), lambda: (mp / "data/dir").mkdir()):
        with pytest.raises(OSError) as err:
            attempt()
        assert err.value.errno == errno.EROFS
    assert s3.get_object(Bucket=bucket, Key="data/a.txt")["Body"].read() == b"hello"
    assert f.read_bytes() == b"hello"
    # log_level=debug: one line per FUSE request in the daemon's (rotated) log
    log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
    assert "DEBUG delvefs.client.mount.fuse_adapter: lookup(" in log
    mounts.umount(mp)


def test_allow_other_lets_the_kernel_check_the_modes_shown(mounts, s3, bucket):
    if os.getuid() != 0:
        service_unavailable("another user's access is tried with setuid: root is needed")
    put(s3, bucket, "data/a.txt", b"hello")
    # a mountpoint other users can reach (the test's tmp_path is root's alone)
    base = Path(tempfile.mkdtemp(prefix="delvefs-allow-other-"))
    try:
        base.chmod(0o755)
        open_mp, private_mp = base / "open", base / "private"
        open_mp.mkdir()
        private_mp.mkdir()
        mounts.mount(views_of(bucket), "-o", "allow_other", mountpoint=open_mp)
        mounts.mount(views_of(bucket), "-o", "allow_other,umask=077", mountpoint=private_mp)

        def as_nobody(*argv):
            return subprocess.run(argv, user=65534, group=65534, capture_output=True, text=True, timeout=60)
        assert as_nobody("cat", str(open_mp / "data/a.txt")).stdout == "hello"
        refused = as_nobody("sh", "-c", f"echo x > {open_mp / 'data/a.txt'}")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
        assert s3.get_object(Bucket=bucket, Key="data/a.txt")["Body"].read() == b"hello"
        refused = as_nobody("cat", str(private_mp / "data/a.txt"))
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
        for mp in (open_mp, private_mp):
            mounts.umount(mp)
    finally:
        for mp in (base / "open", base / "private"):
            if mounted_fstype(str(mp)) is not None:
                subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_auto_unmount_takes_the_mount_away_when_the_daemon_is_killed(mounts, s3, bucket):
    put(s3, bucket, "data/a.txt", b"hello")
    # allow_root too: libfuse takes it along (as root it changes nothing else)
    mp = mounts.mount(views_of(bucket, writable=False), "-o", "auto_unmount,allow_root")
    assert (mp / "data/a.txt").read_bytes() == b"hello"
    os.kill(mounts.daemon_pid(mp), signal.SIGKILL)
    wait_until(lambda: mounted_fstype(str(mp)) is None, 30, "the mount to go away after SIGKILL")
    mounts.mounted.remove(str(mp))
    assert os.listdir(mp) == []
