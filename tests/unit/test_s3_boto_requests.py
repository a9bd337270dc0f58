"""The requests the boto3 client of ``delvefs.shared.s3.make_client`` sends for uploads: no
`Expect: 100-continue` (a round trip asking whether to send the body, before every
PutObject and UploadPart). The requests are caught before they are sent (botocore's
``before-send`` event answers them), so no store is needed."""
from __future__ import annotations

import pytest

from delvefs.shared import s3
from delvefs.shared.config import S3Settings

SETTINGS = S3Settings("http://127.0.0.1:9", "key", "secret", "us-east-1")


@pytest.fixture
def sent():
    """The client and the headers of each request it sent (answered 200 at once)."""
    from botocore.awsrequest import AWSResponse

    client = s3.make_client(SETTINGS, retries=1)
    requests: list[dict] = []

    def answer(request, **_):
        requests.append({k.lower(): v.decode() if isinstance(v, bytes) else v
                         for k, v in request.headers.items()})
        body = b"<InitiateMultipartUploadResult><UploadId>u</UploadId></InitiateMultipartUploadResult>"
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _Raw(body))
    client.meta.events.register("before-send.s3", answer)
    return client, requests


class _Raw:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


@pytest.mark.parametrize("size", [0, 10, 3 << 20])
def test_puts_and_parts_send_their_body_without_asking_first(sent, tmp_path, size):
    client, requests = sent
    path = tmp_path / "f"
    path.write_bytes(b"x" * size)
    s3.put_file(client, "b", "k", str(path), tags={"stage": "raw"}, base="")
    s3.upload_part(client, "b", "k", "u", 1, str(path), 0, size)
    assert len(requests) == 2
    assert [h.get("expect") for h in requests] == [None, None]
    assert requests[0]["if-none-match"] == "*" and requests[0]["x-amz-tagging"] == "stage=raw"
