"""The ``delvefs`` command: one console script, one subcommand per SPEC contract.

Each subcommand's flags are declared here (the contract other tools rely on);
its implementation lives in the module named in COMMANDS and is imported only
when that subcommand runs, so ``delvefs check`` never loads pyfuse3 or pika.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, function(args) -> exit code)
COMMANDS = {
    "eventhandler": ("eventhandler.main", "run"),
    "notify": ("eventhandler.notify", "run"),
    "mount": ("delvefs.client.mount", "run_mount"),
    "umount": ("delvefs.client.mount", "run_umount"),
    "sync": ("delvefs.client.mount", "run_sync"),
    "check": ("rulesets.check", "run"),
    "watch": ("delvefs.client.watch", "run"),
    "principal": ("eventhandler.auth", "run_principal_command"),
    "status": ("delvefs.client.status", "run"),
    "reload": ("delvefs.client.reload", "run"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="delvefs",
        description="DelveFS: an event-driven semantic file system for S3 object stores.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("eventhandler", help="run the event handler in the foreground",
                       description="Consume bucket notifications, keep object metadata in "
                                   "LevelDB and serve views to clients over HTTP. "
                                   "Stops cleanly on SIGTERM/SIGINT.")
    p.add_argument("--state-dir", help="LevelDB state directory (default: ~/.local/state/delvefs); "
                   "a second handler on the same directory stands by and takes over when the first exits")
    p.add_argument("--listen", default=None, help="HOST:PORT of the HTTP API (default 127.0.0.1:8731)")
    p.add_argument("--amqp-url", help="RabbitMQ URL (default: $DELVEFS_AMQP_URL)")
    p.add_argument("--exchange", help="exchange MinIO publishes to (default: $DELVEFS_AMQP_EXCHANGE or delvefs)")
    p.add_argument("--sqs-queue", metavar="URL",
                   help="consume S3 notifications from this SQS queue instead of RabbitMQ (AWS S3; "
                        "default: $DELVEFS_SQS_QUEUE)")
    p.add_argument("--sqs-dead-letter-queue", metavar="URL",
                   help="SQS queue for unusable messages (default: $DELVEFS_SQS_DEAD_LETTER_QUEUE, "
                        "else the queue's RedrivePolicy target)")
    p.add_argument("--principals", metavar="FILE",
                   help="principals file of `delvefs principal` (default: STATE_DIR/principals.json)")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve a non-loopback --listen address without any principal or token "
                        "(anyone who can connect may call the API)")
    p.add_argument("--view-ttl", type=float, metavar="SECONDS",
                   help="forget views no mount has registered, listed, polled or renewed a proof for "
                        "this long (default: $DELVEFS_VIEW_TTL or 604800 = 7 days; 0 = never)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    _add_logging(p, "stderr")

    p = sub.add_parser("principal", help="issue, revoke and list the event handler's API tokens",
                       description="Each user of the event handler is a principal with a token of "
                                   "its own; the handler keeps only the tokens' sha256, in its "
                                   "principals file, and notices changes without a restart.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (("add", "issue a token for a new principal NAME (printed once)"),
                         ("revoke", "revoke the token of NAME (refused from the handler's next request)"),
                         ("list", "list the principals")):
        a = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        if action != "list":
            a.add_argument("name", metavar="NAME", help="letters, digits, '-' and '_' (at most 64)")
        a.add_argument("--state-dir", help="the handler's state directory (default: ~/.local/state/delvefs)")
        a.add_argument("--principals", metavar="FILE",
                       help="the principals file (default: STATE_DIR/principals.json)")

    p = sub.add_parser("notify", help="point a bucket's notifications at the handler's target",
                       description="Make BUCKET publish s3:ObjectCreated:* and s3:ObjectRemoved:* "
                                   "to the handler's target through one rule of its notification "
                                   "configuration (Id 'delvefs'), added or updated; the rules of "
                                   "other consumers are kept.")
    p.add_argument("bucket", metavar="BUCKET")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--arn", help="the target: MinIO's AMQP target (arn:minio:sqs::ID:amqp) or an SQS "
                                      "queue ARN (default: $DELVEFS_NOTIFY_ARN, else arn:minio:sqs::PRIMARY:amqp)")
    target.add_argument("--remove", action="store_true",
                        help="take the 'delvefs' rule away instead (other rules are kept)")

    p = sub.add_parser("mount", help="mount a views file", description="Mount VIEWS.yaml at MOUNTPOINT; "
                       "returns when the mount is ready unless --foreground.")
    p.add_argument("views", metavar="VIEWS.yaml")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--cache-dir", help="local cache directory (default: ~/.cache/delvefs/mounts/<hash>)")
    p.add_argument("--cache-size", help="bound on clean cached data: 10GiB or 10G = 10*2^30 bytes, "
                   "10GB = 10*10^9 (default: none; either way the smaller of 5%% and 1 GiB of the "
                   "cache's file system is kept free)")
    p.add_argument("--handler", help="handler URL, or comma-separated URLs of the active handler and "
                   "its standbys (default: $DELVEFS_HANDLER_URL)")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground, log to stderr")
    p.add_argument("--eager", action="store_true",
                   help="close returns once the file is safe in the local journal; uploads and "
                        "batched deletes follow in the background ($DELVEFS_UPLOAD_CONCURRENCY at "
                        "a time, default 16); fsync and `delvefs sync` wait for them")
    p.add_argument("-o", dest="options", action="append", metavar="OPT[,OPT...]",
                   help="mount options as in fstab: allow_other, ro, uid=, umask=, cache_size=, ... "
                        "(docs/CONFIGURATION.md); a flag wins over the same option")
    p.add_argument("--read-only", action="store_true", help="every view read-only: writes answer EROFS")
    p.add_argument("--allow-other", action="store_true",
                   help="let other users use the mount; the kernel then checks the mode bits shown "
                        "(default_permissions). Needs user_allow_other in /etc/fuse.conf unless root")
    p.add_argument("--allow-root", action="store_true", help="let root use the mount too")
    p.add_argument("--default-permissions", action="store_true",
                   help="the kernel checks the owner and mode bits shown for every access")
    p.add_argument("--auto-unmount", action="store_true",
                   help="unmount when the daemon dies, even by SIGKILL (fusermount3 stays behind to do it)")
    p.add_argument("--uid", help="owner shown for every file and directory (default: the mounting user)")
    p.add_argument("--gid", help="group shown for every file and directory (default: the mounting user's)")
    p.add_argument("--umask", help="octal permission bits taken away from every mode shown (default 0)")
    p.add_argument("--file-mode", help="octal permission bits of files (default 0644; a read-only "
                   "view's lose their write bits)")
    p.add_argument("--dir-mode", help="octal permission bits of directories (default 0755; as files)")
    p.add_argument("--config", metavar="FILE",
                   help="KEY=VALUE lines read into the environment first (S3 and handler settings "
                        "of fstab and systemd mounts; AWS_*, DELVEFS_*, proxies only; not writable "
                        "by group or others)")
    _add_logging(p, "<cache-dir>/mount.log unless --foreground")

    p = sub.add_parser("umount", help="flush dirty files, then unmount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")

    p = sub.add_parser("sync", help="wait until everything a mount has queued reached S3",
                       description="Upload every closed file of MOUNT not yet in S3 and send its "
                                   "queued deletes now, and wait for them (eager mounts queue "
                                   "them). Exit status 1, naming each file and why, if any failed.")
    p.add_argument("mountpoint", metavar="MOUNT")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds to wait for the mount's answer (default 3600)")

    p = sub.add_parser("check", help="validate a views file; optionally match objects",
                       description="Validate VIEWS.yaml. With --objects, print one JSON line per "
                                   "object: {\"bucket\", \"key\", \"views\": [...]}.")
    p.add_argument("views", metavar="VIEWS.yaml")
    p.add_argument("--objects", metavar="OBJECTS.jsonl",
                   help="one JSON object a line: bucket, key, size, mtime, [atime], tags, metadata")

    p = sub.add_parser("status", help="what a mount or the event handler is doing",
                       description="MOUNT: its views and how fresh they are, files not in S3 yet "
                                   "(pending, uploading, failed, conflict), the cache. --handler: "
                                   "the handler's event source and lag, buckets with scan progress, "
                                   "views, dead letters (what your token may see).")
    p.add_argument("mountpoint", metavar="MOUNT", nargs="?")
    p.add_argument("--handler", nargs="?", const="", metavar="URL",
                   help="ask the event handler instead (default URL: $DELVEFS_HANDLER_URL)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")

    p = sub.add_parser("reload", help="make a mount read its views file again",
                       description="The mount at MOUNT reads the views file it was mounted with "
                                   "again (as on SIGHUP): new views appear, dropped ones disappear, "
                                   "changed ones are listed anew. An invalid file changes nothing "
                                   "and its error is printed (exit status 1).")
    p.add_argument("mountpoint", metavar="MOUNT")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for the mount's answer (default 120)")

    p = sub.add_parser("watch", help="print each file that appears in a mounted view",
                       description="Print the path of each file that appears in MOUNT/VIEW, one a "
                                   "line, until stopped.")
    p.add_argument("view_dir", metavar="MOUNT/VIEW")
    p.add_argument("--existing", action="store_true", help="first print the files already there")
    _add_version(parser)
    for command in sub.choices.values():  # every subcommand, and theirs, answers --version
        _add_version(command)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                for nested in action.choices.values():
                    _add_version(nested)
    return parser


def _add_version(parser: argparse.ArgumentParser) -> None:
    from . import __version__
    parser.add_argument("--version", action="version", version=f"delvefs {__version__}",
                        help="print the version and exit")


def _add_logging(p: argparse.ArgumentParser, default_file: str) -> None:
    p.add_argument("--log-level", metavar="LEVEL", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="debug, info, warning or error (default: $DELVEFS_LOG_LEVEL, else info)")
    p.add_argument("--log-file", metavar="FILE",
                   help=f"log to FILE, rotated at 10 MiB, 5 kept (default: {default_file})")
    p.add_argument("--debug", action="store_true",
                   help="log level debug" + (", stay in the foreground and log each FUSE request"
                                             if "mount" in default_file else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-") and "-o" in argv:
        # mount.fuse3 runs `delvefs VIEWS DIR -o OPTIONS` for a fuse.delvefs line of /etc/fstab
        # where /sbin/mount.fuse.delvefs is not installed
        from .client.options import main_helper
        return main_helper(argv)
    args = build_parser().parse_args(argv)
    if args.command == "mount":
        # -o and --config first: a config file sets variables the modules read at import
        from .client.options import OptionError, apply
        try:
            apply(args)
        except OptionError as exc:
            print(f"delvefs mount: {exc}", file=sys.stderr)
            return 2
    module_name, func_name = COMMANDS[args.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"delvefs {args.command}: not implemented yet", file=sys.stderr)
        return 2
    return getattr(module, func_name)(args)


if __name__ == "__main__":
    sys.exit(main())
