"""``delvefs.shared.s3.LeanClient`` (DeleteObject, HeadObject, PutObject without botocore)
quotes keys and signs exactly like botocore."""
import datetime
import functools

import pytest

from delvefs.shared import s3
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
@pytest.mark.parametrize("operation,method", [("delete_object", "DELETE"), ("head_object", "HEAD")])
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEJr//////////wEaDAb+token/with=odd&chars"])
def test_delete_and_head_equal_botocore(endpoint, key, operation, method, token):
    settings = S3Settings(endpoint, "AKIDEXAMPLE", SECRET, "eu-west-2", token)
    b_method, url, headers = botocore_request(settings, operation, Bucket="my-bucket", Key=key)
    lean = s3.LeanClient(settings)
    path = lean.path("my-bucket", key)
    assert (method, s3.urllib.parse.urlsplit(url).path) == (b_method, path)
    ours = lean.sign(method, path, {}, b"", now=when(headers))
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
    """A local HTTP/1.1 server answering DELETEs from a script of (status, body, close):
    ``close`` ends the connection after the answer without saying so (a server's idle
    timeout on a kept-alive connection)."""

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
                status, body, close = fake.script.pop(0) if fake.script else (204, b"", False)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = close

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.settings = S3Settings(f"http://127.0.0.1:{self.server.server_address[1]}", "AK", SECRET, "us-east-1")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_retries_throttling_and_server_errors_then_gives_up(monkeypatch):
    monkeypatch.setattr(s3.time, "sleep", lambda s: None)  # botocore's backoff, not waited here
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
