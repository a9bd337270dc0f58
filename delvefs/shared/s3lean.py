"""S3 without botocore: SigV4 signing with the standard library, over kept-alive
``http.client`` connections, for the requests a mount and the handler make most (see
:mod:`delvefs.shared.s3`, which decides when they are used and re-exports these names).
Presigned ListObjectsV2 proofs (:func:`presign_list_url`) and their check
(:func:`check_bucket_with_proof`) live here too: a mount makes both before boto3 is loaded.
Imports no boto3/botocore.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import os
import random
import re
import ssl
import time
import urllib.parse

from .config import DEFAULT_PRINCIPAL, DEFAULT_PROOF_LIFETIME, S3Settings
from .connpool import STALE, ConnectionPool

# The query parameter that binds a proof to the handler principal presenting it. Every query
# parameter of a presigned URL is signed, so it cannot be changed or dropped without
# invalidating the signature; S3 ignores query parameters beginning with "x-" (it only logs
# them), and MinIO accepts them (tests/integration/test_handler_auth.py).
PRINCIPAL_PARAM = "x-delvefs-principal"


def presign_list_url(settings: S3Settings, bucket: str, *, prefix: str = "",
                     principal: str = DEFAULT_PRINCIPAL, expires: int = DEFAULT_PROOF_LIFETIME,
                     now: datetime.datetime | None = None) -> str | None:
    """The same proof as :func:`presigned_list_url` (path-style, SigV4 query signature)
    without botocore: from ``settings`` alone. None when the settings lack an endpoint or
    static keys (credentials from a profile, a role, ...): then ask boto3."""
    ep = _static_endpoint(settings)
    if ep is None:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    region = settings.region
    scope = f"{day}/{region}/s3/aws4_request"
    host = _canonical_host(ep)
    path = ep.path.rstrip("/") + "/" + urllib.parse.quote(bucket, safe="-_.~")
    params = {"list-type": "2", "max-keys": "0", "prefix": prefix, "encoding-type": "url",
              PRINCIPAL_PARAM: principal, "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
              "X-Amz-Credential": f"{settings.access_key}/{scope}", "X-Amz-Date": amz_date,
              "X-Amz-Expires": str(int(expires)), "X-Amz-SignedHeaders": "host"}
    if settings.session_token:  # temporary credentials: signed, in the query (as botocore)
        params["X-Amz-Security-Token"] = settings.session_token
    query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                     for k, v in sorted(params.items()))
    canonical = f"GET\n{path}\n{query}\nhost:{host}\n\nhost\nUNSIGNED-PAYLOAD"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = _signing_key(settings.secret_key, day, region)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    base = urllib.parse.urlunsplit((ep.scheme, ep.netloc, path, "", ""))
    return f"{base}?{query}&X-Amz-Signature={signature}"


def _static_endpoint(settings: S3Settings) -> urllib.parse.SplitResult | None:
    """The endpoint URL, split, when the settings name one and static keys, else None."""
    if not (settings.endpoint_url and settings.access_key and settings.secret_key):
        return None
    ep = urllib.parse.urlsplit(settings.endpoint_url)
    if ep.scheme not in ("http", "https") or not ep.netloc or ep.query:
        return None
    return ep


def _canonical_host(ep: urllib.parse.SplitResult) -> str:
    """The Host header as signed (and sent): the endpoint's netloc without a default port."""
    if (ep.scheme, ep.port) in (("http", 80), ("https", 443)):
        return ep.hostname if ":" not in (ep.hostname or "") else f"[{ep.hostname}]"
    return ep.netloc


