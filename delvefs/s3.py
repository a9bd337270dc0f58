"""The one module that talks to S3 (boto3). Synchronous by design: the trio
client calls it through ``trio.to_thread.run_sync`` with a limiter, the handler
from its worker threads. Callers never import boto3 themselves.

boto3/botocore are imported on first use (``make_client``; ``ClientError`` and
``EndpointConnectionError`` are still importable from here): importing them and building
a client costs ~0.3 s of CPU, which a mount keeps off its way to "ready" — it presigns
its ListObjectsV2 proofs with :func:`presign_list_url` (SigV4, standard library only).
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import sys
import urllib.parse

from .config import S3Settings

S3_EVENTS = ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]


def make_client(settings: S3Settings | None = None, *, max_pool: int = 32, retries: int = 3,
                connect_timeout: float = 5, read_timeout: float = 60):
    """A boto3 S3 client for ``settings`` (default: from the environment)."""
    import boto3
    import botocore.config

    settings = settings or S3Settings.from_env()
    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint_url,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
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


def __getattr__(name: str):
    # ``s3.ClientError`` / ``s3.EndpointConnectionError`` (re-exported), imported on first use
    if name in ("ClientError", "EndpointConnectionError"):
        import botocore.exceptions
        return getattr(botocore.exceptions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Error codes meaning "no such object" (HEAD answers a bare 404 / NotFound, GETs NoSuchKey).
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchVersion", "404", "NotFound"})


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError (e.g. 'NoSuchKey'), else None."""
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


def wire_notifications(client, bucket: str, arn: str) -> None:
    """Point all create/remove events of ``bucket`` at the queue target ``arn``."""
    client.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {"Id": "delvefs", "QueueArn": arn, "Events": list(S3_EVENTS)},
            ]
        },
    )


# --- read path of the FUSE client (delvefs.store calls these from worker threads) ---

def presigned_list_url(client, bucket: str, expires: int = 300) -> str:
    """A presigned ListObjectsV2 URL (max-keys=0) of ``bucket``: the proof, sent to the
    handler, that these credentials may list the bucket (docs/API.md, POST /v1/views)."""
    return client.generate_presigned_url(
        "list_objects_v2", Params={"Bucket": bucket, "MaxKeys": 0}, ExpiresIn=expires)


def presign_list_url(settings: S3Settings, bucket: str, expires: int = 300,
                     now: datetime.datetime | None = None) -> str | None:
    """The same proof as :func:`presigned_list_url` (path-style, SigV4 query signature)
    without botocore: from ``settings`` alone. None when the settings lack an endpoint or
    static keys (credentials from a profile, a role, ...): then ask boto3."""
    if not (settings.endpoint_url and settings.access_key and settings.secret_key):
        return None
    ep = urllib.parse.urlsplit(settings.endpoint_url)
    if ep.scheme not in ("http", "https") or not ep.netloc or ep.query:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    region = settings.region
    scope = f"{day}/{region}/s3/aws4_request"
    host = ep.netloc
    if (ep.scheme, ep.port) in (("http", 80), ("https", 443)):
        host = ep.hostname if ":" not in (ep.hostname or "") else f"[{ep.hostname}]"
    path = ep.path.rstrip("/") + "/" + urllib.parse.quote(bucket, safe="-_.~")
    params = {"list-type": "2", "max-keys": "0", "encoding-type": "url", "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
              "X-Amz-Credential": f"{settings.access_key}/{scope}", "X-Amz-Date": amz_date,
              "X-Amz-Expires": str(int(expires)), "X-Amz-SignedHeaders": "host"}
    query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                     for k, v in sorted(params.items()))
    canonical = f"GET\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + settings.secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    base = urllib.parse.urlunsplit((ep.scheme, ep.netloc, path, "", ""))
    return f"{base}?{query}&X-Amz-Signature={signature}"


