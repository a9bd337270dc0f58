"""The one module that talks to S3 (boto3). Synchronous by design: the trio
client calls it through ``trio.to_thread.run_sync`` with a limiter, the handler
from its worker threads. Callers never import boto3 themselves.

boto3/botocore are imported on first use (``make_client``; ``ClientError`` and
``EndpointConnectionError`` are still importable from here): importing them and building
a client costs ~0.3 s of CPU, which a mount keeps off its way to "ready" — it presigns
its ListObjectsV2 proofs with :func:`presign_list_url` (SigV4, standard library only).

A mount's single small requests — DeleteObject, HeadObject, PutObject below the part
size — and its downloads' ranged GETs, and the event handler's GetObjectTagging and
HeadObject (:meth:`BucketReader.from_settings`), go through :class:`LeanClient` instead of
botocore whenever the settings have an endpoint and static keys: the same requests,
SigV4-signed with the standard library over
kept-alive ``http.client`` connections, at ~0.3-0.4 ms of CPU each where botocore spends
1.2-2 ms (docs/PERFORMANCE.md, write path). It answers the botocore client methods of those names
(the fields :func:`head_object`, :func:`put_file`, :func:`delete_object` and
:func:`get_object_tags` read), so those functions serve both; credentials from a profile or a role use boto3 for everything.
"""
from __future__ import annotations

import contextvars
import os
import sys
import threading
import urllib.parse

from .config import DEFAULT_PRINCIPAL, DEFAULT_PROOF_LIFETIME, MAX_SINGLE_COPY, S3Settings
# the standard-library client and the proofs, here for callers: s3.LeanClient, s3.S3Error, ...
from .s3lean import (PRINCIPAL_PARAM, LeanClient, S3Error, _parse_tag_set,  # noqa: F401
                     _static_endpoint, check_bucket_with_proof, presign_list_url)

S3_EVENTS = ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]


def make_client(settings: S3Settings | None = None, *, max_pool: int = 32, retries: int = 3,
                connect_timeout: float = 5, read_timeout: float = 60):
    """A boto3 S3 client for ``settings`` (default: from the environment)."""
    import boto3
    import botocore.config
    import botocore.handlers

    settings = settings or S3Settings.from_env()
    client = boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        aws_session_token=settings.session_token,
        region_name=settings.region,
        config=botocore.config.Config(
            max_pool_connections=max_pool,
            retries={"max_attempts": retries, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": "path"},
            signature_version="s3v4",
        ),
    )
    # botocore asks before every PutObject and UploadPart body whether to send it
    # (`Expect: 100-continue`): one round trip more per upload and part, for nothing on a
    # store that answers errors anyway (the lean client never asks either)
    client.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
    return client


