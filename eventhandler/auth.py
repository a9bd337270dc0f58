"""Who may read what from the event handler (docs/API.md, "Who sees what").

- **Principals** (:class:`Authenticator`): a caller is the principal its bearer token names.
  ``delvefs principal add NAME`` issues a token ``NAME.<secret>`` (printed once); the
  principals file keeps only its sha256 and is re-read whenever it changes, so a revocation
  takes effect at the next request. ``DELVEFS_HANDLER_TOKEN`` is one more principal (named
  by :func:`~delvefs.shared.config.principal_of_token`: ``default`` for a hand-made token).
- **Proofs** (:func:`parse_proof`): a presigned ListObjectsV2 URL of the handler's own
  object store for one bucket and prefix, bound to the principal presenting it. Pure
  checks; the API then GETs the URL and grants only on a 200.
- **Grants** (:class:`Grants`): per principal, (bucket, prefix) -> until when. A view is
  readable while a grant of its bucket covers its root, an object while one covers its key.

Nothing here talks to the network.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import secrets
import ssl
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from delvefs.shared import config
from delvefs.shared.config import (DEFAULT_PRINCIPAL, MAX_PROOF_LIFETIME, PRINCIPAL_NAME_PATTERN,
                                   principal_of_token)
from delvefs.shared.s3 import PRINCIPAL_PARAM

log = logging.getLogger("delvefs.eventhandler.auth")

PRINCIPALS_FILE = "principals.json"
GRANTS_FILE = "grants.json"
PRINCIPAL_NAME = re.compile(PRINCIPAL_NAME_PATTERN)
# printable ASCII without spaces: issued tokens and any sane hand-made one
TOKEN_CHARS = re.compile(r"[\x21-\x7e]{1,512}")
# S3's bucket names, with the looser legacy ones (capitals, underscores, up to 255)
BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")
MAX_KEY_BYTES = 1024  # S3's limit for a key (and so for a prefix)
# a proof may be dated this far ahead of the handler's clock (the store allows 15 min)
CLOCK_SKEW = 300
# lapsed grants are remembered this long, to answer "proof expired" rather than "not found"
LAPSED_MEMORY = 86400


def valid_bucket(name) -> bool:
    return isinstance(name, str) and BUCKET_NAME.fullmatch(name) is not None


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# ----------------------------------------------------------------- principals

class PrincipalsError(Exception):
    """The principals file cannot be read or changed; the message says why."""


def read_principals(path: Path) -> dict[str, dict]:
    """``{name: {"sha256": hex, "added": iso date}}`` of the principals file ({} if absent)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise PrincipalsError(f"cannot read principals file {path}: {exc}") from None
    principals = data.get("principals") if isinstance(data, dict) else None
    if not isinstance(principals, dict) or not all(
            isinstance(n, str) and PRINCIPAL_NAME.fullmatch(n) and isinstance(e, dict)
            and isinstance(e.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", e["sha256"])
            for n, e in principals.items()):
        raise PrincipalsError(f"principals file {path} is not {{\"principals\": {{NAME: "
                              f"{{\"sha256\": HEX, ...}}}}}}")
    return principals


def _write_private(path: Path, data: dict) -> None:
    """Replace ``path`` atomically by ``data`` as JSON, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path):
    """Serialises changes of the principals file between ``delvefs principal`` runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_principal(path: Path, name: str) -> str:
    """Issue a token for a new principal ``name``; returns it (only its hash is kept)."""
    if not PRINCIPAL_NAME.fullmatch(name):
        raise PrincipalsError(f"invalid principal name {name!r}: letters, digits, '-' and '_' "
                              "(at most 64, starting with a letter or digit)")
    token = f"{name}.{secrets.token_urlsafe(32)}"
    with _locked(path):
        principals = read_principals(path)
        if name in principals:
            raise PrincipalsError(f"principal {name!r} exists: revoke it first to issue a new token")
        added = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        principals[name] = {"sha256": token_hash(token), "added": added}
        _write_private(path, {"principals": principals})
    return token


def revoke_principal(path: Path, name: str) -> None:
    with _locked(path):
        principals = read_principals(path)
        if name not in principals:
            raise PrincipalsError(f"no principal {name!r} in {path}")
        del principals[name]
        _write_private(path, {"principals": principals})


class Unauthorized(Exception):
    """A request without a valid bearer token; the message says what is wrong."""


class Authenticator:
    """Names the principal of each request from its ``Authorization`` header.

    Principals: those of the principals file at ``path`` (re-read when its inode, size or
    mtime changes: a revocation applies to the next request) and the one of ``env_token``.
    With neither at start the handler is *open*: every caller is the principal ``default``
    (main.py allows that only on a loopback address or with --allow-unauthenticated); it
    closes for good once the principals file appears. An unreadable file counts as empty:
    a broken file locks everyone out rather than letting revoked tokens in.
    """

    def __init__(self, path: Path, env_token: str | None = None, *, on_revoked=None):
        self.path = Path(path)
        self._env = {token_hash(env_token): principal_of_token(env_token)} if env_token else {}
        self._by_hash: dict[str, str] = {}
        self._stamp: tuple | None = None
        self.on_revoked = on_revoked  # fn(names) for principals no token names any more
        self.open = not env_token and not self.path.exists()
        self._refresh()

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            stamp = ("error", str(exc))
        if stamp == self._stamp:
            return
        self._stamp = stamp
        before = set(self._by_hash.values())
        if stamp is None:
            self._by_hash = {}
        else:
            if self.open:
                log.warning("principals file %s appeared: every request needs a token from now on",
                            self.path)
            self.open = False
            try:
                principals = read_principals(self.path)
            except PrincipalsError as exc:
                log.error("%s: no principal of the file is accepted until it is fixed", exc)
                principals = {}
            self._by_hash = {e["sha256"]: name for name, e in principals.items()}
            log.info("principals: %s", ", ".join(sorted(principals)) or "(none)")
        gone = before - set(self._by_hash.values()) - set(self._env.values())
        if gone and self.on_revoked is not None:
            self.on_revoked(gone)

    def names(self) -> set[str]:
        self._refresh()
        return set(self._by_hash.values()) | set(self._env.values())

    def principal(self, authorization: str | None) -> str:
        """The principal of a request with this ``Authorization`` header; raises
        :class:`Unauthorized`."""
        self._refresh()
        if self.open:
            return DEFAULT_PRINCIPAL
        if not authorization:
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        token = token.strip()
        if not token:
            raise Unauthorized("empty bearer token")
        if not TOKEN_CHARS.fullmatch(token):
            raise Unauthorized("malformed bearer token: printable ASCII without spaces expected")
        digest = token_hash(token)
        name = self._by_hash.get(digest) or self._env.get(digest)
        if name is None:
            raise Unauthorized("unknown or revoked bearer token")
        return name


# ----------------------------------------------------------------- proofs

class ProofRefused(Exception):
    """A proof that grants nothing; ``expired`` when it is only too old."""

    def __init__(self, message: str, *, expired: bool = False):
        super().__init__(message)
        self.expired = expired


@dataclass(frozen=True)
class Proof:
    bucket: str
    prefix: str
    until: float  # epoch s: the end of the grant (the URL's expiry, never beyond its lifetime from now)
    url: str      # the URL to GET: checked to be the store's ListObjectsV2 of the bucket


# what a proof's query may hold: the listing (list-type, max-keys=0, prefix, encoding-type),
# the binding, and SigV4's presign parameters; anything else (delimiter, start-after, ...)
# could make the store accept a request that proves less than a listing of the prefix
_REQUIRED = ("list-type", "max-keys", PRINCIPAL_PARAM, "X-Amz-Algorithm", "X-Amz-Credential",
             "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders", "X-Amz-Signature")
_OPTIONAL = ("prefix", "encoding-type", "X-Amz-Security-Token")
_URL_CHARS = re.compile(r"[\x21-\x7e]+")
_QUERY_CHARS = re.compile(r"[A-Za-z0-9._~%=&-]*")  # as presigners encode; no '+' or raw bytes
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_REGION = re.compile(r"[a-z0-9-]{1,32}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
MAX_PROOF_URL = 8192


def parse_proof(url, *, bucket: str, principal: str, endpoint: str | None, now: float) -> Proof:
    """The grant ``url`` would give ``principal`` once the store answers it with 200.

    ``url`` must be a SigV4-presigned ListObjectsV2 (list-type=2, max-keys=0) of exactly
    ``bucket`` at ``endpoint`` (the handler's AWS_ENDPOINT_URL, path-style), or, without
    one, at the standard AWS endpoint of the region it is signed for (path-style or
    virtual-hosted); bound to ``principal`` (:data:`PRINCIPAL_PARAM`, signed); dated no
    later than now plus :data:`CLOCK_SKEW`; valid for at most :data:`MAX_PROOF_LIFETIME`
    seconds and not expired. Raises :class:`ProofRefused` saying what is wrong."""
    if not isinstance(url, str) or not url:
        raise ProofRefused("no proof: send a presigned ListObjectsV2 URL made with your credentials")
    if len(url) > MAX_PROOF_URL or not _URL_CHARS.fullmatch(url):
        # no spaces or control characters: URL parsers differ in how they drop them
        raise ProofRefused("a proof is a presigned URL of at most 8 KiB of printable ASCII")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 — raises ValueError for a port that is no number
    except ValueError:
        raise ProofRefused("the proof is not a URL") from None
    if "@" in parts.netloc or "#" in url or not _QUERY_CHARS.fullmatch(parts.query):
        raise ProofRefused("the proof URL has user info, a fragment or unencoded characters")
    params = _query(parts.query)
    region = _check_signature_params(params)
    if not _names_the_store(parts, bucket, endpoint, region):
        store = f"{endpoint}, path-style" if endpoint else "the standard AWS S3 endpoint of its region"
        raise ProofRefused(f"the proof is not a ListObjectsV2 URL of bucket {bucket!r} at this "
                           f"handler's object store ({store})")
    if params.get("list-type") != "2" or params.get("max-keys") != "0":
        raise ProofRefused("the proof must be a ListObjectsV2 request (list-type=2) with max-keys=0")
    if params.get("encoding-type", "url") != "url":
        raise ProofRefused("encoding-type must be 'url' (or absent)")
    if params[PRINCIPAL_PARAM] != principal:
        raise ProofRefused(f"the proof is bound to principal {params[PRINCIPAL_PARAM]!r}, not to "
                           f"{principal!r} who presents it")
    prefix = params.get("prefix", "")
    if len(prefix.encode()) > MAX_KEY_BYTES:
        raise ProofRefused(f"the proof's prefix is longer than {MAX_KEY_BYTES} bytes")
    signed_at = datetime.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    lifetime = int(params["X-Amz-Expires"])
    if signed_at > now + CLOCK_SKEW:
        raise ProofRefused(f"the proof is dated {signed_at - now:.0f} s in the future (clock skew?)")
    if signed_at + lifetime <= now:
        raise ProofRefused(f"the proof expired {now - signed_at - lifetime:.0f} s ago: sign a new one",
                           expired=True)
    # a proof dated ahead of our clock still grants for at most its lifetime
    return Proof(bucket, prefix, min(signed_at + lifetime, now + lifetime), url)


def _query(query: str) -> dict[str, str]:
    """The query's parameters; refuses repeated names (the store and we might read a
    different one) and undecodable text."""
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=True,
                                       errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise ProofRefused("the proof's query string is malformed") from None
    params = dict(pairs)
    if len(params) != len(pairs):
        raise ProofRefused("the proof repeats a query parameter")
    missing = [k for k in _REQUIRED if k not in params]
    if missing:
        hint = (f": bind it to your principal with {PRINCIPAL_PARAM}=<name> in the signed query"
                if missing == [PRINCIPAL_PARAM] else " (a SigV4-presigned ListObjectsV2 URL)")
        raise ProofRefused(f"the proof lacks {', '.join(missing)}{hint}")
    unexpected = sorted(set(params) - set(_REQUIRED) - set(_OPTIONAL))
    if unexpected:
        raise ProofRefused(f"the proof has parameters a plain listing of a prefix has not: "
                           f"{', '.join(unexpected)}")
    return params


def _check_signature_params(params: dict[str, str]) -> str:
    """SigV4 query-signature parameters in their forms; returns the signing region."""
    if params["X-Amz-Algorithm"] != "AWS4-HMAC-SHA256":
        raise ProofRefused("the proof must be signed with AWS4-HMAC-SHA256 (SigV4)")
    if params["X-Amz-SignedHeaders"] != "host":
        raise ProofRefused("the proof must sign the host header only (X-Amz-SignedHeaders=host)")
    if not _SIGNATURE.fullmatch(params["X-Amz-Signature"]):
        raise ProofRefused("X-Amz-Signature must be 64 hex digits")
    date = params["X-Amz-Date"]
    if not _AMZ_DATE.fullmatch(date):
        raise ProofRefused("X-Amz-Date must be YYYYMMDDTHHMMSSZ")
    try:
        datetime.datetime.strptime(date, "%Y%m%dT%H%M%SZ")
    except ValueError:
        raise ProofRefused("X-Amz-Date is no valid date") from None
    expires = params["X-Amz-Expires"]
    if not expires.isdigit() or len(expires) > 6 or not 1 <= int(expires) <= MAX_PROOF_LIFETIME:
        raise ProofRefused(f"X-Amz-Expires must be 1 to {MAX_PROOF_LIFETIME} seconds")
    scope = params["X-Amz-Credential"].split("/")
    if len(scope) != 5 or not scope[0] or scope[1] != date[:8] or not _REGION.fullmatch(scope[2]) \
            or scope[3:] != ["s3", "aws4_request"]:
        raise ProofRefused("X-Amz-Credential must be KEY/YYYYMMDD/REGION/s3/aws4_request of X-Amz-Date's day")
    return scope[2]


def _names_the_store(parts, bucket: str, endpoint: str | None, region: str) -> bool:
    """Whether the URL's scheme, host, port and path are those of a listing of ``bucket``
    at the handler's own object store."""
    quoted = "/" + urllib.parse.quote(bucket, safe="-_.~")
    host, port = (parts.hostname or "").lower(), parts.port
    if endpoint:
        ep = urllib.parse.urlsplit(endpoint)
        default = {"http": 80, "https": 443}.get(ep.scheme.lower())
        return (parts.scheme.lower() == ep.scheme.lower() and host == (ep.hostname or "").lower()
                and (port or default) == (ep.port or default)
                and parts.path == ep.path.rstrip("/") + quoted)
    # AWS: the regional endpoint of the region the URL is signed for (it must be the
    # bucket's, or S3 refuses the signature); us-east-1 also answers on the global name
    hosts = {f"s3.{region}.amazonaws.com"} | ({"s3.amazonaws.com"} if region == "us-east-1" else set())
    if parts.scheme.lower() != "https" or port not in (None, 443):
        return False
    return (host in hosts and parts.path == quoted) or \
        (host in {f"{bucket.lower()}.{h}" for h in hosts} and parts.path in ("", "/"))


# ----------------------------------------------------------------- grants

GRANTED, LAPSED, NONE = "granted", "lapsed", "none"


class Grants:
    """What each principal may read: per principal and bucket, prefix -> until (epoch s).

    Kept in memory and mirrored to ``path`` (rewritten atomically when a grant is added or
    dropped), so a restart within their lifetime keeps them. A lapsed grant is remembered for
    :data:`LAPSED_MEMORY` seconds so that the answer is "proof expired", not "not found".
    """

    def __init__(self, path: Path | None = None, clock=time.time):
        self.path = Path(path) if path else None
        self.clock = clock
        self._grants: dict[str, dict[str, dict[str, float]]] = {}
        if self.path is not None:
            self._load()

    def add(self, principal: str, bucket: str, prefix: str, until: float) -> None:
        prefixes = self._grants.setdefault(principal, {}).setdefault(bucket, {})
        if prefixes.get(prefix, 0.0) >= until:
            return
        prefixes[prefix] = until
        self._prune(principal)
        self._save()

    def status(self, principal: str, bucket: str, key: str) -> str:
        """:data:`GRANTED` while a grant of ``bucket`` for a prefix of ``key`` lasts,
        :data:`LAPSED` when such a grant has expired, else :data:`NONE`."""
        prefixes = self._grants.get(principal, {}).get(bucket)
        if not prefixes:
            return NONE
        now = self.clock()
        found = NONE
        for prefix, until in prefixes.items():
            if key.startswith(prefix):
                if until > now:
                    return GRANTED
                found = LAPSED
        return found

    def until(self, principal: str, bucket: str, key: str) -> float:
        """When the latest grant of ``bucket`` covering ``key`` ends (0: none)."""
        prefixes = self._grants.get(principal, {}).get(bucket, {})
        return max((u for p, u in prefixes.items() if key.startswith(p)), default=0.0)

    def buckets(self, principal: str) -> set[str]:
        """The buckets ``principal`` may read something of now."""
        now = self.clock()
        return {b for b, prefixes in self._grants.get(principal, {}).items()
                if any(u > now for u in prefixes.values())}

    def forget(self, principals) -> None:
        """Drop every grant of ``principals`` (revoked)."""
        if any(self._grants.pop(p, None) is not None for p in list(principals)):
            self._save()

    def _prune(self, principal: str) -> None:
        horizon = self.clock() - LAPSED_MEMORY
        buckets = self._grants[principal]
        for b in list(buckets):
            buckets[b] = {p: u for p, u in buckets[b].items() if u > horizon}
            if not buckets[b]:
                del buckets[b]

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            horizon = self.clock() - LAPSED_MEMORY
            for principal, rows in data.items():
                for bucket, prefix, until in rows:
                    if float(until) > horizon:
                        self._grants.setdefault(principal, {}).setdefault(bucket, {})[prefix] = float(until)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("grants file %s unreadable (%s): clients present their proofs again",
                        self.path, exc)
            self._grants = {}

    def _save(self) -> None:
        if self.path is None:
            return
        data = {p: [[b, prefix, u] for b, prefixes in buckets.items() for prefix, u in prefixes.items()]
                for p, buckets in self._grants.items()}
        try:
            _write_private(self.path, data)
        except OSError as exc:  # they still hold in memory
            log.warning("cannot write grants file %s: %s", self.path, exc)


# ----------------------------------------------------------------- serving

def listen_is_loopback(host: str) -> bool:
    """Whether ``host`` (of --listen) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The server's TLS context of --tls-cert/--tls-key (None without them); raises
    ValueError saying what is wrong."""
    if not cert and not key:
        return None
    if not (cert and key):
        raise ValueError("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from None
    return context


# ----------------------------------------------------------------- `delvefs principal`

def principals_path(state_dir: str | None, principals: str | None) -> Path:
    """``--principals FILE``, else ``principals.json`` in ``--state-dir`` (or its default)."""
    if principals:
        return Path(principals)
    return config.state_dir(state_dir) / PRINCIPALS_FILE


def run_principal_command(args) -> int:
    path = principals_path(args.state_dir, args.principals)
    try:
        if args.action == "add":
            token = add_principal(path, args.name)
            print(token)
            print(f"delvefs principal: added {args.name!r} to {path}; the token above is shown "
                  "only now: give it to its user (DELVEFS_HANDLER_TOKEN)", file=sys.stderr)
        elif args.action == "revoke":
            revoke_principal(path, args.name)
            print(f"delvefs principal: revoked {args.name!r} (the handler refuses its token from "
                  "its next request)", file=sys.stderr)
        else:
            for name, entry in sorted(read_principals(path).items()):
                print(f"{name}\tadded {entry.get('added', '?')}")
    except (PrincipalsError, OSError) as exc:
        print(f"delvefs principal: {exc}", file=sys.stderr)
        return 1
    return 0
