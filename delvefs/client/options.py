"""``delvefs mount -o OPT,OPT``: mount options as s3fs, rclone and fstab spell them.

One table, ``OPTIONS``, maps each ``-o`` option to the attribute of the parsed arguments
that its long flag sets (``-o uid=1000`` is ``--uid 1000``, ``-o ro`` is ``--read-only``),
so the rest of the mount sees one set of settings however they were given; a flag given
on the command line wins over the same ``-o`` option. Unknown options are refused with the
list of known ones. The generic options mount(8) passes from /etc/fstab (``rw``,
``nofail``, ``_netdev``, ``x-systemd.*``, ...) are accepted and ignored.

``config=FILE`` (``--config``) reads ``KEY=VALUE`` lines into the environment before
anything reads it: an fstab mount has no user shell, so its S3 endpoint and keys and the
handler's URL and token come from such a file. The file must not be writable by group or
others and may set only ``AWS_*``, ``DELVEFS_*``, the proxy variables and the CA bundle
variables: options are visible to every user (``ps``), so secrets go in the file.

``main_helper`` is ``mount.fuse.delvefs``: mount(8)'s helper for ``fuse.delvefs`` lines
of /etc/fstab (``VIEWS DIR fuse.delvefs OPTIONS 0 0``), called as ``mount.fuse.delvefs
VIEWS DIR [-sfnv] [-o OPTIONS]``.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from typing import Callable


class OptionError(ValueError):
    """A one-line, user-facing reason why the options are refused."""


def _octal(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not re.fullmatch(r"0?[0-7]{1,4}", text):
            raise OptionError(f"{name}={text}: expected octal permission bits such as 0640")
        value = int(text, 8)
        if value > 0o777:
            raise OptionError(f"{name}={text}: only permission bits (at most 0777)")
        return value
    return parse


def _id(name: str, lookup) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if text.isdigit():
            return int(text)
        try:
            return lookup(text)
        except KeyError:
            raise OptionError(f"{name}={text}: no such {'user' if name == 'uid' else 'group'}") from None
    return parse


def _uid(text: str) -> int:
    import pwd
    return _id("uid", lambda n: pwd.getpwnam(n).pw_uid)(text)


def _gid(text: str) -> int:
    import grp
    return _id("gid", lambda n: grp.getgrnam(n).gr_gid)(text)


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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Option:
    dest: str                     # attribute of the parsed arguments (the long flag's)
    flag: str                     # the long flag, for messages and the re-executed daemon
    parse: Callable[[str], object] | None  # None: a switch without value
    help: str


# -o name -> what it sets. docs/CONFIGURATION.md lists them all (tests check it).
OPTIONS: dict[str, Option] = {
    "allow_other": Option("allow_other", "--allow-other", None,
                          "let other users use the mount (implies default_permissions)"),
    "allow_root": Option("allow_root", "--allow-root", None,
                         "let root (and the mount's user) use the mount"),
    "default_permissions": Option("default_permissions", "--default-permissions", None,
                                  "the kernel checks the mode bits shown for every access"),
    "auto_unmount": Option("auto_unmount", "--auto-unmount", None,
                           "unmount when the daemon dies, even by SIGKILL"),
    "ro": Option("read_only", "--read-only", None, "every view read-only: writes answer EROFS"),
    "uid": Option("uid", "--uid", _uid, "owner shown for every file and directory"),
    "gid": Option("gid", "--gid", _gid, "group shown for every file and directory"),
    "umask": Option("umask", "--umask", _octal("umask"), "permission bits taken away"),
    "file_mode": Option("file_mode", "--file-mode", _octal("file_mode"), "permission bits of files"),
    "dir_mode": Option("dir_mode", "--dir-mode", _octal("dir_mode"), "permission bits of directories"),
    "cache_dir": Option("cache_dir", "--cache-dir", _text("cache_dir"), "local cache directory"),
    "cache_size": Option("cache_size", "--cache-size", _text("cache_size"), "bound on clean cached data"),
    "handler": Option("handler", "--handler", _text("handler"), "the event handler's URL (repeatable)"),
    "eager": Option("eager", "--eager", None, "close returns once the file is journaled"),
    "config": Option("config", "--config", _text("config"), "environment file (KEY=VALUE lines)"),
    "log_level": Option("log_level", "--log-level", _level, "debug, info, warning or error"),
    "log_file": Option("log_file", "--log-file", _text("log_file"), "log file (rotated)"),
    "debug": Option("debug", "--debug", None, "log level debug and one line per FUSE request"),
}

# mount(8)'s generic options, passed along from /etc/fstab: nothing for DelveFS to do
# (FUSE mounts are always nosuid and nodev; boot ordering is systemd's business)
IGNORED = frozenset({"rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "auto", "noauto",
                     "nofail", "_netdev", "defaults", "user", "nouser", "users", "owner",
                     "noatime", "relatime", "atime", "async"})
IGNORED_PREFIXES = ("x-", "comment=")

# variables a config file may set
CONFIG_VARIABLES = re.compile(r"(AWS_|DELVEFS_)[A-Z0-9_]+|(?i:https?_proxy|no_proxy)|"
                              r"SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE")


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


def parse(groups: list[str] | None) -> dict[str, object]:
    """The ``-o`` arguments (each comma-separated) -> {dest: value}. ``handler`` may be
    given more than once (the active handler and its standbys, in order)."""
    settings: dict[str, object] = {}
    for group in groups or ():
        for item in split(group):
            name, has_value, value = item.partition("=")
            if name in IGNORED or item.startswith(IGNORED_PREFIXES):
                continue
            option = OPTIONS.get(name)
            if option is None:
                raise OptionError(f"unknown mount option {name!r}; known: {', '.join(OPTIONS)} "
                                  f"(and mount(8)'s generic ones, ignored: {', '.join(sorted(IGNORED))}, x-*)")
            if option.parse is None:
                if has_value:
                    raise OptionError(f"mount option {name} takes no value")
                settings[option.dest] = True
                continue
            if not has_value:
                raise OptionError(f"mount option {name} needs a value: {name}=...")
            parsed = option.parse(value)
            if name == "handler" and option.dest in settings:
                parsed = f"{settings[option.dest]},{parsed}"
            settings[option.dest] = parsed
    return settings


def apply(args) -> None:
    """Fold ``args.options`` (the ``-o`` arguments) into ``args``: each option sets its
    long flag's attribute unless that flag was given. Then read ``args.config`` into the
    environment and settle what the options imply. Raises OptionError."""
    for dest, value in parse(getattr(args, "options", None)).items():
        if not hasattr(args, dest):  # its flag is not part of this build's `delvefs mount`
            name = next(n for n, o in OPTIONS.items() if o.dest == dest)
            raise OptionError(f"mount option {name} is not supported by this delvefs mount")
        if getattr(args, dest, None) in (None, False):
            setattr(args, dest, value)
    for dest in ("umask", "file_mode", "dir_mode"):  # the long flags give text
        value = getattr(args, dest, None)
        if isinstance(value, str):
            setattr(args, dest, _octal(dest.replace("_", "-"))(value))
    for dest, convert in (("uid", _uid), ("gid", _gid)):
        value = getattr(args, dest, None)
        if isinstance(value, str):
            setattr(args, dest, convert(value))
    if getattr(args, "log_level", None):
        args.log_level = _level(args.log_level)
    if getattr(args, "allow_other", False) and getattr(args, "allow_root", False):
        raise OptionError("allow_other and allow_root exclude each other (allow_other includes root)")
    if getattr(args, "allow_other", False):
        # other users' requests run with the mount's S3 credentials: the kernel must check
        # them against the owner and mode bits shown
        args.default_permissions = True
    if getattr(args, "config", None):
        load_config(args.config)


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


def forward_flags(args, skip: tuple[str, ...] = ()) -> list[str]:
    """The long flags that give the daemon the settings of ``args`` (after ``apply``), but
    those of ``skip`` (option names); the config file is not among them: its variables are
    in the environment already, and the daemon gets its cache directory resolved."""
    flags: list[str] = []
    for name, option in OPTIONS.items():
        if name in ("config", "cache_dir") or name in skip:
            continue
        value = getattr(args, option.dest, None)
        if value in (None, False):
            continue
        if option.parse is None:
            flags.append(option.flag)
        elif option.dest in ("umask", "file_mode", "dir_mode"):
            flags += [option.flag, f"{value:04o}"]
        else:
            flags += [option.flag, str(value)]
    return flags


def fuse_options(args) -> set[str]:
    """The FUSE mount options (besides fsname/subtype) the settings ask for."""
    wanted = set()
    for dest in ("allow_other", "allow_root", "default_permissions", "auto_unmount"):
        if getattr(args, dest, False):
            wanted.add(dest)
    return wanted


def check_allow_other(args, fuse_conf: str = "/etc/fuse.conf") -> None:
    """allow_other/allow_root for a user who is not root needs ``user_allow_other`` in
    /etc/fuse.conf (fusermount3 refuses otherwise): say so before mounting."""
    if not (getattr(args, "allow_other", False) or getattr(args, "allow_root", False)) or os.getuid() == 0:
        return
    try:
        with open(fuse_conf, encoding="utf-8") as f:
            allowed = any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        allowed = False
    if not allowed:
        which = "allow_other" if getattr(args, "allow_other", False) else "allow_root"
        raise OptionError(f"{which} needs a line 'user_allow_other' in {fuse_conf} "
                          "(root must add it) when a user who is not root mounts")


# ----------------------------------------------------------------- mount(8) helper

def main_helper(argv: list[str] | None = None) -> int:
    """``mount.fuse.delvefs VIEWS DIR [-sfnv] [-o OPTIONS] [-t fuse.delvefs]``: what mount(8)
    runs for a ``fuse.delvefs`` line of /etc/fstab; mounts with ``delvefs mount``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    positional, options = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-o" and i + 1 < len(argv):
            options.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("-o") and len(arg) > 2:
            options.append(arg[2:])
        elif arg == "-t" and i + 1 < len(argv):
            i += 1  # the type: fuse.delvefs
        elif arg in ("-s", "-f", "-n", "-v") or re.fullmatch(r"-[sfnv]+", arg):
            pass  # sloppy, fake, no mtab, verbose: nothing to do (FUSE keeps no mtab)
        else:
            positional.append(arg)
        i += 1
    if len(positional) != 2:
        print("usage: mount.fuse.delvefs VIEWS.yaml MOUNTPOINT [-o OPTIONS]", file=sys.stderr)
        return 2
    from ..cli import main
    return main(["mount", *positional, *[x for o in options for x in ("-o", o)]])


if __name__ == "__main__":
    sys.exit(main_helper())