def __getattr__(name: str):
    # ``s3.ClientError`` / ``s3.EndpointConnectionError`` (re-exported), imported on first use
    if name in ("ClientError", "EndpointConnectionError"):
        import botocore.exceptions
        return getattr(botocore.exceptions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Error codes meaning "no such object" (HEAD answers a bare 404 / NotFound, GETs NoSuchKey).
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchVersion", "404", "NotFound"})


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError or an :class:`S3Error` (e.g.
    'NoSuchKey'), else None."""
    if isinstance(exc, S3Error):
        return exc.code
    exceptions = sys.modules.get("botocore.exceptions")  # no botocore loaded: no ClientError
    if exceptions is not None and isinstance(exc, exceptions.ClientError):
        return exc.response.get("Error", {}).get("Code")
    return None


def ensure_bucket(client, bucket: str) -> None:
    """Create ``bucket`` unless it exists already."""
    from botocore.exceptions import ClientError
    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


# The Id of DelveFS's rule in a bucket's notification configuration: `delvefs notify` adds,
# updates and removes the rule with this Id and no other.
NOTIFY_RULE_ID = "delvefs"
# (configuration list, ARN field) of each kind of target; the ARN's service picks one
_NOTIFY_TARGETS = {"sns": ("TopicConfigurations", "TopicArn"),
                   "lambda": ("LambdaFunctionConfigurations", "LambdaFunctionArn")}
_NOTIFY_QUEUE = ("QueueConfigurations", "QueueArn")  # SQS, and MinIO's targets (arn:minio:sqs:...)


def merged_notifications(current: dict, arn: str | None, rule_id: str = NOTIFY_RULE_ID) -> dict:
    """A bucket's notification configuration ``current`` (as GetBucketNotificationConfiguration
    answers it) with the rule ``rule_id`` sending every create and remove to ``arn`` — or,
    for ``arn`` None, without that rule. Every other rule (queues, topics, functions,
    EventBridge) is kept as it is."""
    merged = {k: v for k, v in current.items() if k != "ResponseMetadata"}
    for kind, _field in (*_NOTIFY_TARGETS.values(), _NOTIFY_QUEUE):
        rules = [rule for rule in merged.get(kind) or () if rule.get("Id") != rule_id]
        if rules:
            merged[kind] = rules
        else:
            merged.pop(kind, None)
    if arn is not None:
        parts = arn.split(":")
        kind, field = _NOTIFY_TARGETS.get(parts[2] if len(parts) > 2 else "", _NOTIFY_QUEUE)
        merged[kind] = [*merged.get(kind, ()), {"Id": rule_id, field: arn, "Events": list(S3_EVENTS)}]
    return merged


def wire_notifications(client, bucket: str, arn: str | None) -> dict:
    """Point every create/remove event of ``bucket`` at the target ``arn`` through DelveFS's
    own rule (``NOTIFY_RULE_ID``), or take that rule away (``arn`` None), keeping the rules
    of other consumers: the configuration is read, changed and written back (S3 can only
    replace it whole; two writers at the same moment can still lose one's change). Returns
    the configuration written."""
    current = client.get_bucket_notification_configuration(Bucket=bucket)
    merged = merged_notifications(current, arn)
    client.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=merged)
    return merged


# --- read path of the FUSE client (delvefs.store calls these from worker threads) ---

# the principal presigned_list_url binds a proof to while it runs (read by _bind_principal)
_presign_principal: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "delvefs_presign_principal", default=None)


def _bind_principal(request, **_) -> None:
    """botocore ``before-sign`` hook: the principal parameter, in presigned URLs only."""
    principal = _presign_principal.get()
    if principal is not None and request.context.get("is_presign_request"):
        request.params[PRINCIPAL_PARAM] = principal


def _sign_v4(**_) -> str | None:
    """botocore ``choose-signer`` hook: SigV4 for a proof, whatever the client's config. A
    client without ``signature_version`` presigns S3 URLs with SigV2, which the handler
    refuses (it reads the principal and the lifetime from SigV4's signed parameters)."""
    return "s3v4" if _presign_principal.get() is not None else None


def _regional_endpoint(context, **_) -> None:
    """botocore ``before-endpoint-resolution`` hook: a proof names the regional endpoint.
    Without ``addressing_style="virtual"`` botocore presigns for the global
    ``s3.amazonaws.com``, which outside us-east-1 is not the endpoint of the region the URL
    is signed for: the handler refuses such a URL (it fetches no redirect)."""
    if _presign_principal.get() is not None and context.get("is_presign_request"):
        context["use_global_endpoint"] = False


def presigned_list_url(client, bucket: str, *, prefix: str = "", principal: str = DEFAULT_PRINCIPAL,
                       expires: int = DEFAULT_PROOF_LIFETIME) -> str:
    """A presigned ListObjectsV2 URL (max-keys=0) of ``bucket`` under ``prefix``, bound to
    the handler ``principal``: the proof, sent to the handler, that these credentials may
    list that prefix (docs/API.md, "Who sees what"). Any boto3 S3 client will do (a plain
    ``boto3.client("s3")`` too): the URL is signed with SigV4, for an endpoint of its region."""
    events = client.meta.events
    events.register("before-sign.s3.ListObjectsV2", _bind_principal, unique_id="delvefs-bind-principal")
    # first: ahead of botocore's own hooks (its SigV2 default for presigned S3 URLs)
    events.register_first("choose-signer.s3.ListObjectsV2", _sign_v4, unique_id="delvefs-sign-v4")
    events.register_first("before-endpoint-resolution.s3", _regional_endpoint,
                          unique_id="delvefs-regional-endpoint")
    reset = _presign_principal.set(principal)
    try:
        return client.generate_presigned_url(
            "list_objects_v2", Params={"Bucket": bucket, "MaxKeys": 0, "Prefix": prefix},
            ExpiresIn=expires)
    finally:
        _presign_principal.reset(reset)


def head_object(client, bucket: str, key: str) -> dict:
    """``{"etag", "size", "mtime", "metadata"}`` of one object (ETag without quotes);
    raises ClientError or S3Error (code '404'/'NoSuchKey' when it is missing)."""
    r = client.head_object(Bucket=bucket, Key=key)
    return {"etag": r.get("ETag", "").strip('"'), "size": int(r.get("ContentLength", 0)),
            "mtime": r["LastModified"].timestamp() if r.get("LastModified") else 0.0,
            "metadata": dict(r.get("Metadata") or {})}


# --- write path of the FUSE client (delvefs.client.mount.s3async calls these from worker threads) ---

def _tagging(tags: dict[str, str] | None) -> str:
    import urllib.parse
    return urllib.parse.urlencode(sorted((tags or {}).items()))


def _conditions(base: str | None) -> dict:
    """The conditional-write arguments for an upload based on version ``base``: None =
    unconditional, "" = the object must not exist (If-None-Match: *), else its ETag
    (If-Match). A failed condition answers 412 PreconditionFailed (NoSuchKey for If-Match
    of a key that is gone); this MinIO honours both on PutObject and on
    CompleteMultipartUpload."""
    if base is None:
        return {}
    if base == "":
        return {"IfNoneMatch": "*"}
    return {"IfMatch": f'"{base}"'}


def put_file(client, bucket: str, key: str, filename: str, *, tags: dict[str, str] | None = None,
             content_type: str | None = None, base: str | None = None,
             metadata: dict[str, str] | None = None) -> str:
    """One PutObject of the whole file (small objects), conditional on ``base`` (see
    :func:`_conditions`), with user ``metadata``; returns the ETag (no quotes)."""
    with open(filename, "rb") as f:
        body = f.read()  # small: bytes are cheaper for botocore than a streamed file body
    return put_bytes(client, bucket, key, body, tags=tags, content_type=content_type, base=base,
                     metadata=metadata)


def put_bytes(client, bucket: str, key: str, body: bytes, *, tags: dict[str, str] | None = None,
              content_type: str | None = None, base: str | None = None,
              metadata: dict[str, str] | None = None) -> str:
    """One PutObject of ``body`` (as :func:`put_file`); returns the ETag (no quotes)."""
    kw = _conditions(base)
    if tags:
        kw["Tagging"] = _tagging(tags)
    if content_type:
        kw["ContentType"] = content_type
    if metadata:
        kw["Metadata"] = metadata
    r = client.put_object(Bucket=bucket, Key=key, Body=body, **kw)
    return r.get("ETag", "").strip('"')


def create_multipart(client, bucket: str, key: str, *, tags: dict[str, str] | None = None,
                     content_type: str | None = None, metadata: dict[str, str] | None = None) -> str:
    """Start a multipart upload (the object gets ``tags`` and user ``metadata`` when it
    completes); its id."""
    kw = {"Metadata": metadata} if metadata else {}
    if tags:
        kw["Tagging"] = _tagging(tags)
    if content_type:
        kw["ContentType"] = content_type
    return client.create_multipart_upload(Bucket=bucket, Key=key, **kw)["UploadId"]


def upload_part(client, bucket: str, key: str, upload_id: str, number: int, filename: str,
                offset: int, length: int) -> str:
    """Send bytes [offset, offset+length) of ``filename`` as part ``number``; its ETag."""
    with open(filename, "rb") as f:
        f.seek(offset)
        body = f.read(length)
    if len(body) != length:
        raise OSError(f"{filename}: {len(body)} bytes at {offset}, expected {length}")
    return client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                              Body=body)["ETag"]


def upload_part_copy(client, bucket: str, key: str, upload_id: str, number: int, src_bucket: str,
                     src_key: str, src_etag: str, start: int, end: int) -> str:
    """Part ``number`` copied server-side from bytes [start, end) of ``src_bucket/src_key``,
    only while that object is version ``src_etag`` (x-amz-copy-source-if-match: a changed or
    deleted source answers 412 / NoSuchKey); the part's ETag."""
    r = client.upload_part_copy(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                CopySource={"Bucket": src_bucket, "Key": src_key},
                                CopySourceIfMatch=f'"{src_etag}"',
                                CopySourceRange=f"bytes={start}-{end - 1}")
    return r["CopyPartResult"]["ETag"]


def complete_multipart(client, bucket: str, key: str, upload_id: str, parts: list[str], *,
                       base: str | None = None) -> str:
    """Complete the upload from ``parts`` (part ETags in order), conditional on ``base``
    (:func:`_conditions`); the object's ETag (no quotes)."""
    r = client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, **_conditions(base),
        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(parts)]})
    return r.get("ETag", "").strip('"')


