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


@pytest.mark.parametrize("endpoint,region", [("http://127.0.0.1:9000", None), ("http://127.0.0.1:9000", "us-east-1"),
                                             (None, None), (None, "us-east-1"), (None, "eu-west-2")])
@pytest.mark.parametrize("bucket", ["bench-many", "a.b-c"])
def test_a_plain_boto3_client_makes_a_proof_the_handler_takes(endpoint, region, bucket):
    # boto3.client("s3") without a Config presigns S3 URLs with SigV2 and for AWS's global
    # endpoint; a proof is SigV4 at the endpoint of its region whatever the client's config
    import boto3

    from eventhandler.auth import parse_proof
    def plain_client():
        return boto3.client("s3", endpoint_url=endpoint, region_name=region, aws_access_key_id="AKIDEXAMPLE",
                            aws_secret_access_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    plain = plain_client()
    url = s3.presigned_list_url(plain, bucket, prefix="runs/", principal="alice", expires=600)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["x-delvefs-principal"] == ["alice"]
    when = datetime.datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    proof = parse_proof(url, bucket=bucket, principal="alice", endpoint=endpoint, now=when)
    assert (proof.bucket, proof.prefix, proof.until) == (bucket, "runs/", when + 600)
    # the client's other presigned URLs are as its config makes them (SigV2 in most regions)
    other, untouched = (c.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k"})
                        for c in (plain, plain_client()))
    assert urllib.parse.urlsplit(other)[:3] == urllib.parse.urlsplit(untouched)[:3]
    assert ("AWSAccessKeyId=" in other) == ("AWSAccessKeyId=" in untouched)
    assert "x-delvefs-principal" not in other