def _signing_key(secret: str, day: str, region: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


class S3Error(Exception):
    """An S3 error answer to a :class:`LeanClient` request; ``code`` as botocore's
    ClientError has it (the XML error's Code, or the HTTP status for a body-less answer)."""

    def __init__(self, code: str, status: int, message: str):
        super().__init__(f"{code} ({status}): {message}")
        self.code, self.status = code, status


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# retried like botocore's "standard" mode: server errors, throttling, transient codes
_RETRY_STATUS = frozenset({500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                          "RequestTimeoutException", "PriorRequestNotComplete", "InternalError"})


def _backoff(attempt: int) -> None:
    """botocore's wait before try ``attempt`` (0 = the first: none): random, at most 1 s,
    2 s, 4 s, ... 20 s."""
    if attempt:
        time.sleep(random.random() * min(20, 2 ** (attempt - 1)))


class LeanClient:
    """DeleteObject, HeadObject, PutObject (body in memory), GetObjectTagging (the event
    handler's :class:`BucketReader`) and ranged GETs (``get_range``, the mount's downloads)
    without botocore: SigV4
    header signatures (payload signed, path-style URLs, keys quoted like botocore),
    http.client connections kept alive in a pool, ``attempts`` tries per request with
    botocore's backoff (random up to 1 s, 2 s, ... at most 20 s) on connection errors,
    timeouts, 5xx and throttling; every try bounded by the connect and read timeouts.
    Errors: :class:`S3Error`, or the last OSError / HTTPException. Thread-safe."""

    def __init__(self, settings: S3Settings, *, attempts: int = 3, connect_timeout: float = 5,
                 read_timeout: float = 60):
        ep = _static_endpoint(settings)
        if ep is None:
            raise ValueError("LeanClient needs an endpoint URL and static keys")
        self._ep = ep
        self._host = _canonical_host(ep)
        self._base = ep.path.rstrip("/")
        self._access, self._secret, self._region = settings.access_key, settings.secret_key, settings.region
        self._token = settings.session_token
        self._keys: tuple[str, bytes] = ("", b"")  # (day, signing key of that day)
        self.attempts = max(1, attempts)
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        tls = None
        if ep.scheme == "https":  # verified like botocore: AWS_CA_BUNDLE, else the system's CAs
            tls = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
        self._pool = ConnectionPool(ep.hostname, ep.port, tls=tls, connect_timeout=connect_timeout,
                                    read_timeout=read_timeout)

    # the botocore client methods of the same names (the parts this module's functions use)

    def delete_object(self, *, Bucket: str, Key: str) -> dict:
        self._request("DELETE", Bucket, Key)
        return {}

    def get_object_tagging(self, *, Bucket: str, Key: str) -> dict:
        return {"TagSet": _parse_tag_set(self._request("GET", Bucket, Key, query="tagging=")[1])}

    def head_object(self, *, Bucket: str, Key: str, attempts: int | None = None) -> dict:
        """``attempts``: tries of this request (default: the client's)."""
        import email.utils
        headers = self._request("HEAD", Bucket, Key, attempts=attempts)[0]
        modified = headers.get("Last-Modified")
        return {"ETag": headers.get("ETag", ""), "ContentLength": int(headers.get("Content-Length", 0)),
                "LastModified": email.utils.parsedate_to_datetime(modified) if modified else None,
                "Metadata": {k[11:]: v for k, v in headers.items() if k.lower().startswith("x-amz-meta-")}}

    def put_object(self, *, Bucket: str, Key: str, Body: bytes, Tagging: str | None = None,
                   ContentType: str | None = None, IfMatch: str | None = None,
                   IfNoneMatch: str | None = None, Metadata: dict[str, str] | None = None) -> dict:
        extra = {f"x-amz-meta-{k}": v for k, v in (Metadata or {}).items()}
        if ContentType:
            extra["content-type"] = ContentType
        if Tagging:
            extra["x-amz-tagging"] = Tagging
        if IfMatch:
            extra["if-match"] = IfMatch
        if IfNoneMatch:
            extra["if-none-match"] = IfNoneMatch
        return {"ETag": self._request("PUT", Bucket, Key, extra, Body)[0].get("ETag", "")}

    def list_none(self, bucket: str) -> None:
        """ListObjectsV2 of no keys: the cheapest request a bucket answers (a probe)."""
        self._request("GET", bucket, "", query="list-type=2&max-keys=0")

    def minio_uptime(self) -> float | None:
        """MinIO's admin ServerInfo: the shortest uptime of its servers in whole seconds (0
        for one still starting: it tells no uptime yet, or answers 5xx); None when the store
        is no MinIO or refuses the request (no admin right)."""
        import json
        try:
            data = self._request("GET", "minio", "admin/v3/info")[1]
        except S3Error as exc:
            return 0.0 if exc.status >= 500 else None
        try:
            servers = json.loads(data).get("servers") or []
            uptimes = [float(s.get("uptime") or 0) for s in servers]
        except (ValueError, TypeError, AttributeError):
            return None
        return min(uptimes) if uptimes else None

    def get_range(self, bucket: str, key: str, start: int, end: int, *, etag: str, write,
                  chunk: int = 1 << 20) -> None:
        """Bytes [start, end) of the object version ``etag`` (If-Match: a changed object
        answers 412), handed to ``write(offset, data)`` as they arrive, ``chunk`` at a time,
        read straight into one reused buffer (no per-chunk objects and thread hand-offs as in
        s3transfer). A failed try resumes where it stopped; an error of ``write`` (the
        cache disk) is raised at once."""
        path = self.path(bucket, key)
        view = memoryview(bytearray(min(chunk, end - start)))
        error: BaseException | None = None
        attempt = 0
        while start < end:
            if attempt == self.attempts:
                raise error
            _backoff(attempt)
            attempt += 1
            headers = {"range": f"bytes={start}-{end - 1}", "if-match": f'"{etag}"'}
            try:
                conn, resp = self._open("GET", path, headers, b"")
            except (OSError, http.client.HTTPException) as exc:
                error = exc
                continue
            failed = None
            try:
                if resp.status >= 300:
                    error = self._error("GET", resp.status, resp.read())
                    self._keep(conn, resp)
                    if resp.status not in _RETRY_STATUS and error.code not in _RETRY_CODES:
                        raise error
                    continue
                if resp.length != end - start:
                    conn.close()
                    raise S3Error("InvalidRange", resp.status,
                                  f"{resp.length} bytes for the range {start}-{end - 1}")
                while start < end:
                    n = resp.readinto(view[:end - start])
                    if not n:
                        raise http.client.IncompleteRead(b"", end - start)
                    try:
                        write(start, view[:n])
                    except BaseException as exc:  # noqa: BLE001 — raised below, not retried
                        failed = exc
                        break
                    start += n
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                error = exc
                continue
            if failed is not None:
                conn.close()
                raise failed
            self._keep(conn, resp)

    def get_if_changed(self, bucket: str, key: str, start: int, end: int, *, etag: str,
                       attempts: int | None = None) -> dict | None:
        """A revalidation of version ``etag`` in one round trip: a ranged GET of bytes
        [start, end) with If-None-Match. None when ``etag`` is still the object's version
        (304); else the version S3 has — ``{"etag", "size", "mtime", "metadata", "start",
        "data"}``, ``data`` its bytes from ``start`` (those of [start, end) it has) — as a
        HEAD would tell and the first bytes with it. An empty object cannot answer a range
        (416): then ``data`` is None and a HEAD tells the rest. ``attempts``: tries of this
        request (default: the client's)."""
        import email.utils
        headers = {"range": f"bytes={start}-{end - 1}", "if-none-match": f'"{etag}"'}
        try:
            status, got, data = self._exchange("GET", bucket, key, headers, attempts=attempts,
                                               accept=(304,))
        except S3Error as exc:
            if exc.status != 416:
                raise
            return {"data": None}
        if status == 304:
            return None
        # 206: "Content-Range: bytes FIRST-LAST/SIZE"; 200: the whole object
        span = re.fullmatch(r"bytes (\d+)-\d+/(\d+)", got.get("Content-Range", "").strip())
        start, size = (int(span[1]), int(span[2])) if span else (0, len(data))
        modified = got.get("Last-Modified")
        return {"etag": got.get("ETag", "").strip('"'), "size": size,
                "mtime": email.utils.parsedate_to_datetime(modified).timestamp() if modified else 0.0,
                "metadata": {k[11:]: v for k, v in got.items() if k.lower().startswith("x-amz-meta-")},
                "start": start, "data": data}

    def _keep(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        if resp.will_close:
            conn.close()
        else:
            self._pool.put(conn)

    def close(self) -> None:
        self._pool.close()

    # ---

    def path(self, bucket: str, key: str) -> str:
        return f"{self._base}/{urllib.parse.quote(bucket, safe='-_.~')}/{urllib.parse.quote(key, safe='/-_.~')}"

    def sign(self, method: str, path: str, headers: dict[str, str], body: bytes,
             now: datetime.datetime | None = None, query: str = "") -> dict[str, str]:
        """``headers`` (lowercase names) plus host, x-amz-date, x-amz-content-sha256 and
        the Authorization signing all of them and ``query`` (canonical: sorted, encoded)."""
        amz_date = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        if self._keys[0] != day:
            self._keys = (day, _signing_key(self._secret, day, self._region))
        payload = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256
        signed = {**headers, "host": self._host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
        if self._token:  # temporary credentials: a signed header (as botocore)
            signed["x-amz-security-token"] = self._token
        names = sorted(signed)
        canonical = "\n".join([method, path, query, *(f"{k}:{' '.join(signed[k].split())}" for k in names),
                               "", ";".join(names), payload])
        scope = f"{day}/{self._region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._keys[1], to_sign.encode(), hashlib.sha256).hexdigest()
        signed["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self._access}/{scope}, "
                                   f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return signed

    def _request(self, method: str, bucket: str, key: str, headers: dict[str, str] | None = None,
                 body: bytes = b"", query: str = "", attempts: int | None = None,
                 ) -> tuple[http.client.HTTPMessage, bytes]:
        return self._exchange(method, bucket, key, headers, body, query, attempts)[1:]

    def _exchange(self, method: str, bucket: str, key: str, headers: dict[str, str] | None = None,
                  body: bytes = b"", query: str = "", attempts: int | None = None,
                  accept: tuple[int, ...] = ()) -> tuple[int, http.client.HTTPMessage, bytes]:
        """(status, headers, body) of a 2xx answer, or of one whose status is in ``accept``;
        any other answer is raised (:class:`S3Error`) once its tries are spent."""
        path = self.path(bucket, key)
        error: BaseException | None = None
        for attempt in range(max(1, attempts or self.attempts)):
            _backoff(attempt)
            try:
                conn, resp = self._open(method, path, headers or {}, body, query)
                try:
                    data = resp.read()
                except BaseException:
                    conn.close()
                    raise
            except (OSError, http.client.HTTPException) as exc:
                error = exc
                continue
            self._keep(conn, resp)
            if resp.status < 300 or resp.status in accept:
                return resp.status, resp.headers, data
            error = self._error(method, resp.status, data)
            if resp.status not in _RETRY_STATUS and error.code not in _RETRY_CODES:
                break
        raise error

    def _open(self, method: str, path: str, headers: dict[str, str], body: bytes, query: str = ""):
        """Send one request (``query``: canonical, sent as it is signed); (connection,
        response) once its status line and headers are in. A pooled connection the server
        has closed meanwhile is dropped and the request sent again on another (pooled or
        new) one, without counting as a try."""
        while True:
            conn, reused = self._pool.take()
            try:
                conn.putrequest(method, f"{path}?{query}" if query else path, skip_host=True,
                                skip_accept_encoding=True)
                for k, v in self.sign(method, path, headers, body, query=query).items():
                    conn.putheader(k, v)
                if body or method == "PUT":
                    conn.putheader("content-length", str(len(body)))
                conn.endheaders(body or None)
                return conn, conn.getresponse()
            except STALE:  # a kept-alive connection the server closed: at once on another
                conn.close()
                if reused:
                    continue
                raise
            except BaseException:
                conn.close()
                raise

    @staticmethod
    def _error(method: str, status: int, data: bytes) -> S3Error:
        code, message = str(status), http.client.responses.get(status, "")
        if data and method != "HEAD":
            import xml.etree.ElementTree as ET
            try:
                root = ET.fromstring(data)
                code = root.findtext("Code") or code
                message = root.findtext("Message") or message
            except ET.ParseError:
                pass
        return S3Error(code, status, message)


def _parse_tag_set(data: bytes) -> list[dict[str, str]]:
    """The tag set of a GetObjectTagging answer (``Tagging/TagSet/Tag/{Key,Value}``, in any
    XML namespace) as botocore gives it: ``[{"Key", "Value"}]``, escapes resolved. expat
    (as botocore's parser) fetches no external entities and bounds entity expansion. An
    answer that is not such XML is an :class:`S3Error` 'MalformedResponse' (not retried)."""
    import xml.etree.ElementTree as ET

    def name(element) -> str:
        return element.tag.rpartition("}")[2]
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise S3Error("MalformedResponse", 200, f"GetObjectTagging answer: {exc}") from None
    if name(root) != "Tagging":
        raise S3Error("MalformedResponse", 200, f"GetObjectTagging answer is <{name(root)}>, not <Tagging>")
    tags = []
    for tag in (t for tag_set in root if name(tag_set) == "TagSet" for t in tag_set if name(t) == "Tag"):
        fields = {name(field): field.text or "" for field in tag}
        if "Key" not in fields:
            raise S3Error("MalformedResponse", 200, "GetObjectTagging answer has a <Tag> without <Key>")
        tags.append({"Key": fields["Key"], "Value": fields.get("Value", "")})
    return tags


def check_bucket_with_proof(url: str, *, attempts: int = 3, connect_timeout: float = 5,
                            read_timeout: float = 60) -> None:
    """GET a presigned ListObjectsV2 URL (:func:`presign_list_url`: max-keys=0, signed in
    its query) without botocore: returns when the store answers 200 — the bucket exists
    and the credentials that signed the URL may list it. Raises :class:`S3Error` when the
    store refuses (not retried), or the last OSError / HTTPException when ``attempts``
    tries could not reach it."""
    url_parts = urllib.parse.urlsplit(url)
    target = f"{url_parts.path}?{url_parts.query}"
    context = None
    if url_parts.scheme == "https":  # verified like botocore: AWS_CA_BUNDLE, else the system's CAs
        context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
    error: BaseException | None = None
    for attempt in range(max(1, attempts)):
        if attempt:
            time.sleep(0.1 * 2 ** (attempt - 1))
        if context is None:
            conn = http.client.HTTPConnection(url_parts.hostname, url_parts.port, timeout=connect_timeout)
        else:
            conn = http.client.HTTPSConnection(url_parts.hostname, url_parts.port,
                                               timeout=connect_timeout, context=context)
        try:
            conn.connect()
            conn.sock.settimeout(read_timeout)
            conn.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("host", _canonical_host(url_parts))  # the Host the URL was signed for
            conn.endheaders()
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            error = exc
            continue
        finally:
            conn.close()
        if resp.status == 200:
            return
        raise LeanClient._error("GET", resp.status, data)
    raise error
