"""Configuration from flags, then environment (SPEC.md, "Commands").

The environment variables of S3, of the handler's address and credentials, and of the
mount: their names and defaults are here. Each function reads ``env`` (default
os.environ) when called, never at import; a flag, where there is one, wins. A mount reads
them once, into its settings (delvefs/client/mount/settings.py). Read beside the code they tune
instead: the event handler's own tuning variables (eventhandler/: the reconcile interval,
the SQS pollers, ...; the bucket listing's page size, shared/s3.py), the default log level
(shared/logsetup.py) and botocore's and the lean S3 client's CA bundle (``AWS_CA_BUNDLE``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_EXCHANGE = "delvefs"
DEFAULT_NOTIFY_ARN = "arn:minio:sqs::PRIMARY:amqp"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEFAULT_HANDLER_URL = "http://127.0.0.1:8731"


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None
    access_key: str | None
    secret_key: str | None
    region: str
    session_token: str | None = None  # temporary (STS) credentials come with one

    @classmethod
    def from_env(cls, env=os.environ) -> "S3Settings":
        return cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )


def _number(env, name: str, default: float, kind=float):
    value = env.get(name)
    return kind(value) if value else default


# ---- the mount --------------------------------------------------------------------------

# S3's limit for one CopyObject; renames of larger objects are multipart copies
MAX_SINGLE_COPY = 5 * 1024**3


def copy_threshold(env=os.environ) -> int:
    """Objects of at least this many bytes are renamed by a multipart copy
    (``DELVEFS_COPY_THRESHOLD``, bytes; default and maximum S3's 5 GiB CopyObject limit)."""
    value = env.get("DELVEFS_COPY_THRESHOLD")
    return max(1, min(int(value), MAX_SINGLE_COPY)) if value else MAX_SINGLE_COPY


def upload_concurrency(env=os.environ) -> int:
    """Files an eager mount uploads at a time (``DELVEFS_UPLOAD_CONCURRENCY``, default 16)."""
    value = env.get("DELVEFS_UPLOAD_CONCURRENCY")
    return max(1, min(int(value), 256)) if value else 16


def upload_while_writing(env=os.environ) -> bool:
    """Strict mode sends the full parts of a large file while it is still written
    (``DELVEFS_UPLOAD_WHILE_WRITING=1``; off by default: on 2 shared cores it slowed a 1 GiB
    ``dd`` down, docs/SEMANTICS.md)."""
    return env.get("DELVEFS_UPLOAD_WHILE_WRITING", "").strip().lower() in ("1", "true", "yes", "on")


def state_home(env=os.environ) -> Path:
    """Where default cache directories and the mounts' pid records and control sockets live
    (``DELVEFS_STATE_HOME``, default ~/.cache/delvefs)."""
    return Path(env.get("DELVEFS_STATE_HOME") or Path.home() / ".cache" / "delvefs")


def mount_timeout(env=os.environ) -> float:
    """Seconds ``delvefs mount`` waits for its daemon to be ready (``DELVEFS_MOUNT_TIMEOUT``)."""
    return _number(env, "DELVEFS_MOUNT_TIMEOUT", 120.0)


def umount_timeout(env=os.environ) -> float:
    """Seconds ``delvefs umount`` waits for the daemon to upload and exit
    (``DELVEFS_UMOUNT_TIMEOUT``)."""
    return _number(env, "DELVEFS_UMOUNT_TIMEOUT", 3600.0)


def s3_connect_timeout(env=os.environ) -> float:
    """Seconds one S3 request of a mount may take to connect (``DELVEFS_S3_CONNECT_TIMEOUT``);
    with the read timeout and the attempts, a close fails within ~30 s when S3 is unreachable."""
    return _number(env, "DELVEFS_S3_CONNECT_TIMEOUT", 3.0)


def s3_read_timeout(env=os.environ) -> float:
    """Seconds one S3 request of a mount may wait for data (``DELVEFS_S3_READ_TIMEOUT``)."""
    return _number(env, "DELVEFS_S3_READ_TIMEOUT", 8.0)


def s3_attempts(env=os.environ) -> int:
    """Attempts of one S3 request of a mount (``DELVEFS_S3_ATTEMPTS``)."""
    return _number(env, "DELVEFS_S3_ATTEMPTS", 3, int)


def handler_timeout(env=os.environ) -> float:
    """Seconds a mount waits for the handler (stopped, overloaded) before an operation fails
    (``DELVEFS_HANDLER_TIMEOUT``)."""
    return _number(env, "DELVEFS_HANDLER_TIMEOUT", 20.0)


def stale_after(env=os.environ) -> float:
    """Seconds an operation on a listed view waits for its refresh before it is answered
    from the last listing (``DELVEFS_STALE_AFTER``)."""
    return _number(env, "DELVEFS_STALE_AFTER", 2.0)


def scan_wait(env=os.environ) -> float:
    """Seconds a view's first listing waits for the handler's first scan of its bucket
    (``DELVEFS_SCAN_WAIT``, default an hour; the mount caps it by the kernel's limit)."""
    return _number(env, "DELVEFS_SCAN_WAIT", 3600.0)


# ---- the event handler and the clients --------------------------------------------------

def state_dir(flag: str | None = None, env=os.environ) -> Path:
    """The handler's state directory (LevelDB, principals, grants): ``--state-dir``, else
    $XDG_STATE_HOME/delvefs, else ~/.local/state/delvefs."""
    if flag:
        return Path(flag)
    return Path(env.get("XDG_STATE_HOME") or Path.home() / ".local/state") / "delvefs"


def amqp_url(flag: str | None = None, env=os.environ) -> str:
    return flag or env.get("DELVEFS_AMQP_URL") or DEFAULT_AMQP_URL


def amqp_exchange(flag: str | None = None, env=os.environ) -> str:
    return flag or env.get("DELVEFS_AMQP_EXCHANGE") or DEFAULT_EXCHANGE


def sqs_queue(flag: str | None = None, env=os.environ) -> str | None:
    """The SQS queue URL the handler consumes instead of RabbitMQ (AWS S3): ``--sqs-queue``,
    else $DELVEFS_SQS_QUEUE; None: the AMQP source."""
    return flag or env.get("DELVEFS_SQS_QUEUE") or None


def sqs_dead_letter_queue(flag: str | None = None, env=os.environ) -> str | None:
    """Where the SQS source sends unusable messages (``--sqs-dead-letter-queue``, else
    $DELVEFS_SQS_DEAD_LETTER_QUEUE; None: the queue's RedrivePolicy target, if any)."""
    return flag or env.get("DELVEFS_SQS_DEAD_LETTER_QUEUE") or None


def notify_arn(env=os.environ) -> str:
    return env.get("DELVEFS_NOTIFY_ARN") or DEFAULT_NOTIFY_ARN


def handler_url(flag: str | None = None, env=os.environ) -> str:
    """Where clients find the handler: ``--handler``, else $DELVEFS_HANDLER_URL; a
    comma-separated list names the active handler and its standbys (:func:`handler_urls`)."""
    return flag or env.get("DELVEFS_HANDLER_URL") or DEFAULT_HANDLER_URL


def handler_urls(urls: str | list[str]) -> list[str]:
    """The handler URLs of a comma-separated list (or of a list), in the order given,
    without trailing slashes."""
    parts = urls.split(",") if isinstance(urls, str) else urls
    found = [u.strip().rstrip("/") for u in parts if u.strip()]
    if not found:
        raise ValueError(f"no handler URL in {urls!r}")
    return found


def handler_shard(flag: str | None = None, env=os.environ) -> str | None:
    """The shard this handler is (``--shard``, else $DELVEFS_SHARD); None: the only handler."""
    return flag or env.get("DELVEFS_SHARD") or None


def shard_map_text(flag: str | None = None, env=os.environ) -> str:
    """A shard's map (``--shard-map``, else $DELVEFS_HANDLER_URL: the clients' setting;
    delvefs/shared/shards.py)."""
    return flag or handler_url(None, env)


def amqp_quorum(flag: bool = False, env=os.environ) -> bool:
    """Declare the handler's queue as a quorum queue (``--quorum-queue``, $DELVEFS_AMQP_QUORUM=1)."""
    return flag or env.get("DELVEFS_AMQP_QUORUM", "").lower() in ("1", "true", "yes", "on")


def handler_token(env=os.environ) -> str | None:
    return env.get("DELVEFS_HANDLER_TOKEN") or None


# ---- principals and proofs (docs/API.md, "Who sees what") ------------------------------

# the principal of a token not issued by ``delvefs principal add`` (e.g. a hand-made
# DELVEFS_HANDLER_TOKEN), and of every caller of a handler that has no principals
DEFAULT_PRINCIPAL = "default"
# issued tokens are ``<name>.<secret>``: a client knows its principal without asking
PRINCIPAL_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
_ISSUED_TOKEN = re.compile(rf"({PRINCIPAL_NAME_PATTERN})\.[A-Za-z0-9_-]{{43}}")
# the longest proof lifetime the handler accepts (seconds); proofs are presigned for
# DELVEFS_PROOF_LIFETIME (default 900) and renewed at half of it
MAX_PROOF_LIFETIME = 3600
DEFAULT_PROOF_LIFETIME = 900


def principal_of_token(token: str | None) -> str:
    """The principal name a token stands for: ``NAME`` of an issued ``NAME.<secret>``
    token, else :data:`DEFAULT_PRINCIPAL`."""
    m = _ISSUED_TOKEN.fullmatch(token) if token else None
    return m.group(1) if m else DEFAULT_PRINCIPAL


def handler_principal(token: str | None, env=os.environ) -> str:
    """The principal a client with ``token`` binds its proofs to: ``DELVEFS_HANDLER_PRINCIPAL``,
    else the one the token names."""
    return env.get("DELVEFS_HANDLER_PRINCIPAL") or principal_of_token(token)


def proof_lifetime(env=os.environ) -> int:
    """Seconds a client's proofs are presigned for (``DELVEFS_PROOF_LIFETIME``), 10 to
    :data:`MAX_PROOF_LIFETIME`."""
    value = env.get("DELVEFS_PROOF_LIFETIME")
    return max(10, min(int(value), MAX_PROOF_LIFETIME)) if value else DEFAULT_PROOF_LIFETIME


def handler_ca(env=os.environ) -> str | None:
    """A CA bundle (PEM file) that verifies an https handler URL (``DELVEFS_HANDLER_CA``);
    None: the default CAs."""
    return env.get("DELVEFS_HANDLER_CA") or None
