"""`delvefs mount -o ...`, the long flags they stand for, the config file and the
environment as one MountSettings, the mode bits and read-only mounts in the core (no
kernel), --version, cache sizes and the cache's free-space floor."""
from __future__ import annotations

import errno
import os
import stat
from types import SimpleNamespace

import pytest
import trio

from delvefs import __version__, cli
from delvefs.cli import build_parser, main
from delvefs.client.mount import options
from delvefs.client.mount.errors import FsError
from delvefs.client.mount.options import OptionError
from delvefs.client.mount.settings import MountSettings, capped_scan_wait
from delvefs.client.mount.viewsfile import load_views
from tests.core.conftest import World, view


def parse_mount(*argv, environ=None):
    args = build_parser().parse_args(["mount", "v.yaml", "/mnt", *argv])
    return MountSettings.from_args(args, {} if environ is None else environ)


def test_o_options_set_what_the_long_flags_set():
    by_o = parse_mount("-o", "allow_other,uid=1234,gid=99,umask=027,file_mode=0640,dir_mode=750",
                       "-o", "ro,auto_unmount,cache_size=10G,log_level=debug,handler=http://h:1")
    by_flags = parse_mount("--allow-other", "--uid", "1234", "--gid", "99", "--umask", "027",
                           "--file-mode", "0640", "--dir-mode", "750", "--read-only", "--auto-unmount",
                           "--cache-size", "10G", "--log-level", "debug", "--handler", "http://h:1")
    assert by_o == by_flags
    assert by_o.uid == 1234 and by_o.umask == 0o027 and by_o.file_mode == 0o640 and by_o.read_only
    assert by_o.cache_size == 10 << 30 and by_o.log_level == "DEBUG"
    assert by_o.default_permissions  # implied by allow_other


def test_every_option_has_one_flag_and_one_name():
    flags = [o.flag for o in options.MOUNT_OPTIONS]
    fields = [o.field for o in options.MOUNT_OPTIONS]
    assert len(set(flags)) == len(flags) and len(set(fields)) == len(fields)
    mount_flags = {s for a in build_parser()._subparsers._group_actions[0].choices["mount"]._actions
                   for s in a.option_strings}
    assert set(flags) <= mount_flags


def test_a_flag_wins_over_the_same_option():
    settings = parse_mount("-o", "uid=1,cache_size=1G", "--uid", "2")
    assert settings.uid == 2 and settings.cache_size == 1 << 30


def test_handler_repeats_and_escaped_commas_make_one_list():
    assert parse_mount("-o", "handler=http://a:1,handler=http://b:2").handler_url == "http://a:1,http://b:2"
    assert parse_mount("-o", r"handler=http://a:1\,http://b:2").handler_url == "http://a:1,http://b:2"
    assert parse_mount(environ={"DELVEFS_HANDLER_URL": "http://env:1"}).handler_url == "http://env:1"
    assert parse_mount("--handler", "http://flag:1",
                       environ={"DELVEFS_HANDLER_URL": "http://env:1"}).handler_url == "http://flag:1"


def test_fstab_generic_options_are_ignored():
    settings = parse_mount("-o", "rw,nosuid,nodev,noauto,user,_netdev,nofail,defaults,"
                                 "x-systemd.automount,x-systemd.requires=network-online.target,ro")
    assert settings.read_only and not settings.allow_other


@pytest.mark.parametrize("text, message", [
    ("colour=blue", "unknown mount option 'colour'; known: cache_dir"),
    ("uid", "needs a value"),
    ("ro=1", "takes no value"),
    ("umask=999", "octal"),
    ("file_mode=01777", "at most 0777"),
    ("uid=no-such-user-here", "no such user"),
    ("log_level=loud", "one of debug"),
    ("cache_size=lots", "expected a size"),
    ("allow_other,allow_root", "exclude each other"),
])
def test_bad_options_are_refused_clearly(text, message):
    with pytest.raises(OptionError, match=message):
        parse_mount("-o", text)


