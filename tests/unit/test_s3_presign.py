"""``delvefs.shared.s3.presign_list_url`` (SigV4 without botocore) signs exactly like boto3."""
import datetime
import urllib.parse

import pytest

from delvefs.shared import s3
from delvefs.shared.config import S3Settings


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000", "https://s3.example.org",
                                      "http://minio:80", "https://h.example:8443/", "http://[::1]:9000"])
@pytest.mark.parametrize("region", ["us-east-1", "eu-west-2"])
@pytest.mark.parametrize("bucket", ["bench-many", "a.b-c"])
def test_presign_matches_boto3(endpoint, region, bucket):
    settings = S3Settings(endpoint, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region)
    url = s3.presigned_list_url(s3.make_client(settings), bucket)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    when = datetime.datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc)
    ours = s3.presign_list_url(settings, bucket, now=when)
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(ours).query) == query
    assert urllib.parse.urlsplit(ours)[:3] == urllib.parse.urlsplit(url)[:3]


def test_presign_needs_endpoint_and_static_keys():
    assert s3.presign_list_url(S3Settings(None, "a", "b", "us-east-1"), "x") is None
    assert s3.presign_list_url(S3Settings("http://h:1", None, None, "us-east-1"), "x") is None


@pytest.mark.parametrize("token", ["FwoGZXIvYXdzEJr//////////wEaDAb+token/with=odd&chars",
                                   "eyJhbGciOiJIUzUxMiIsInR5cCI6IkpXVCJ9." + "x" * 600])
def test_presign_with_session_token_matches_boto3(token):
    # temporary (STS) credentials: the token is a signed query parameter
    settings = S3Settings("http://127.0.0.1:9000", "ASIAEXAMPLE",
                          "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "us-east-1", token)
    url = s3.presigned_list_url(s3.make_client(settings), "bucket")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["X-Amz-Security-Token"] == [token]
    when = datetime.datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc)
    ours = s3.presign_list_url(settings, "bucket", now=when)
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(ours).query) == query
