"""The ``delvefs`` command: one console script, one subcommand per SPEC contract.

Each subcommand's flags are declared here (the contract other tools rely on), but those
of ``delvefs mount``: the table of delvefs/client/mount/options.py declares each of them once,
flag and ``-o`` option together. A subcommand's implementation lives in the module named
in COMMANDS and is imported only when that subcommand runs, so ``delvefs check`` never
loads pyfuse3 or pika. :func:`main_helper` is ``mount.fuse.delvefs``, mount(8)'s helper
for ``fuse.delvefs`` lines of /etc/fstab.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from .client.mount.options import add_mount_arguments

# subcommand -> (module, function(args) -> exit code)
COMMANDS = {
    "eventhandler": ("eventhandler.main", "run"),
    "notify": ("eventhandler.notify", "run"),
    "mount": ("delvefs.client.commands.mount", "run_mount"),
    "umount": ("delvefs.client.commands.mount", "run_umount"),
    "sync": ("delvefs.client.commands.mount", "run_sync"),
    "check": ("rulesets.check", "run"),
    "watch": ("delvefs.client.commands.watch", "run"),
    "principal": ("eventhandler.auth", "run_principal_command"),
    "status": ("delvefs.client.commands.status", "run"),
    "reload": ("delvefs.client.commands.reload", "run"),
    "shards": ("delvefs.client.commands.shardctl", "run"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="delvefs",
        description="DelveFS: an event-driven semantic file system for S3 object stores.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _add_handler_commands(sub)
    _add_mount_commands(sub)
    _add_following_commands(sub)
    _add_version(parser)
    for command in sub.choices.values():  # every subcommand, and theirs, answers --version
        _add_version(command)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                for nested in action.choices.values():
                    _add_version(nested)
    return parser


def _add_handler_commands(sub) -> None:
    """The event handler's commands: eventhandler, principal, notify."""
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
    p.add_argument("--shard", metavar="NAME",
                   help="be shard NAME of the shard map: serve and consume only its buckets "
                        "(default: $DELVEFS_SHARD; none: the only handler)")
    p.add_argument("--shard-map", metavar="MAP",
                   help="the shard map, NAME=URL,... as the clients have it (default: $DELVEFS_HANDLER_URL)")
    p.add_argument("--quorum-queue", action="store_true",
                   help="declare the queue as a quorum queue (default: $DELVEFS_AMQP_QUORUM); a "
                        "classic queue is moved over without losing a message")
    _add_logging(p)

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


def _add_mount_commands(sub) -> None:
    """A mount's commands: mount, umount, sync, check, status, reload."""
    p = sub.add_parser("mount", help="mount a views file", description="Mount VIEWS.yaml at MOUNTPOINT; "
                       "returns when the mount is ready unless --foreground.")
    p.add_argument("views", metavar="VIEWS.yaml")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    add_mount_arguments(p)  # the table of delvefs/client/mount/options.py: flags and -o alike

    p = sub.add_parser("umount", help="flush dirty files, then unmount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")

    p = sub.add_parser("sync", help="wait until everything a mount has queued reached S3",
                       description="Upload every closed file of MOUNT not yet in S3 and send its "
                                   "queued deletes now, and wait for them (eager mounts queue "
                                   "them); then wait until the event handler has every change "
                                   "the mount made, so that a mount started afterwards shows "
                                   "them. Exit status 1, naming each file and why, if any "
                                   "failed; 2 when all is in S3 but the event handler has not "
                                   "seen some of it within --handler-wait.")
    p.add_argument("mountpoint", metavar="MOUNT")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds to wait for the mount's answer (default 3600)")
    p.add_argument("--handler-wait", type=float, default=60.0, metavar="SECONDS",
                   help="longest wait for the event handler to see the changes (default 60)")
    p.add_argument("--no-wait-handler", action="store_true",
                   help="return once everything is in S3, without waiting for the event handler")

    p = sub.add_parser("check", help="validate a views file; optionally match objects",
                       description="Validate VIEWS.yaml. With --objects, print one JSON line per "
                                   "object: {\"bucket\", \"key\", \"views\": [...]}.")
    p.add_argument("views", metavar="VIEWS.yaml")
    p.add_argument("--objects", metavar="OBJECTS.jsonl",
                   help="one JSON object a line: bucket, key, size, mtime, [atime], tags, metadata")

    p = sub.add_parser("status", help="what a mount or the event handler is doing",
                       description="MOUNT: its daemon's pid and pid record, its views and how "
                                   "fresh they are, files not in S3 yet (pending, uploading, "
                                   "failed, conflict), the cache. --handler: the handler's event "
                                   "source and lag, buckets with scan progress, views, work-queue "
                                   "groups and their members, dead letters (what your token may see).")
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