def test_the_command_refuses_bad_options_with_status_2(capsys):
    assert main(["mount", "v.yaml", "/nonexistent", "-o", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("delvefs mount: unknown mount option 'bogus'") and "allow_other" in err
    assert main(["mount", "v.yaml", "/nonexistent", "--umask", "999"]) == 2
    assert capsys.readouterr().err.startswith("delvefs mount: umask=999: expected octal")


def test_forwarded_flags_give_the_daemon_the_same_settings():
    settings = parse_mount("-o", "ro,uid=7,gid=0,umask=022,allow_root,cache_size=2GB,debug,eager")
    again = parse_mount(*settings.daemon_flags())
    assert again == settings and again.gid == 0


def test_the_environment_and_the_config_file_give_the_rest(tmp_path):
    env = {"DELVEFS_UPLOAD_CONCURRENCY": "1000", "DELVEFS_STALE_AFTER": "0.5",
           "DELVEFS_UPLOAD_WHILE_WRITING": "yes", "DELVEFS_STATE_HOME": str(tmp_path / "state")}
    settings = parse_mount(environ=env)
    assert settings.upload_concurrency == 256 and settings.stale_after == 0.5
    assert settings.upload_while_writing and settings.state_dir == tmp_path / "state"
    assert settings.cache_dir.parent == tmp_path / "state" / "mounts"
    f = tmp_path / "mount.env"
    f.write_text("DELVEFS_HANDLER_TOKEN=secret\nDELVEFS_SCAN_WAIT=60\nAWS_ENDPOINT_URL=http://s3:9000\n")
    f.chmod(0o600)
    settings = parse_mount("-o", f"config={f}", environ=env)
    assert settings.handler_token == "secret" and settings.s3.endpoint_url == "http://s3:9000"
    assert settings.scan_wait == capped_scan_wait(60.0) and env["DELVEFS_SCAN_WAIT"] == "60"
    assert "--config" not in settings.daemon_flags()  # its variables are in the environment


def test_scan_wait_stays_below_the_kernels_request_timeout(tmp_path):
    limit = tmp_path / "default_request_timeout"
    assert capped_scan_wait(3600.0, str(limit)) == 3600.0  # no such file: no limit
    limit.write_text("0\n")
    assert capped_scan_wait(3600.0, str(limit)) == 3600.0
    limit.write_text("600\n")
    assert capped_scan_wait(3600.0, str(limit)) == 300.0 and capped_scan_wait(10.0, str(limit)) == 10.0


def test_defaults_need_no_flags_and_read_no_environment(monkeypatch):
    monkeypatch.setenv("DELVEFS_STALE_AFTER", "99")
    settings = MountSettings.defaults(uid=1000, eager=True)
    assert settings.uid == 1000 and settings.gid == os.getgid() and settings.stale_after == 2.0
    assert settings.writeback_cache and not MountSettings.defaults().writeback_cache
    assert settings.upload_concurrency == 16 and settings.umask == 0 and settings.file_mode is None


def test_config_file_sets_environment_and_refuses_the_rest(tmp_path):
    f = tmp_path / "mount.env"
    f.write_text("# S3 and handler for fstab mounts\nexport AWS_ENDPOINT_URL=http://s3:9000\n"
                 "AWS_ACCESS_KEY_ID='key'\nDELVEFS_HANDLER_URL=\"http://h:8731\"\n\n")
    f.chmod(0o600)
    env: dict = {}
    assert options.load_config(str(f), env) == {"AWS_ENDPOINT_URL": "http://s3:9000",
                                                "AWS_ACCESS_KEY_ID": "key",
                                                "DELVEFS_HANDLER_URL": "http://h:8731"}
    assert env["AWS_ACCESS_KEY_ID"] == "key"
    f.write_text("LD_PRELOAD=/tmp/evil.so\n")
    with pytest.raises(OptionError, match="LD_PRELOAD may not be set here"):
        options.load_config(str(f), {})
    f.write_text("no equals sign\n")
    with pytest.raises(OptionError, match=r"mount.env:1: expected KEY=VALUE"):
        options.load_config(str(f), {})
    f.write_text("AWS_REGION=x\n")
    f.chmod(0o622)
    with pytest.raises(OptionError, match="writable by group or others"):
        options.load_config(str(f), {})
    with pytest.raises(OptionError, match="No such file"):
        options.load_config(str(tmp_path / "missing.env"), {})


def test_allow_other_needs_user_allow_other_for_users(tmp_path, monkeypatch):
    conf = tmp_path / "fuse.conf"
    conf.write_text("# user_allow_other\nmount_max = 1000\n")
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    settings = SimpleNamespace(allow_other=True, allow_root=False)
    with pytest.raises(OptionError, match=f"allow_other needs a line 'user_allow_other' in {conf}"):
        options.check_allow_other(settings, str(conf))
    conf.write_text("user_allow_other\n")
    options.check_allow_other(settings, str(conf))


def test_fuse_options_follow_the_settings():
    assert parse_mount("-o", "allow_other,auto_unmount").fuse_options == {
        "allow_other", "default_permissions", "auto_unmount"}
    assert parse_mount().fuse_options == set()


def test_mount_helper_turns_mount8_arguments_into_delvefs_mount(monkeypatch):
    seen = []
    monkeypatch.setattr("delvefs.cli.main", lambda argv: seen.append(argv) or 0)
    assert cli.main_helper(["/etc/v.yaml", "/mnt/v", "-n", "-o", "rw,uid=5", "-t", "fuse.delvefs"]) == 0
    assert seen == [["mount", "/etc/v.yaml", "/mnt/v", "-o", "rw,uid=5"]]
    assert cli.main_helper(["only-one"]) == 2


def test_version_on_every_command(capsys):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for argv in [[], *[[c] for c in commands], ["principal", "add"]]:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([*argv, "--version"])
        assert exit_.value.code == 0
        assert capsys.readouterr().out.strip() == f"delvefs {__version__}", argv


@pytest.mark.parametrize("text, size", [("10G", 10 << 30), ("10GiB", 10 << 30), ("10GB", 10 * 10**9),
                                        ("500M", 500 << 20), ("1.5k", 1536), ("1000000", 10**6)])
def test_cache_size_units(text, size):
    assert options.parse_size(text) == size


def test_cache_keeps_a_free_space_floor(tmp_path, monkeypatch):
    from delvefs.client.mount.cache.cacheentry import CacheEntry
    from delvefs.client.mount.cache.datacache import DataCache
    cache = DataCache(tmp_path)
    for i in range(4):
        e = CacheEntry("b", f"k{i}", str(tmp_path / f"f{i}"))
        e.size = 100
        cache.add(e)
    total = cache.bytes
    cache.evict()  # no limit, plenty of space: nothing goes
    assert cache.bytes == total
    monkeypatch.setattr(cache.bound, "_space_shortfall", lambda: 150)
    cache.evict()  # the two least recently used make room
    assert cache.bytes == total - 200 and [k for _, k in cache.entries] == ["k2", "k3"]


# ----------------------------------------------------------------- the core, no kernel

async def first_file(w):
    return await w.path("v/a")


@pytest.mark.trio
async def test_modes_owner_and_umask_as_stat_shows_them(tmp_path):
    def world(**modes):
        w = World(tmp_path / str(len(modes)), [view("v", writable=True)],
                  settings=MountSettings.defaults(uid=1000, gid=1000, **modes))
        w.add("v", "data/a", b"x")
        return w
    w = await world(file_mode=0o664, dir_mode=0o775, umask=0o002).start()
    f, d = await first_file(w), await w.path("v")
    assert stat.S_IMODE(w.fs.stat(f)[0]) == 0o664 and stat.S_ISREG(w.fs.stat(f)[0])
    assert stat.S_IMODE(w.fs.stat(d)[0]) == 0o775 and stat.S_ISDIR(w.fs.stat(d)[0])
    w = await world(umask=0o077).start()
    assert stat.S_IMODE(w.fs.stat(await first_file(w))[0]) == 0o600
    assert (w.fs.uid, w.fs.gid) == (1000, 1000)


@pytest.mark.trio
async def test_read_only_mount_refuses_every_write(tmp_path):
    views = tmp_path / "views.yaml"
    views.write_text("v:\n  bucket: bkt\n  object: 'data/*'\n  writable: true\n")
    loaded = load_views(str(views), read_only=True)
    assert [v.writable for v in loaded] == [False]
    w = World(tmp_path, loaded)
    w.add("v", "data/a", b"x")
    await w.start()
    f = await first_file(w)
    assert stat.S_IMODE(w.fs.stat(f)[0]) == 0o444
    top = await w.path("v")
    for attempt in (lambda: w.write("v/new", b"y"), lambda: w.write("v/a", b"y"),
                    lambda: w.fs.unlink(top.ino, "a"), lambda: w.fs.mkdir(top.ino, "d"),
                    lambda: w.fs.setxattr(f.ino, "user.colour", b"red")):
        with pytest.raises(FsError) as err:
            await attempt()
        assert err.value.errno == errno.EROFS
    assert w.obj("v", "data/a")["data"] == b"x"
    await trio.sleep(0)


def test_mount_fuse3_form_of_the_command_mounts(monkeypatch):
    """Without /sbin/mount.fuse.delvefs, mount(8) runs mount.fuse3, which runs
    `delvefs VIEWS DIR -o OPTIONS` (it drops nofail/_netdev and adds dev,suid)."""
    seen = []
    monkeypatch.setattr(cli, "main_helper", lambda argv: seen.append(argv) or 0)
    assert main(["/etc/v.yaml", "/mnt/v", "-o", "rw,uid=5,dev,suid"]) == 0
    assert seen == [["/etc/v.yaml", "/mnt/v", "-o", "rw,uid=5,dev,suid"]]


def test_fsync_journal_is_an_eager_mounts_choice(capsys):
    assert parse_mount().fsync == "upload" and parse_mount("--eager").fsync == "upload"
    by_o = parse_mount("-o", "eager,fsync=journal")
    assert by_o.fsync == "journal" and by_o == parse_mount("--eager", "--fsync", "journal")
    assert parse_mount("-o", "fsync=upload").fsync == "upload"       # strict mounts: as ever
    assert parse_mount(*by_o.daemon_flags()) == by_o                 # the daemon gets it too
    with pytest.raises(OptionError, match=r"^fsync=journal needs --eager"):
        parse_mount("-o", "fsync=journal")
    with pytest.raises(OptionError, match=r"^fsync=later: upload .* or journal"):
        parse_mount("-o", "eager,fsync=later")
    assert main(["mount", "v.yaml", "/nonexistent", "--fsync", "journal"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("delvefs mount: fsync=journal needs --eager") and err.count("\n") == 1


def test_stale_if_error_is_on_by_default_and_off_reaches_the_daemon():
    assert parse_mount().stale_if_error == "on"
    settings = parse_mount("-o", "stale_if_error=off")
    assert settings.stale_if_error == "off" and parse_mount("--stale-if-error", "no") == settings
    assert parse_mount(*settings.daemon_flags()) == settings
    with pytest.raises(OptionError, match="stale_if_error=maybe: on or off"):
        parse_mount("-o", "stale_if_error=maybe")
