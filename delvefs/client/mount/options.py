"""The options of ``delvefs mount``: one table, :data:`MOUNT_OPTIONS`, declares each once —
its long flag, its ``-o`` name as s3fs, rclone and fstab spell it, how its text is read,
its default and its help. The table makes both the flags of ``delvefs mount``
(:func:`add_mount_arguments`, called by the CLI) and the ``-o`` parsing (:func:`parse_o`);
delvefs/client/mount/settings.py folds both, the config file and the environment into one
:class:`~delvefs.client.mount.settings.MountSettings`. A flag given on the command line wins over
the same ``-o`` option. Unknown options are refused with the list of known ones. The
generic options mount(8) passes from /etc/fstab (``rw``, ``nofail``, ``_netdev``,
``x-systemd.*``, ...) are accepted and ignored.

``config=FILE`` (``--config``) names a file of ``KEY=VALUE`` lines read into the
environment before the settings are (:func:`load_config`): an fstab mount has no user
shell, so its S3 endpoint and keys and the handler's URL and token come from such a file.
The file must not be writable by group or others and may set only ``AWS_*``,
``DELVEFS_*``, the proxy variables and the CA bundle variables: options are visible to
every user (``ps``), so secrets go in the file.
"""
from __future__ import annotations

import argparse
import os
import re
import stat
from dataclasses import dataclass
from typing import Callable


class OptionError(ValueError):
    """A one-line, user-facing reason why the options are refused."""


# ----------------------------------------------------------------- how values are read

def _octal(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not re.fullmatch(r"0?[0-7]{1,4}", text):
            raise OptionError(f"{name}={text}: expected octal permission bits such as 0640")
        value = int(text, 8)
        if value > 0o777:
            raise OptionError(f"{name}={text}: only permission bits (at most 0777)")
        return value
    return parse


def _id(name: str, what: str, lookup: Callable[[str], int]) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if text.isdigit():
            return int(text)
        try:
            return lookup(text)
        except KeyError:
            raise OptionError(f"{name}={text}: no such {what}") from None
    return parse


def _user(name: str) -> int:
    import pwd
    return pwd.getpwnam(name).pw_uid


def _group(name: str) -> int:
    import grp
    return grp.getgrnam(name).gr_gid


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise OptionError(f"log_level={text}: one of {', '.join(LOG_LEVELS).lower()}")
    return level


def _text(name: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text:
            raise OptionError(f"{name}= needs a value")
        return text
    return parse


# as rclone and s3fs: a bare K/M/G/T is binary (10G = 10 GiB); KB/MB/GB/TB are decimal
_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3, "t": 1024**4,
          "tb": 1000**4, "tib": 1024**4}


def parse_size(text: str) -> int:
    """``10G``/``10GiB`` -> 10*2^30, ``10GB`` -> 10*10^9, ``1000000`` -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise OptionError(f"--cache-size {text!r}: expected a size such as 500MiB, 10G (= 10GiB), "
                          "10GB (= 10^10 bytes) or 1000000")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _mode_text(value: int) -> str:
    return f"{value:04o}"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ``:PORT`` -> ("", port):
    every interface, as rclone's ``--metrics-addr``."""
    host, colon, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if not colon or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host and not bracketed):
        raise OptionError(f"metrics_addr={text}: expected HOST:PORT such as 127.0.0.1:9101 "
                          "(:PORT: every interface)")
    return host, int(port)