def _add_following_commands(sub) -> None:
    """Commands that follow views and shards: shards, watch."""
    p = sub.add_parser("shards", help="show the shard map; which shard owns a bucket; move a "
                       "bucket to another shard",
                       description="show: each shard of the map ($DELVEFS_HANDLER_URL) and what it "
                                   "answers. owner BUCKET...: the shard that owns each bucket, used "
                                   "or not, from the map and the handoffs the shards report. move "
                                   "BUCKET --to SHARD: the bucket's owner stops taking "
                                   "its events, applies what is queued and forgets it; SHARD scans it "
                                   "when mounts, told by a 421, register there. Write the placement "
                                   "printed into the map afterwards.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("show", help="each shard, its URLs and the buckets it serves")
    a = actions.add_parser("owner", help="the shard that owns each BUCKET (used or not)",
                           description="The shard that owns each BUCKET: placed in the map "
                                       "(@BUCKET=SHARD), handed off (as the shards report, when "
                                       "they answer), else by rendezvous hashing over the map's "
                                       "shard names. Exit status 1 when the shards disagree.")
    a.add_argument("buckets", nargs="+", metavar="BUCKET")
    a.add_argument("--json", action="store_true",
                   help='print [{"bucket", "shard", "urls", "by"}] as JSON')
    a = actions.add_parser("move", help="hand BUCKET to shard SHARD")
    a.add_argument("bucket", metavar="BUCKET")
    a.add_argument("--to", required=True, metavar="SHARD")
    for a in actions.choices.values():
        a.add_argument("--handler", metavar="MAP", help="the shard map (default: $DELVEFS_HANDLER_URL)")

    p = sub.add_parser("watch", help="print each file that appears in a mounted view",
                       description="Print the path of each file that appears in MOUNT/VIEW, one a "
                                   "line, until stopped; with --group, share the files with the "
                                   "group's other members.")
    p.add_argument("view_dir", metavar="MOUNT/VIEW")
    p.add_argument("--existing", action="store_true", help="first print the files already there "
                   "(with --group: those the group has not seen yet)")
    p.add_argument("--group", metavar="NAME", help="be one member of the work-queue group NAME of the "
                   "view: each file goes to one member only, and to another when a member dies or "
                   "fails on it (docs/SEMANTICS.md)")
    p.add_argument("--exec", metavar="CMD", help="with --group: run CMD per file ({} is the path; "
                   "without {} the path is the last argument) and acknowledge the file when CMD "
                   "exits 0; without --exec a file is acknowledged once printed")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="K",
                   help="with --exec: run up to K commands at a time (default 1)")
    p.add_argument("--lease", type=float, default=None, metavar="SECONDS",
                   help="with --group, when the group is made: seconds a member holds a file without "
                        "renewing (members renew while they work; default 60)")
    p.add_argument("--max-failures", type=int, default=None, metavar="N",
                   help="with --group, when the group is made: failed attempts after which a file "
                        "is set aside as failed (default 3)")
    p.add_argument("--ready-file", metavar="PATH",
                   help="create PATH (holding the pid) once every file that appears from then on "
                        "will be seen; removed at start and at exit")


def _add_version(parser: argparse.ArgumentParser) -> None:
    from . import __version__
    parser.add_argument("--version", action="version", version=f"delvefs {__version__}",
                        help="print the version and exit")


def _add_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", metavar="LEVEL", type=str.upper,
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="debug, info, warning or error (default: $DELVEFS_LOG_LEVEL, else info)")
    p.add_argument("--log-file", metavar="FILE",
                   help="log to FILE, rotated at 10 MiB, 5 kept (default: stderr)")
    p.add_argument("--debug", action="store_true", help="log level debug")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-") and "-o" in argv:
        # mount.fuse3 runs `delvefs VIEWS DIR -o OPTIONS` for a fuse.delvefs line of /etc/fstab
        # where /sbin/mount.fuse.delvefs is not installed
        return main_helper(argv)
    args = build_parser().parse_args(argv)
    module_name, func_name = COMMANDS[args.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        print(f"delvefs {args.command}: not implemented yet", file=sys.stderr)
        return 2
    return getattr(module, func_name)(args)


def main_helper(argv: list[str] | None = None) -> int:
    """``mount.fuse.delvefs VIEWS DIR [-sfnv] [-o OPTIONS] [-t fuse.delvefs]``: mount(8)'s
    helper for ``fuse.delvefs`` lines of /etc/fstab (``VIEWS DIR fuse.delvefs OPTIONS 0 0``);
    mounts with ``delvefs mount``."""
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
        elif re.fullmatch(r"-[sfnv]+", arg):
            pass  # sloppy, fake, no mtab, verbose: nothing to do (FUSE keeps no mtab)
        else:
            positional.append(arg)
        i += 1
    if len(positional) != 2:
        print("usage: mount.fuse.delvefs VIEWS.yaml MOUNTPOINT [-o OPTIONS]", file=sys.stderr)
        return 2
    return main(["mount", *positional, *[x for o in options for x in ("-o", o)]])


if __name__ == "__main__":
    sys.exit(main())
