"""``delvefs.shared.s3.LeanClient`` (DeleteObject, HeadObject, PutObject, GetObjectTagging
without botocore) quotes keys and signs exactly like botocore, parses tag sets as botocore
does, and serves the event handler's ``BucketReader`` when the keys are static."""
import datetime
import functools

import pytest

from delvefs.shared import s3, s3lean
from delvefs.shared.config import S3Settings

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
KEYS = ["plain.txt", "dir/sub/a b.txt", "a+b%c&d=e?f#g", "ünï/cödé ü.fastq", "~tilde/semi;colon,comma",
        "x/ spaces  two/", "quote'\"<>|\\back"]
ENDPOINTS = ["http://127.0.0.1:9000", "https://s3.example.org", "http://minio:80", "http://[::1]:9000/"]


class _Stop(Exception):
    pass


@functools.lru_cache(maxsize=None)
def _client(settings):
    client = s3.make_client(settings, retries=1)
    seen = {}

    def capture(request, **_):
        seen.update(method=request.method, url=request.url, headers=dict(request.headers))
        raise _Stop()
    client.meta.events.register("before-send.s3", capture)
    return client, seen


def botocore_request(settings, operation, **params):
    """(method, url, headers) of the request botocore would send (not sent)."""
    client, seen = _client(settings)
    with pytest.raises(_Stop):
        getattr(client, operation)(**params)
    return seen["method"], seen["url"], {k: v.decode() if isinstance(v, bytes) else v
                                         for k, v in seen["headers"].items()}