def abort_multipart(client, bucket: str, key: str, upload_id: str) -> None:
    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)


def delete_objects(client, bucket: str, keys: list[str]) -> dict[str, str]:
    """DeleteObjects of up to 1,000 ``keys`` (quiet mode); ``{key: error code}`` of those
    the store did not delete (a missing key counts as deleted)."""
    r = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys],
                                                     "Quiet": True})
    return {e["Key"]: e.get("Code") or "InternalError" for e in r.get("Errors") or ()}


def make_copy_manager(client, *, threshold: int = MAX_SINGLE_COPY, concurrency: int = 10):
    """An s3transfer TransferManager for server-side copies: one CopyObject below
    ``threshold`` bytes, parallel UploadPartCopy parts of up to 512 MiB from it on."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    config = TransferConfig(multipart_threshold=threshold,
                            multipart_chunksize=min(threshold, 512 * 1024**2),
                            max_concurrency=concurrency, use_threads=True)
    return create_transfer_manager(client, config)


def copy_object(manager, bucket: str, key: str, src_bucket: str, src_key: str, *,
                src_etag: str | None = None, metadata: dict[str, str] | None = None,
                content_type: str | None = None) -> None:
    """Server-side copy ``src_bucket/src_key`` -> ``bucket/key`` (no data through us), with
    the source's tags and metadata — or, given ``metadata``, with that user metadata and
    ``content_type`` instead; with ``src_etag``, only of that version (else 412)."""
    # CopyObject copies tags by default; s3transfer's multipart copy only when told to
    extra = {"TaggingDirective": "COPY"}
    if src_etag is not None:
        extra["CopySourceIfMatch"] = src_etag
    if metadata is not None:
        extra.update(MetadataDirective="REPLACE", Metadata=metadata)
        if content_type:
            extra["ContentType"] = content_type
    manager.copy({"Bucket": src_bucket, "Key": src_key}, bucket, key, extra_args=extra).result()


def delete_object(client, bucket: str, key: str) -> None:
    client.delete_object(Bucket=bucket, Key=key)


def put_object_tags(client, bucket: str, key: str, tags: dict[str, str]) -> None:
    """Replace the object's tag set with ``tags``."""
    client.put_object_tagging(Bucket=bucket, Key=key, Tagging={
        "TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]})


# ---- used by the event handler (eventhandler/) ------------------------------------------

class BucketReader:
    """What the event handler's engine reads from S3: whole-bucket listings, an object's tags
    and user metadata, the store's clock. The engine is given one (tests give it a fake of
    these four methods); the boto3 client is made on first use, off the handler's start.
    ``lean``: a :class:`LeanClient` for the per-object requests (GetObjectTagging,
    HeadObject), else boto3 serves them too."""

    def __init__(self, client_factory=make_client, lean: LeanClient | None = None,
                 prober: LeanClient | None = None):
        self._client_factory = client_factory
        self._client = None
        self._lock = threading.Lock()
        self._lean = lean
        self._prober = prober
        # called with the exception when a request could not reach the store (the handler's
        # store watch: eventhandler/storewatch.py); set once before the reader is used
        self.on_unreachable = None

    @classmethod
    def from_settings(cls, settings: S3Settings) -> BucketReader:
        """The handler's reader. With an endpoint and static keys (what makes a mount use
        :class:`LeanClient`), tags and metadata are read without botocore: at one request per
        object, botocore's CPU per request (~1-2 ms of signing, parsing, events) competes
        with the handler's own work for the GIL. Credentials from a profile or a role: boto3.
        Probes (:meth:`probe`, :meth:`store_uptime`) go through a client of one try and short
        timeouts: a probe must tell "unreachable" within seconds."""
        static = _static_endpoint(settings) is not None
        lean = LeanClient(settings) if static else None
        prober = LeanClient(settings, attempts=1, connect_timeout=2, read_timeout=5) if static else None
        return cls(lambda: make_client(settings), lean, prober)

    @property
    def object_client(self):
        """The client of the per-object requests: the lean one if any, else boto3's."""
        return self._lean if self._lean is not None else self.client

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                self._client = self._client_factory()
            return self._client

    def list_pages(self, bucket: str):
        """Yields (contents, http_date) per ListObjectsV2 page (see :func:`list_pages`);
        ``$DELVEFS_SCAN_PAGE_SIZE`` keys a page (default and S3's maximum 1000; tests make
        scans last by lowering it)."""
        size = int(os.environ.get("DELVEFS_SCAN_PAGE_SIZE") or 1000)
        return list_pages(self.client, bucket, max(1, min(size, 1000)))

    def _watched(self, exc: BaseException) -> None:
        """Tell the store watch when a request failed without an answer from the store."""
        if self.on_unreachable is not None and unreachable_error(exc):
            self.on_unreachable(exc)

    def tags(self, bucket: str, key: str) -> dict[str, str] | None:
        """The object's tags; None when it is gone."""
        try:
            return get_object_tags(self.object_client, bucket, key)
        except Exception as exc:
            self._watched(exc)
            raise

    def metadata(self, bucket: str, key: str) -> dict[str, str] | None:
        """The object's user metadata (HeadObject); None when it is gone."""
        try:
            return head_object_metadata(self.object_client, bucket, key)
        except Exception as exc:
            self._watched(exc)
            raise

    def head(self, bucket: str, key: str) -> dict | None:
        """``{"etag", "size", "mtime", "metadata"}`` of the object (HeadObject; metadata keys
        lowercased), None when it is gone."""
        try:
            info = head_object(self.object_client, bucket, key)
        except Exception as exc:
            if error_code(exc) in MISSING_CODES:
                return None
            self._watched(exc)
            raise
        info["metadata"] = {k.lower(): v for k, v in info["metadata"].items()}
        return info

    def probe(self, bucket: str) -> None:
        """One cheap request that the store must answer (ListObjectsV2 of no keys): returns
        when it did, raises when it could not be reached or answered an error."""
        if self._prober is not None:
            self._prober.list_none(bucket)
        else:
            store_date(self.client, bucket)

    def store_uptime(self) -> float | None:
        """Seconds since the store's server started, where it tells (MinIO's admin
        ServerInfo, with credentials allowed it; the shortest uptime of its servers); None
        where it does not (AWS S3, no admin right, no static keys)."""
        if self._prober is None:
            return None
        return self._prober.minio_uptime()

    def store_date(self, bucket: str) -> str | None:
        """The store's clock (see :func:`store_date`)."""
        return store_date(self.client, bucket)


def unreachable_error(exc: BaseException) -> bool:
    """The request got no answer from the store (connection refused, reset, timed out) or
    the store answered that it is not serving (502, 503, 504)."""
    if isinstance(exc, S3Error):
        return exc.status in (502, 503, 504)
    if isinstance(exc, (OSError, TimeoutError)) or type(exc).__module__.startswith("http.client"):
        return True
    name = type(exc).__name__
    return name in {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                    "ConnectionClosedError", "ProxyConnectionError"}


def list_pages(client, bucket: str, page_size: int = 1000):
    """ListObjectsV2 of a whole bucket, page by page: yields (contents, http_date) where
    contents is the page's list of {"Key", "Size", "ETag", "LastModified"} dicts (keys in
    UTF-8 byte order) and http_date the response's Date header (the store's clock)."""
    kwargs = {"Bucket": bucket, "MaxKeys": page_size}
    while True:
        resp = client.list_objects_v2(**kwargs)
        yield resp.get("Contents", []), resp["ResponseMetadata"]["HTTPHeaders"].get("date")
        if not resp.get("IsTruncated"):
            return
        kwargs["ContinuationToken"] = resp["NextContinuationToken"]


def list_level(client, bucket: str, prefix: str, continuation: str | None = None) -> dict:
    """One ListObjectsV2 page of one level below ``prefix`` (delimiter ``/``):
    ``{"objects": [{"key", "size", "etag"}], "prefixes": [common prefix, ...], "next":
    continuation token or None}`` (ETags without quotes)."""
    kwargs = {"ContinuationToken": continuation} if continuation else {}
    resp = client.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=1000, **kwargs)
    return {"objects": [{"key": c["Key"], "size": int(c.get("Size", 0)),
                         "etag": str(c.get("ETag", "")).strip('"')} for c in resp.get("Contents", [])],
            "prefixes": [p["Prefix"] for p in resp.get("CommonPrefixes", [])],
            "next": resp.get("NextContinuationToken") if resp.get("IsTruncated") else None}


def get_object_tags(client, bucket: str, key: str) -> dict[str, str] | None:
    """The object's tags, or None when the object does not exist (any more)."""
    try:
        resp = client.get_object_tagging(Bucket=bucket, Key=key)
    except Exception as exc:
        if error_code(exc) in MISSING_CODES:
            return None
        raise
    return {t["Key"]: t["Value"] for t in resp.get("TagSet", [])}


def head_object_metadata(client, bucket: str, key: str) -> dict[str, str] | None:
    """The object's user metadata (keys without x-amz-meta-, lowercased), or None if absent."""
    try:
        metadata = head_object(client, bucket, key)["metadata"]
    except Exception as exc:
        if error_code(exc) in MISSING_CODES:
            return None
        raise
    return {k.lower(): v for k, v in metadata.items()}


def store_date(client, bucket: str) -> str | None:
    """The store's clock (HTTP Date header, whole seconds) from a cheap bucket request."""
    resp = client.list_objects_v2(Bucket=bucket, MaxKeys=0)
    return resp["ResponseMetadata"]["HTTPHeaders"].get("date")


# ---- bucket checks of the FUSE client's mount (delvefs.client.mount.s3async) ------------------

def check_bucket(client, bucket: str) -> None:
    """HeadBucket with a boto3 client: returns when the bucket exists and the client may
    read it. Raises :class:`S3Error` when the store refuses (a HEAD answer has no body:
    the code is the HTTP status), else what botocore raises."""
    from botocore.exceptions import ClientError
    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        raise S3Error(error_code(exc) or str(status), status, str(exc)) from None


# ---- SQS: the handler's event source for AWS S3 (eventhandler/sqs.py) -------------------

def sqs_endpoint(queue_url: str, settings: S3Settings | None = None,
                 env=os.environ) -> tuple[str, str]:
    """(endpoint URL, region) of the SQS service holding ``queue_url``:
    ``$AWS_ENDPOINT_URL_SQS`` if set (the standard per-service variable), else the queue
    URL's own scheme and host; the region is that of an ``sqs.<region>.amazonaws.com`` host,
    else the settings' region."""
    parts = urllib.parse.urlsplit(queue_url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.count("/") != 2:
        raise ValueError(f"{queue_url!r} is no SQS queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)")
    host = parts.hostname or ""
    labels = host.split(".")
    region = (labels[1] if len(labels) >= 4 and labels[0] == "sqs" and host.endswith(".amazonaws.com")
              else (settings or S3Settings.from_env(env)).region)
    return env.get("AWS_ENDPOINT_URL_SQS") or f"{parts.scheme}://{parts.netloc}", region


def make_sqs_client(queue_url: str, settings: S3Settings | None = None, *, max_pool: int = 16,
                    read_timeout: float = 40):
    """A boto3 SQS client for the service of ``queue_url`` with the S3 settings' credentials.
    ``read_timeout`` must exceed the long polls' wait (at most 20 s)."""
    import boto3
    import botocore.config

    settings = settings or S3Settings.from_env()
    endpoint, region = sqs_endpoint(queue_url, settings)
    return boto3.client(
        "sqs", endpoint_url=endpoint, region_name=region,
        aws_access_key_id=settings.access_key, aws_secret_access_key=settings.secret_key,
        aws_session_token=settings.session_token,
        config=botocore.config.Config(max_pool_connections=max_pool, connect_timeout=5,
                                      read_timeout=read_timeout,
                                      retries={"max_attempts": 3, "mode": "standard"}))


def sqs_receive(client, queue_url: str, *, max_messages: int = 10, wait: int = 20,
                visibility: int | None = None) -> list[dict]:
    """One long poll: up to ``max_messages`` (at most 10) messages as {"id", "receipt",
    "body" (str), "receives" (how often it was received, this time included)}."""
    kwargs = {"QueueUrl": queue_url, "MaxNumberOfMessages": max(1, min(max_messages, 10)),
              "WaitTimeSeconds": max(0, min(wait, 20)),
              "MessageSystemAttributeNames": ["ApproximateReceiveCount"]}
    if visibility is not None:
        kwargs["VisibilityTimeout"] = visibility
    resp = client.receive_message(**kwargs)
    return [{"id": m["MessageId"], "receipt": m["ReceiptHandle"], "body": m.get("Body", ""),
             "receives": int((m.get("Attributes") or {}).get("ApproximateReceiveCount", 1))}
            for m in resp.get("Messages", [])]


def _sqs_batches(items: list, size: int = 10):
    for i in range(0, len(items), size):
        yield list(enumerate(items[i:i + size]))


def sqs_delete(client, queue_url: str, receipts: list[str]) -> list[str]:
    """Delete received messages (batches of 10); returns why each failed one failed."""
    failed = []
    for batch in _sqs_batches(receipts):
        resp = client.delete_message_batch(
            QueueUrl=queue_url, Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in batch])
        failed += [f"{f.get('Code')}: {f.get('Message', '')}" for f in resp.get("Failed", [])]
    return failed


def sqs_set_visibility(client, queue_url: str, receipts: list[str], seconds: int) -> None:
    """Make received messages visible again after ``seconds`` (0: at once)."""
    for batch in _sqs_batches(receipts):
        client.change_message_visibility_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": seconds} for i, r in batch])


def sqs_send(client, queue_url: str, body: str, attributes: dict[str, str] | None = None) -> None:
    """Send one message (``attributes``: string message attributes)."""
    kwargs = {"QueueUrl": queue_url, "MessageBody": body}
    if attributes:
        kwargs["MessageAttributes"] = {k: {"DataType": "String", "StringValue": v[:1024] or "-"}
                                       for k, v in attributes.items()}
    client.send_message(**kwargs)


def sqs_attributes(client, queue_url: str) -> dict[str, str]:
    """The queue's attributes (ApproximateNumberOfMessages, RedrivePolicy, QueueArn, ...)."""
    return client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"]).get("Attributes", {})


def sqs_queue_url(client, arn: str) -> str:
    """The URL of the queue ``arn:aws:sqs:REGION:ACCOUNT:NAME``."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs":
        raise ValueError(f"{arn!r} is no SQS queue ARN")
    return client.get_queue_url(QueueName=parts[5], QueueOwnerAWSAccountId=parts[4])["QueueUrl"]
