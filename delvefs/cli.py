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
    "check": ("rulesets.check", "run"),
    "watch": ("delvefs.client.watch", "run"),
    "principal": ("eventhandler.auth", "run_principal_command"),
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
    p.add_argument("--principals", metavar="FILE",
                   help="principals file of `delvefs principal` (default: STATE_DIR/principals.json)")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve a non-loopback --listen address without any principal or token "
                        "(anyone who can connect may call the API)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    p.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")

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

    p = sub.add_parser("notify", help="point a bucket's notifications at the handler's AMQP target",
                       description="Configure BUCKET to publish s3:ObjectCreated:* and "
                                   "s3:ObjectRemoved:* to $DELVEFS_NOTIFY_ARN.")
    p.add_argument("bucket", metavar="BUCKET")

    p = sub.add_parser("mount", help="mount a views file", description="Mount VIEWS.yaml at MOUNTPOINT; "
                       "returns when the mount is ready unless --foreground.")
    p.add_argument("views", metavar="VIEWS.yaml")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--cache-dir", help="local cache directory (default: ~/.cache/delvefs/mounts/<hash>)")
    p.add_argument("--cache-size", help="bound on clean cached data, e.g. 10GiB")
    p.add_argument("--handler", help="handler URL, or comma-separated URLs of the active handler and "
                   "its standbys (default: $DELVEFS_HANDLER_URL)")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground, log to stderr")

    p = sub.add_parser("umount", help="flush dirty files, then unmount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")

    p = sub.add_parser("check", help="validate a views file; optionally match objects",
                       description="Validate VIEWS.yaml. With --objects, print one JSON line per "
                                   "object: {\"bucket\", \"key\", \"views\": [...]}.")
    p.add_argument("views", metavar="VIEWS.yaml")
    p.add_argument("--objects", metavar="OBJECTS.jsonl",
                   help="one JSON object a line: bucket, key, size, mtime, [atime], tags, metadata")

    p = sub.add_parser("watch", help="print each file that appears in a mounted view",
                       description="Print the path of each file that appears in MOUNT/VIEW, one a "
                                   "line, until stopped.")
    p.add_argument("view_dir", metavar="MOUNT/VIEW")
    p.add_argument("--existing", action="store_true", help="first print the files already there")
    return parser


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