def head_object(client, bucket: str, key: str) -> dict:
    """``{"etag", "size", "mtime", "metadata"}`` of one object (ETag without quotes);
    raises ClientError (code '404'/'NoSuchKey' when it is missing)."""
    r = client.head_object(Bucket=bucket, Key=key)
    return {"etag": r.get("ETag", "").strip('"'), "size": int(r.get("ContentLength", 0)),
            "mtime": r["LastModified"].timestamp() if r.get("LastModified") else 0.0,
            "metadata": dict(r.get("Metadata") or {})}


def make_transfer_manager(client, *, part_size: int = 8 * 1024 * 1024, concurrency: int = 10):
    """An s3transfer TransferManager doing parallel ranged GETs of ``part_size`` above
    ``part_size`` (one per object reader; close it with ``shutdown()``)."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                            max_concurrency=concurrency, use_threads=True)
    return create_transfer_manager(client, config)


def download_object(manager, bucket: str, key: str, filename: str, *, etag: str, size: int) -> None:
    """Download exactly the object version whose ETag is ``etag`` (``size`` bytes) to
    ``filename``: every GET, ranged or not, carries ``IfMatch``, so a concurrent overwrite
    fails the download (ClientError 'PreconditionFailed', HTTP 412) instead of mixing
    versions. s3transfer writes a temporary file and renames it onto ``filename``."""
    from s3transfer.subscribers import BaseSubscriber

    class _Known(BaseSubscriber):
        def on_queued(self, future, **kwargs):
            future.meta.provide_transfer_size(size)
            future.meta.provide_object_etag(f'"{etag}"')

    manager.download(bucket, key, filename, subscribers=[_Known()]).result()


# --- write path of the FUSE client (delvefs.fs.store calls these from worker threads) ---

def _tagging(tags: dict[str, str] | None) -> str:
    import urllib.parse
    return urllib.parse.urlencode(sorted((tags or {}).items()))


def put_file(client, bucket: str, key: str, filename: str, *, tags: dict[str, str] | None = None,
             content_type: str | None = None) -> str:
    """One PutObject of the whole file (small objects); returns the ETag (no quotes)."""
    kw = {}
    if tags:
        kw["Tagging"] = _tagging(tags)
    if content_type:
        kw["ContentType"] = content_type
    with open(filename, "rb") as f:
        body = f.read()  # small: bytes are cheaper for botocore than a streamed file body
    r = client.put_object(Bucket=bucket, Key=key, Body=body, **kw)
    return r.get("ETag", "").strip('"')


def upload_file(manager, bucket: str, key: str, filename: str, *, tags: dict[str, str] | None = None,
                content_type: str | None = None) -> None:
    """Upload a file through s3transfer (multipart, parallel parts, above the manager's
    threshold) with ``tags`` as the object's tag set and ``content_type``."""
    extra = {}
    if tags:
        extra["Tagging"] = _tagging(tags)
    if content_type:
        extra["ContentType"] = content_type
    manager.upload(filename, bucket, key, extra_args=extra).result()


def make_copy_manager(client, *, concurrency: int = 10):
    """An s3transfer TransferManager for server-side copies: one CopyObject up to 5 GiB,
    multipart UploadPartCopy above (tags and metadata are carried over either way)."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    config = TransferConfig(multipart_threshold=5 * 1024**3, multipart_chunksize=512 * 1024**2,
                            max_concurrency=concurrency, use_threads=True)
    return create_transfer_manager(client, config)


def copy_object(manager, bucket: str, key: str, src_bucket: str, src_key: str) -> None:
    """Server-side copy ``src_bucket/src_key`` -> ``bucket/key`` (no data through us)."""
    manager.copy({"Bucket": src_bucket, "Key": src_key}, bucket, key).result()


def delete_object(client, bucket: str, key: str) -> None:
    client.delete_object(Bucket=bucket, Key=key)


def put_object_tags(client, bucket: str, key: str, tags: dict[str, str]) -> None:
    """Replace the object's tag set with ``tags``."""
    client.put_object_tagging(Bucket=bucket, Key=key, Tagging={
        "TagSet": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]})


# ---- used by the event handler (eventhandler/) ------------------------------------------

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
