"""`delvefs notify` against real stores: it adds, updates and removes only its own rule
(Id `delvefs`) of a bucket's notification configuration, for MinIO's AMQP target and for an
SQS queue ARN (moto, the AWS side), and every rule of other consumers survives."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from delvefs.devtools.localservices import MotoServer, ServiceError
from delvefs.shared import s3 as s3api
from tests.conftest import service_unavailable

DELVEFS = str(Path(sys.executable).parent / "delvefs")
EVENTS = {"s3:ObjectCreated:*", "s3:ObjectRemoved:*"}


def notify(*args, env=None):
    return subprocess.run([DELVEFS, "notify", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def configuration(client, bucket) -> dict:
    conf = client.get_bucket_notification_configuration(Bucket=bucket)
    conf.pop("ResponseMetadata", None)
    return conf


def rule(conf: dict, kind: str, rule_id: str) -> dict | None:
    return next((r for r in conf.get(kind, ()) if r["Id"] == rule_id), None)


def test_notify_keeps_the_rules_of_other_consumers_on_minio(s3, service_env):
    bucket = f"n-{uuid.uuid4().hex[:10]}"
    s3api.ensure_bucket(s3, bucket)
    arn = service_env["DELVEFS_NOTIFY_ARN"]
    # another consumer of the store's (only) target: its own Id, events and filter
    other = {"Id": "access-log", "QueueArn": arn, "Events": ["s3:ObjectAccessed:Get"],
             "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": "logs/"}]}}}
    s3.put_bucket_notification_configuration(Bucket=bucket,
                                             NotificationConfiguration={"QueueConfigurations": [other]})
    out = notify(bucket)
    assert out.returncode == 0, out.stderr
    assert "1 rule of other consumers kept" in out.stdout
    conf = configuration(s3, bucket)
    ours = rule(conf, "QueueConfigurations", "delvefs")
    assert ours["QueueArn"] == arn and set(ours["Events"]) == EVENTS
    assert rule(conf, "QueueConfigurations", "access-log") == other
    # again (an update, not a second rule), then with the target named by --arn
    assert notify(bucket).returncode == 0 and notify(bucket, "--arn", arn).returncode == 0
    assert [r["Id"] for r in configuration(s3, bucket)["QueueConfigurations"]].count("delvefs") == 1
    out = notify(bucket, "--remove")
    assert out.returncode == 0, out.stderr
    assert configuration(s3, bucket) == {"QueueConfigurations": [other]}
    # errors are one line naming the bucket; an unknown target changes nothing
    bad = notify("no-such-bucket-x")
    assert bad.returncode == 1 and "no-such-bucket-x" in bad.stderr
    bad = notify(bucket, "--arn", "arn:minio:sqs::NOSUCH:amqp")
    assert bad.returncode == 1 and bucket in bad.stderr
    assert configuration(s3, bucket) == {"QueueConfigurations": [other]}


@pytest.fixture
def moto(tmp_path):
    server = MotoServer(tmp_path / "moto")
    try:
        server.start()
    except ServiceError as exc:
        service_unavailable(str(exc))
    yield server
    server.stop()


def test_notify_with_an_sqs_queue_arn_keeps_topic_function_and_queue_rules(moto):
    settings = s3api.S3Settings.from_env(moto.env())
    client = s3api.make_client(settings)
    bucket = f"n-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    sqs = s3api.make_sqs_client(f"{moto.endpoint}/123456789012/x", settings)
    ours_url = sqs.create_queue(QueueName="delvefs-events")["QueueUrl"]
    theirs_url = sqs.create_queue(QueueName="their-events")["QueueUrl"]
    ours_arn = s3api.sqs_attributes(sqs, ours_url)["QueueArn"]
    theirs_arn = s3api.sqs_attributes(sqs, theirs_url)["QueueArn"]
    others = {
        "QueueConfigurations": [{"Id": "theirs", "QueueArn": theirs_arn, "Events": ["s3:ObjectRemoved:*"]}],
        "TopicConfigurations": [{"Id": "topic", "TopicArn": "arn:aws:sns:us-east-1:123456789012:t",
                                 "Events": ["s3:ObjectCreated:Put"]}],
        "LambdaFunctionConfigurations": [{"Id": "fn", "LambdaFunctionArn":
                                          "arn:aws:lambda:us-east-1:123456789012:function:f",
                                          "Events": ["s3:ObjectCreated:Copy"]}],
    }
    client.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=others)
    env = moto.env()
    out = notify(bucket, "--arn", ours_arn, env=env)
    assert out.returncode == 0, out.stderr
    conf = configuration(client, bucket)
    ours = rule(conf, "QueueConfigurations", "delvefs")
    assert ours["QueueArn"] == ours_arn and set(ours["Events"]) == EVENTS
    for kind, rules in others.items():
        for other in rules:
            assert rule(conf, kind, other["Id"]) == other
    # the target from the environment, as the SQS event source's setup does
    out = notify(bucket, env={**env, "DELVEFS_NOTIFY_ARN": ours_arn})
    assert out.returncode == 0, out.stderr
    assert [r["Id"] for r in configuration(client, bucket)["QueueConfigurations"]].count("delvefs") == 1
    assert notify(bucket, "--remove", env=env).returncode == 0
    assert configuration(client, bucket) == others