def when(headers) -> datetime.datetime:
    return datetime.datetime.strptime(headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("operation,method,query", [("delete_object", "DELETE", ""), ("head_object", "HEAD", ""),
                                                    ("get_object_tagging", "GET", "tagging=")])
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////wEaDAb+token/with=odd&chars"])
def test_delete_head_and_tagging_equal_botocore(endpoint, key, operation, method, query, token):
    settings = S3Settings(endpoint, "AKIDEXAMPLE", SECRET, "eu-west-2", token)
    b_method, url, headers = botocore_request(settings, operation, Bucket="my-bucket", Key=key)
    lean = s3.LeanClient(settings)
    path = lean.path("my-bucket", key)
    assert (method, s3.urllib.parse.urlsplit(url).path) == (b_method, path)
    # botocore sends "?tagging", canonically "tagging=" (signed alike; ours sends the latter)
    assert s3.urllib.parse.urlsplit(url).query == query.rstrip("=")
    ours = lean.sign(method, path, {}, b"", now=when(headers), query=query)
    assert ours["authorization"] == headers["Authorization"]
    assert ours["x-amz-content-sha256"] == headers["X-Amz-Content-SHA256"]
    assert ours.get("x-amz-security-token") == headers.get("X-Amz-Security-Token")


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("key", KEYS[:4])
@pytest.mark.parametrize("body", [b"", b"hello\n", bytes(range(256)) * 64])
def test_put_signature_equals_botocore_signer(endpoint, key, body):
    # botocore's PutObject adds a CRC32 header of its own; the signer itself is compared
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    settings = S3Settings(endpoint, "AKIDEXAMPLE", SECRET, "us-east-1")
    lean = s3.LeanClient(settings)
    path = lean.path("b", key)
    _, url, _ = botocore_request(settings, "put_object", Bucket="b", Key=key, Body=body)
    assert s3.urllib.parse.urlsplit(url).path == path
    extra = {"content-type": "text/plain", "x-amz-tagging": s3._tagging({"stage": "raw", "a b": "c&d"})}
    request = AWSRequest(method="PUT", url=url, headers=dict(extra), data=body)
    S3SigV4Auth(Credentials("AKIDEXAMPLE", SECRET), "s3", "us-east-1").add_auth(request)
    ours = lean.sign("PUT", path, extra, body, now=when(request.headers))
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-content-sha256"] == request.headers["X-Amz-Content-SHA256"]


def test_error_answers_carry_botocore_codes():
    e = s3.LeanClient._error("DELETE", 403, b"<?xml version='1.0'?><Error><Code>AccessDenied</Code>"
                                               b"<Message>Access Denied.</Message></Error>")
    assert s3.error_code(e) == "AccessDenied" and e.status == 403
    assert s3.error_code(s3.LeanClient._error("HEAD", 404, b"")) == "404"
    assert s3.error_code(s3.LeanClient._error("PUT", 502, b"<html>bad gateway")) == "502"


def test_needs_endpoint_and_static_keys():
    with pytest.raises(ValueError):
        s3.LeanClient(S3Settings(None, "a", "b", "us-east-1"))
    with pytest.raises(ValueError):
        s3.LeanClient(S3Settings("http://h:1", None, None, "us-east-1"))


class FakeS3:
    """A local HTTP/1.1 server answering DELETEs, GETs and HEADs from a script of (status,
    body, close[, headers]): ``close`` ends the connection after the answer without saying
    so (a server's idle timeout on a kept-alive connection)."""

    def __init__(self, script):
        import http.server
        import threading
        self.script, self.seen, self.connections = list(script), [], 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                fake.connections += 1

            def do_DELETE(self):
                fake.seen.append((self.path, self.headers["Authorization"]))
                status, body, close, *headers = fake.script.pop(0) if fake.script else (204, b"", False)
                self.send_response(status)
                for name, value in (headers[0] if headers else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.close_connection = close

            do_GET = do_HEAD = do_DELETE

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.settings = S3Settings(f"http://127.0.0.1:{self.server.server_address[1]}", "AK", SECRET, "us-east-1")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_retries_throttling_and_server_errors_then_gives_up(monkeypatch):
    monkeypatch.setattr(s3lean.time, "sleep", lambda s: None)  # botocore's backoff, not waited here
    slow = (503, b"<Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>", False)
    fake = FakeS3([slow, (500, b"", False)])
    try:
        lean = s3.LeanClient(fake.settings, attempts=3)
        lean.delete_object(Bucket="b", Key="k")                   # third try answers
        assert len(fake.seen) == 3
        fake.script = [slow] * 3
        with pytest.raises(s3.S3Error) as e:
            lean.delete_object(Bucket="b", Key="k")
        assert e.value.code == "SlowDown" and len(fake.seen) == 6
        fake.script = [(403, b"<Error><Code>AccessDenied</Code></Error>", False)]
        with pytest.raises(s3.S3Error) as e:                       # not retried
            lean.delete_object(Bucket="b", Key="k")
        assert e.value.code == "AccessDenied" and len(fake.seen) == 7
    finally:
        fake.close()


def test_keeps_connections_alive_and_replaces_closed_ones():
    fake = FakeS3([(204, b"", False), (204, b"", True), (204, b"", False)])
    try:
        lean = s3.LeanClient(fake.settings, attempts=1)
        for _ in range(3):
            lean.delete_object(Bucket="b", Key="a b")
        assert fake.connections == 2 and len(fake.seen) == 3   # one try each: none failed
        assert fake.seen[0][0] == "/b/a%20b"
        lean.close()
    finally:
        fake.close()


NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def tagging_xml(*tags: tuple[str, str]) -> bytes:
    """A GetObjectTagging answer as MinIO and S3 write it (escaped, namespaced)."""
    from xml.sax.saxutils import escape
    body = "".join(f"<Tag><Key>{escape(k)}</Key><Value>{escape(v)}</Value></Tag>" for k, v in tags)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<Tagging {NS}><TagSet>{body}</TagSet></Tagging>'.encode()


SPECIAL_TAGS = [("a b", "c d"), ("ünï", "cödé ✓"), ("amp&lt<gt>", "x&y<z>"), ("plus+", "1+1=2"),
                ("quote'\"", " lead and trail "), ("empty", "")]


def test_tag_sets_parse_like_botocore():
    from botocore.parsers import RestXMLParser
    from botocore.session import get_session
    shape = get_session().get_service_model("s3").operation_model("GetObjectTagging").output_shape

    def botocore_parse(data: bytes) -> list:
        return RestXMLParser().parse({"body": data, "headers": {}, "status_code": 200}, shape)["TagSet"]
    for data in (tagging_xml(*SPECIAL_TAGS), tagging_xml(), tagging_xml(("k", "v")),
                 f"<Tagging {NS}><TagSet/></Tagging>".encode(),
                 b"<Tagging><TagSet><Tag><Key>k</Key><Value/></Tag></TagSet></Tagging>",
                 "<Tagging><TagSet><Tag><Key>k&#233;</Key><Value>&#x2713;</Value></Tag></TagSet></Tagging>"
                 .encode("utf-8")):
        assert s3._parse_tag_set(data) == botocore_parse(data), data
    assert s3._parse_tag_set(tagging_xml(*SPECIAL_TAGS)) == [{"Key": k, "Value": v} for k, v in SPECIAL_TAGS]


@pytest.mark.parametrize("data", [
    b"", b"<html>bad gateway", b"<Error><Code>AccessDenied</Code></Error>",
    b"<Tagging><TagSet><Tag><Value>v</Value></Tag></TagSet></Tagging>",
    # an external entity is never fetched (expat leaves it undefined)
    b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
    b"<Tagging><TagSet><Tag><Key>k</Key><Value>&x;</Value></Tag></TagSet></Tagging>",
    # nor are entities expanded without bound
    b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
    b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">'
    b'<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">'
    b'<!ENTITY g "&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;"><!ENTITY h "&g;&g;&g;&g;&g;&g;&g;&g;&g;&g;">]>'
    b"<Tagging><TagSet><Tag><Key>k</Key><Value>&h;</Value></Tag></TagSet></Tagging>",
])
def test_malformed_tag_answers_are_errors(data):
    with pytest.raises(s3.S3Error) as e:
        s3._parse_tag_set(data)
    assert e.value.code == "MalformedResponse"


def test_tagging_requests_and_errors_as_for_boto3(monkeypatch):
    monkeypatch.setattr(s3lean.time, "sleep", lambda s: None)
    missing = (404, b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>", False)
    denied = (403, b"<Error><Code>AccessDenied</Code></Error>", False)
    slow = (503, b"<Error><Code>SlowDown</Code></Error>", False)
    fake = FakeS3([(200, tagging_xml(*SPECIAL_TAGS), False), (200, tagging_xml(), False), missing, denied,
                   slow, (500, b"", False), (200, tagging_xml(("k", "v")), False)])
    try:
        lean = s3.LeanClient(fake.settings, attempts=3)
        assert s3.get_object_tags(lean, "b", "dir/a b+c") == dict(SPECIAL_TAGS)
        assert fake.seen[0][0] == "/b/dir/a%20b%2Bc?tagging="
        assert s3.get_object_tags(lean, "b", "k") == {}          # no tags
        assert s3.get_object_tags(lean, "b", "k") is None        # gone
        with pytest.raises(s3.S3Error) as e:                     # refused: raised, not retried
            s3.get_object_tags(lean, "b", "k")
        assert e.value.code == "AccessDenied" and len(fake.seen) == 4
        assert s3.get_object_tags(lean, "b", "k") == {"k": "v"}  # third try answers
        assert len(fake.seen) == 7
    finally:
        fake.close()


def test_handler_reader_is_lean_with_static_keys_only():
    headers = {"ETag": '"e"', "X-Amz-Meta-Kind": "k1", "x-amz-meta-Other": "o"}
    fake = FakeS3([(200, tagging_xml(("kind", "k1")), False), (200, b"", False, headers),
                   (404, b"", False)])

    def no_boto3():
        raise AssertionError("boto3 made for a per-object request")
    try:
        reader = s3.BucketReader.from_settings(fake.settings)
        reader._client_factory = no_boto3
        assert reader.tags("b", "k") == {"kind": "k1"}
        assert reader.metadata("b", "k") == {"kind": "k1", "other": "o"}
        assert reader.metadata("b", "gone") is None
        assert [p for p, _ in fake.seen] == ["/b/k?tagging=", "/b/k", "/b/gone"]
    finally:
        fake.close()
    for settings in (S3Settings(None, "AK", SECRET, "us-east-1"),             # AWS, no endpoint
                     S3Settings("http://127.0.0.1:1", None, None, "us-east-1")):  # a profile or role
        reader = s3.BucketReader.from_settings(settings)
        assert reader._lean is None
        reader._client_factory = lambda: "boto3"
        assert reader.object_client == "boto3"


def test_a_range_the_pinned_version_lacks_is_a_change_not_an_io_error():
    """A ranged GET pinned to an ETag that gets fewer bytes (or 416): the size the mount
    knew of that version is wrong — ``Changed``, so the read asks S3 again, never EIO."""
    from delvefs.client.mount.errors import Changed, store_error
    for status in (206, 416):
        err = store_error(s3.S3Error("InvalidRange", status, "0 bytes for the range 0-9"), "GET b/k")
        assert isinstance(err, Changed) and "size" in str(err)