def _address_text(value: tuple[str, int]) -> str:
    host, port = value
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _seconds(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = 0.0
        if not value > 0:
            raise OptionError(f"{name}={text}: expected a number of seconds above 0")
        return value
    return parse


def _seconds_or_zero(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value < float("inf"):
            raise OptionError(f"{name}={text}: expected a number of seconds, 0 or more")
        return value
    return parse


def _fsync(text: str) -> str:
    if text not in ("upload", "journal"):
        raise OptionError(f"fsync={text}: upload (fsync waits for the upload) or journal "
                          "(--eager: until the file is durable on the local disk)")
    return text


def _passthrough(text: str) -> str:
    value = {"on": "on", "yes": "on", "true": "on", "1": "on", "rw": "rw",
             "off": "off", "no": "off", "false": "off", "0": "off"}.get(text.lower())
    if value is None:
        raise OptionError(f"passthrough={text}: on (reads), rw (reads and writes) or off")
    return value


def _on_off(name: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = {"on": "on", "yes": "on", "true": "on", "1": "on",
                 "off": "off", "no": "off", "false": "off", "0": "off"}.get(text.lower())
        if value is None:
            raise OptionError(f"{name}={text}: on or off")
        return value
    return parse


def _prefetch(text: str) -> str:
    if text.lower() not in ("off", "index", "dir"):
        raise OptionError(f"prefetch={text}: off, index or dir")
    return text.lower()


# ----------------------------------------------------------------- the table

@dataclass(frozen=True)
class MountOption:
    field: str                     # the MountSettings field it sets (and the parsed flag's dest)
    flag: str                      # the long flag of `delvefs mount`
    name: str | None               # the -o name; None: a flag only
    parse: Callable[[str], object] | None  # text -> value; None: a switch without value
    help: str
    default: object = None         # when neither the flag nor -o gives it
    metavar: str | None = None
    show: Callable[[object], str] = str  # value -> the flag's text (the daemon gets flags)


MOUNT_OPTIONS: tuple[MountOption, ...] = (
    MountOption("cache_dir", "--cache-dir", "cache_dir", _text("cache_dir"),
                "local cache directory (default: ~/.cache/delvefs/mounts/<hash>)", metavar="DIR"),
    MountOption("cache_size", "--cache-size", "cache_size", parse_size,
                "bound on clean cached data: 10GiB or 10G = 10*2^30 bytes, 10GB = 10*10^9 "
                "(default: none; either way the smaller of 5%% and 1 GiB of the cache's file "
                "system is kept free)", metavar="SIZE"),
    MountOption("handler_url", "--handler", "handler", _text("handler"),
                "handler URL, or comma-separated URLs of the active handler and its standbys, "
                "or a sharded deployment's shard map NAME=URL,...[,@BUCKET=NAME...] (a shard's "
                "URLs in order: active, standbys) (default: $DELVEFS_HANDLER_URL); -o handler= "
                "may be repeated, one entry each", metavar="URL[,URL...]|MAP"),
    MountOption("foreground", "--foreground", None, None, "stay in the foreground, log to stderr",
                default=False),
    MountOption("eager", "--eager", "eager", None,
                "close returns once the file is safe in the local journal; uploads and batched "
                "deletes follow in the background ($DELVEFS_UPLOAD_CONCURRENCY at a time, "
                "default 16); fsync and `delvefs sync` wait for them", default=False),
    MountOption("write_back", "--write-back", "write_back", _seconds_or_zero("write_back"),
                "eager files (every file with --eager, else those a view's `write: {eager: "
                "...}` names): a closed file is uploaded once it is left unchanged this many "
                "seconds (a file removed before costs no request); sync, fsync, unmount and "
                "the backlog bounds upload sooner; 0: at once (default 2)", default=2.0,
                metavar="SECONDS"),
    MountOption("fsync", "--fsync", "fsync", _fsync,
                "upload: fsync(2) returns once the file is in S3; journal (--eager only): once "
                "the file and its journal record are durable on the local disk, the upload "
                "follows in the background (default: upload)", default="upload",
                metavar="upload|journal"),
    MountOption("read_only", "--read-only", "ro", None,
                "every view read-only: writes answer EROFS", default=False),
    MountOption("allow_other", "--allow-other", "allow_other", None,
                "let other users use the mount; the kernel then checks the mode bits shown "
                "(default_permissions). Needs user_allow_other in /etc/fuse.conf unless root",
                default=False),
    MountOption("allow_root", "--allow-root", "allow_root", None,
                "let root use the mount too", default=False),
    MountOption("default_permissions", "--default-permissions", "default_permissions", None,
                "the kernel checks the owner and mode bits shown for every access", default=False),
    MountOption("auto_unmount", "--auto-unmount", "auto_unmount", None,
                "unmount when the daemon dies, even by SIGKILL (fusermount3 stays behind to do it)",
                default=False),
    MountOption("uid", "--uid", "uid", _id("uid", "user", _user),
                "owner shown for every file and directory, number or name (default: the mounting user)",
                metavar="UID"),
    MountOption("gid", "--gid", "gid", _id("gid", "group", _group),
                "group shown for every file and directory, number or name (default: the mounting "
                "user's)", metavar="GID"),
    MountOption("umask", "--umask", "umask", _octal("umask"),
                "octal permission bits taken away from every mode shown (default 0)",
                default=0, metavar="OCTAL", show=_mode_text),
    MountOption("file_mode", "--file-mode", "file_mode", _octal("file_mode"),
                "octal permission bits of files (default 0644; a read-only view's lose their "
                "write bits)", metavar="OCTAL", show=_mode_text),
    MountOption("dir_mode", "--dir-mode", "dir_mode", _octal("dir_mode"),
                "octal permission bits of directories (default 0755; as files)", metavar="OCTAL",
                show=_mode_text),
    MountOption("config_file", "--config", "config", _text("config"),
                "KEY=VALUE lines read into the environment first (S3 and handler settings of "
                "fstab and systemd mounts; AWS_*, DELVEFS_*, proxies only; not writable by "
                "group or others)", metavar="FILE"),
    MountOption("log_level", "--log-level", "log_level", _level,
                "debug, info, warning or error (default: $DELVEFS_LOG_LEVEL, else info)",
                metavar="LEVEL"),
    MountOption("log_file", "--log-file", "log_file", _text("log_file"),
                "log to FILE, rotated at 10 MiB, 5 kept (default: <cache-dir>/mount.log unless "
                "--foreground)", metavar="FILE"),
    MountOption("debug", "--debug", "debug", None,
                "log level debug, stay in the foreground and log each FUSE request", default=False),
    MountOption("metrics_addr", "--metrics-addr", "metrics_addr", parse_address,
                "serve Prometheus metrics on http://HOST:PORT/metrics (:PORT: every interface; "
                "default: none)", metavar="HOST:PORT", show=_address_text),
    MountOption("metrics_textfile", "--metrics-textfile", "metrics_textfile", _text("metrics_textfile"),
                "write Prometheus metrics to FILE (atomically, every --metrics-interval seconds) "
                "for node_exporter's textfile collector (default: none)", metavar="FILE"),
    MountOption("metrics_interval", "--metrics-interval", "metrics_interval",
                _seconds("metrics_interval"), "seconds between writes of --metrics-textfile "
                "(default 15)", default=15.0, metavar="SECONDS"),
    MountOption("passthrough", "--passthrough", "passthrough", _passthrough,
                "on: the kernel reads files whose whole object is cached straight from the "
                "cache directory, without the mount (FUSE passthrough: Linux >= 6.9, "
                "CAP_SYS_ADMIN; off with --eager, which uses the writeback cache instead); "
                "rw: also writes new and truncated files into their local file (a cp into one "
                "is then no server-side copy; with --eager it replaces the writeback cache); "
                "off: every read and write goes through the mount (default: on)",
                default="on", metavar="on|rw|off"),
    MountOption("stale_if_error", "--stale-if-error", "stale_if_error", _on_off("stale_if_error"),
                "on: an open of a cached file whose ttl has passed is served the cached copy "
                "when S3 cannot be asked whether it is current (refused, reset, timed out, "
                "5xx), shown by user.delvefs.unconfirmed; off: such an open fails EIO "
                "(default: on)", default="on", metavar="on|off"),
    MountOption("prefetch", "--prefetch", "prefetch", _prefetch,
                "what an open fetches besides the file: index, the index files next to an "
                "opened data file (x.bam.bai, x.bai, .csi, .crai, .tbi), whole; dir, those and "
                "the first block of the directory's other files (a declared working set); "
                "off: nothing (default: index)", default="index", metavar="off|index|dir"),
)

# -o name -> its option (docs/CONFIGURATION.md lists them all; tests check it)
BY_NAME: dict[str, MountOption] = {o.name: o for o in MOUNT_OPTIONS if o.name}

# mount(8)'s generic options, passed along from /etc/fstab: nothing for DelveFS to do
# (FUSE mounts are always nosuid and nodev; boot ordering is systemd's business)
IGNORED = frozenset({"rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "auto", "noauto",
                     "nofail", "_netdev", "defaults", "user", "nouser", "users", "owner",
                     "noatime", "relatime", "atime", "async"})
IGNORED_PREFIXES = ("x-", "comment=")


def add_mount_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``delvefs mount``, each option's and ``-o``. Values stay text: the
    settings read flags and ``-o`` options alike (:func:`read`)."""
    for option in MOUNT_OPTIONS:
        if option.parse is None:
            parser.add_argument(option.flag, dest=option.field, action="store_true", help=option.help)
        else:
            parser.add_argument(option.flag, dest=option.field, metavar=option.metavar, help=option.help)
    parser.add_argument("-o", dest="options", action="append", metavar="OPT[,OPT...]",
                        help="mount options as in fstab: allow_other, ro, uid=, umask=, cache_size=, "
                             "... (docs/CONFIGURATION.md); a flag wins over the same option")


def split(text: str) -> list[str]:
    """``a,b=c`` -> ["a", "b=c"]; ``\\,`` is a comma inside a value."""
    items, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def parse_o(groups: list[str] | None) -> dict[str, object]:
    """The ``-o`` arguments (each comma-separated) -> {field: text, or True for a switch}.
    ``handler`` may be given more than once (the active handler and its standbys, in order)."""
    given: dict[str, object] = {}
    for group in groups or ():
        for item in split(group):
            name, has_value, value = item.partition("=")
            if name in IGNORED or item.startswith(IGNORED_PREFIXES):
                continue
            option = BY_NAME.get(name)
            if option is None:
                raise OptionError(f"unknown mount option {name!r}; known: {', '.join(BY_NAME)} "
                                  f"(and mount(8)'s generic ones, ignored: {', '.join(sorted(IGNORED))}, x-*)")
            if option.parse is None:
                if has_value:
                    raise OptionError(f"mount option {name} takes no value")
                given[option.field] = True
                continue
            if not has_value:
                raise OptionError(f"mount option {name} needs a value: {name}=...")
            if option.field == "handler_url" and option.field in given:
                value = f"{given[option.field]},{value}"
            given[option.field] = value
    return given


def read(args) -> dict[str, object]:
    """Every option's value from the parsed flags of ``delvefs mount`` and their ``-o``
    options: a flag wins over the same option; text is read by the option's parser; what
    neither gives is the option's default. Raises OptionError."""
    by_o = parse_o(getattr(args, "options", None))
    values: dict[str, object] = {}
    for option in MOUNT_OPTIONS:
        value = getattr(args, option.field, None)
        if value is None or value is False:
            value = by_o.get(option.field, option.default)
        if isinstance(value, str) and option.parse is not None:
            value = option.parse(value)
        values[option.field] = value
    if values["fsync"] == "journal" and not values["eager"]:
        raise OptionError("fsync=journal needs --eager (without it close and fsync upload)")
    if values["allow_other"] and values["allow_root"]:
        raise OptionError("allow_other and allow_root exclude each other (allow_other includes root)")
    if values["allow_other"]:
        # other users' requests run with the mount's S3 credentials: the kernel must check
        # them against the owner and mode bits shown
        values["default_permissions"] = True
    return values


def as_flags(values, skip: tuple[str, ...] = ()) -> list[str]:
    """The long flags that give the options of ``values`` (an object with the options'
    fields: the settings) again, but those whose field is in ``skip`` and those at their
    default."""
    flags: list[str] = []
    for option in MOUNT_OPTIONS:
        value = getattr(values, option.field)
        if option.field in skip or value is None or value is False or value == option.default:
            continue
        flags += [option.flag] if option.parse is None else [option.flag, option.show(value)]
    return flags


# variables a config file may set
CONFIG_VARIABLES = re.compile(r"(AWS_|DELVEFS_)[A-Z0-9_]+|(?i:https?_proxy|no_proxy)|"
                              r"SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE")


def load_config(path: str, environ=None) -> dict[str, str]:
    """Read ``KEY=VALUE`` lines (``#`` comments, optional ``export``, optional quotes) into
    ``environ`` (default os.environ); the file's values win. Returns what was set."""
    environ = os.environ if environ is None else environ
    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            text = f.read()
    except OSError as exc:
        raise OptionError(f"config file {path}: {exc.strerror}") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OptionError(f"config file {path} is writable by group or others: chmod go-w {path}")
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise OptionError(f"config file {path}:{number}: expected KEY=VALUE")
        if not CONFIG_VARIABLES.fullmatch(key):
            raise OptionError(f"config file {path}:{number}: {key} may not be set here "
                              "(only AWS_*, DELVEFS_*, proxy and CA bundle variables)")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    environ.update(values)
    return values


def check_allow_other(settings, fuse_conf: str = "/etc/fuse.conf") -> None:
    """allow_other/allow_root for a user who is not root needs ``user_allow_other`` in
    /etc/fuse.conf (fusermount3 refuses otherwise): say so before mounting."""
    if not (settings.allow_other or settings.allow_root) or os.getuid() == 0:
        return
    try:
        with open(fuse_conf, encoding="utf-8") as f:
            allowed = any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        allowed = False
    if not allowed:
        which = "allow_other" if settings.allow_other else "allow_root"
        raise OptionError(f"{which} needs a line 'user_allow_other' in {fuse_conf} "
                          "(root must add it) when a user who is not root mounts")
