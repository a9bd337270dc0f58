"""Who sees what, against real MinIO, RabbitMQ and handler processes (docs/API.md, "Who
sees what"): principals with tokens of their own, S3 users of different rights (temporary
credentials from MinIO's STS AssumeRole with a session policy), forged, foreign and expired
proofs, revocation without restart, malformed requests, the refusal to serve a non-loopback
address unauthenticated, TLS, and a mount that renews and re-presents its proofs."""
from __future__ import annotations

import datetime
import http.client
import http.server
import json
import os
import subprocess
import threading
import time
import urllib.parse
import uuid

import httpx
import pytest

from delvefs.client.handler.api import HandlerError, SyncHandlerClient
from delvefs.client.handler.endpoints import register_request
from delvefs.devtools.localservices import free_port
from delvefs.shared import s3 as s3mod
from delvefs.shared.config import S3Settings
from eventhandler.auth import add_principal
from eventhandler.devtools import VENV_BIN, HandlerGroup, Publisher, spec
from rulesets.model import view_id

from ..waiting import wait_until
from .mounts import CHANGE_TIMEOUT, data_views, handler, mounts  # noqa: F401  (fixtures)

pytestmark = pytest.mark.services


@pytest.fixture
def start_handler(services, service_env, tmp_path):
    """Starts handlers whose state dir holds principals alice and bob (tokens in ``.tokens``);
    ``test-token`` is the principal ``default``."""
    group = HandlerGroup(service_env, services.rabbit.url)

    def start(**options):
        state = tmp_path / f"state{len(group.started)}"
        tokens = {name: add_principal(state / "principals.json", name) for name in ("alice", "bob")}
        h = group.start(state, **options)
        h.tokens = tokens
        return h

    yield start
    group.close()


def client(h, token) -> SyncHandlerClient:
    return SyncHandlerClient(h.url, token, timeout=30)


def restricted(policy: dict) -> S3Settings:
    """Temporary credentials of the service's root user, limited by ``policy``: an S3 user
    with just these rights."""
    import boto3
    root = S3Settings.from_env()
    creds = boto3.client("sts", endpoint_url=root.endpoint_url, region_name=root.region,
                         aws_access_key_id=root.access_key, aws_secret_access_key=root.secret_key
                         ).assume_role(RoleArn="arn:xxx:xxx:xxx:xxxx", RoleSessionName="delvefs-test",
                                       Policy=json.dumps(policy), DurationSeconds=900)["Credentials"]
    return S3Settings(root.endpoint_url, creds["AccessKeyId"], creds["SecretAccessKey"], root.region,
                      creds["SessionToken"])


NO_S3_RIGHTS = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::no-such-bucket-here/*"]}]}


def list_rights(bucket: str, prefix: str) -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
         "Condition": {"StringLike": {"s3:prefix": [prefix + "*"]}}},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"]}]}


def proof(settings_or_client, bucket, prefix="", principal="alice", **kw) -> str:
    if isinstance(settings_or_client, S3Settings):
        return s3mod.presign_list_url(settings_or_client, bucket, prefix=prefix, principal=principal, **kw)
    return s3mod.presigned_list_url(settings_or_client, bucket, prefix=prefix, principal=principal, **kw)


def register(c: SyncHandlerClient, views: dict, proofs: dict) -> httpx.Response:
    return c.response(register_request("test", [{"name": n, "spec": s} for n, s in views.items()], proofs))


def test_a_token_without_s3_rights_reads_nothing_of_anothers_view(start_handler, s3, bucket):
    h = start_handler()
    alice, bob = client(h, h.tokens["alice"]), client(h, h.tokens["bob"])
    runs = spec(bucket, object="runs/*.fastq")
    r = register(alice, {"runs": runs}, {bucket: proof(s3, bucket, "runs/", "alice")})
    assert r.status_code == 200, r.text
    vid = r.json()["views"][0]["id"]
    assert vid == view_id(runs)  # anyone can compute the id of a spec
    s3.put_object(Bucket=bucket, Key="runs/a.fastq", Body=b"x", Metadata={"sample": "secret-1"})
    wait_until(lambda: set(alice.list_all(vid)[1]) == {"runs/a.fastq"}, 30, "alice lists her view")
    version = alice.list_all(vid)[0]
    assert alice.http.get(f"/v1/objects/{bucket}/runs/a.fastq").json()["metadata"] == {"sample": "secret-1"}

    def nothing_for_bob():
        # answered exactly as what does not exist
        unknown_id, missing = "0123456789abcdef", "runs/missing.fastq"
        for path, params, real, fake in (
                (f"/v1/views/{vid}/objects", {}, vid, unknown_id),
                (f"/v1/views/{vid}/changes", {"since": version}, vid, unknown_id),
                (f"/v1/views/{vid}/stream", {"since": version}, vid, unknown_id),
                (f"/v1/objects/{bucket}/runs/a.fastq", {}, "runs/a.fastq", missing)):
            r = bob.http.get(path, params=params)
            assert r.status_code == 404 and r.json()["error"] == "not_found", (path, r.text)
            assert r.text.replace(real, fake) == bob.http.get(path.replace(real, fake), params=params).text
            assert "secret" not in r.text
        assert bob.http.post("/v1/reconcile", params={"bucket": bucket}).status_code == 404
        health = bob.health()
        assert health["principal"] == "bob" and health["views"] == 0 and bucket not in health["buckets"]

    nothing_for_bob()
    # bob's own proof: his credentials may not list the bucket, so the store refuses it
    no_rights = restricted(NO_S3_RIGHTS)
    r = bob.http.post("/v1/proofs", json={"proof": {bucket: proof(no_rights, bucket, "runs/", "bob")}})
    assert r.status_code == 403 and "refused" in r.json()["message"], r.text
    assert register(bob, {"mine": runs}, {bucket: proof(no_rights, bucket, "runs/", "bob")}).status_code == 403
    assert register(bob, {"mine": runs}, {}).status_code == 403
    # alice's proof, presented by bob: bound to alice
    r = bob.http.post("/v1/proofs", json={"proof": {bucket: proof(s3, bucket, "runs/", "alice")}})
    assert r.status_code == 403 and "bound to principal 'alice'" in r.json()["message"], r.text
    # nor does a URL bound to bob but signed with bob's (missing) rights change anything
    nothing_for_bob()
    # /healthz without a token: the status only
    assert set(httpx.get(h.url + "/healthz").json()) == {"status"}
    assert set(alice.list_all(vid)[1]) == {"runs/a.fastq"}  # alice is unaffected


def test_prefix_rights_grant_what_is_under_the_prefix_only(start_handler, s3, bucket):
    for key in ("runs/a.fastq", "other/b.fastq"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    h = start_handler()
    default, bob = h.api, client(h, h.tokens["bob"])
    r = register(default, {"runs": spec(bucket, object="runs/*"), "all": spec(bucket)},
                 {bucket: proof(s3, bucket, "", "default")})
    assert r.status_code == 200, r.text
    ids = {v["name"]: v["id"] for v in r.json()["views"]}
    wait_until(lambda: len(default.list_all(ids["all"])[1]) == 2, 30, "scan")
    runs_only = restricted(list_rights(bucket, "runs/"))
    # bob may list runs/ (the store says so), not the whole bucket
    r = bob.http.post("/v1/proofs", json={"proof": {bucket: proof(runs_only, bucket, "", "bob")}})
    assert r.status_code == 403
    r = bob.http.post("/v1/proofs", json={"proof": {bucket: proof(runs_only, bucket, "runs/", "bob")}})
    assert r.status_code == 200, r.text
    assert r.json()["grants"][0]["prefix"] == "runs/"
    assert set(bob.list_all(ids["runs"])[1]) == {"runs/a.fastq"}
    assert bob.http.get(f"/v1/views/{ids['all']}/objects").status_code == 404
    assert bob.http.get(f"/v1/objects/{bucket}/runs/a.fastq").status_code == 200
    assert bob.http.get(f"/v1/objects/{bucket}/other/b.fastq").status_code == 404
    r = bob.http.get(f"/v1/objects/{bucket}/runs/a.fastq").json()
    assert r["views"] == [ids["runs"]]  # the ids of views bob may read only
    assert bob.health()["buckets"] == {bucket: "ready"}
    assert bob.http.post("/v1/reconcile", params={"bucket": bucket}).status_code == 404  # not all of it


class AnswersEverything(http.server.BaseHTTPRequestHandler):
    """An attacker's server: 200 to anything (it counts what it got)."""
    requests: list[str] = []

    def do_GET(self):  # noqa: N802
        AnswersEverything.requests.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_proof_pointing_elsewhere_is_refused_without_a_request(start_handler, s3, bucket):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AnswersEverything)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        h = start_handler()
        alice = client(h, h.tokens["alice"])
        good = proof(s3, bucket, "", "alice")
        parts = urllib.parse.urlsplit(good)
        evil = f"127.0.0.1:{server.server_port}"
        forged = [parts._replace(netloc=evil).geturl(),                         # another host
                  parts._replace(netloc=f"{parts.netloc}@{evil}").geturl(),     # user-info trick
                  parts._replace(scheme="https").geturl(),
                  parts._replace(path=f"/{bucket}/x").geturl(),
                  f"http://{evil}/{bucket}?list-type=2&max-keys=0&x-delvefs-principal=alice"]
        for url in forged:
            r = alice.http.post("/v1/proofs", json={"proof": {bucket: url}})
            assert r.status_code == 403 and r.json()["error"] == "forbidden", (url, r.text)
            r = register(alice, {"v": spec(bucket)}, {bucket: url})
            assert r.status_code == 403, (url, r.text)
        assert AnswersEverything.requests == []  # the handler relayed nothing
        assert alice.http.post("/v1/proofs", json={"proof": {bucket: good}}).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_a_proof_made_with_a_plain_boto3_client_is_taken(start_handler, s3, bucket):
    # docs/API.md's way "with boto3": a client as boto3 makes it from the environment, no
    # Config (botocore would presign SigV2, which the handler refuses)
    import boto3
    s3.put_object(Bucket=bucket, Key="runs/a.fastq", Body=b"x")
    h = start_handler()
    alice = client(h, h.tokens["alice"])
    url = s3mod.presigned_list_url(boto3.client("s3"), bucket, prefix="runs/", principal="alice")
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url
    r = register(alice, {"runs": spec(bucket, object="runs/*")}, {bucket: url})
    assert r.status_code == 200, r.text
    vid = r.json()["views"][0]["id"]
    wait_until(lambda: set(alice.list_all(vid)[1]) == {"runs/a.fastq"}, 30, "alice lists her view")


def test_an_expired_proof_stops_granting(start_handler, s3, bucket):
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    h = start_handler()
    alice = client(h, h.tokens["alice"])
    short = proof(s3, bucket, "", "alice", expires=6)
    signed = datetime.datetime.strptime(dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(short).query))[
        "X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    r = register(alice, {"all": spec(bucket)}, {bucket: short})
    assert r.status_code == 200, r.text
    vid = r.json()["views"][0]["id"]
    wait_until(lambda: set(alice.list_all(vid)[1]) == {"k"}, 30, "listed")
    version = alice.list_all(vid)[0]
    # an open change stream ends with the grant
    with alice.http.stream("GET", f"/v1/views/{vid}/stream", params={"since": version},
                           timeout=httpx.Timeout(30)) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_lines():
            pass
    assert time.time() >= signed + 6 - 0.05  # the grant's end: the URL's expiry
    wait_until(lambda: alice.http.get(f"/v1/views/{vid}/objects").status_code == 403, 10, "expiry")
    r = alice.http.get(f"/v1/views/{vid}/objects")
    assert r.json()["error"] == "proof_expired" and r.json()["bucket"] == bucket
    assert alice.http.get(f"/v1/objects/{bucket}/k").json()["error"] == "proof_expired"
    assert alice.http.get(f"/v1/views/{vid}/changes", params={"since": version}).status_code == 403
    # the expired URL grants nothing any more
    r = alice.http.post("/v1/proofs", json={"proof": {bucket: short}})
    assert r.status_code == 403 and r.json()["error"] == "proof_expired"
    # a fresh one does, and a registration then needs none
    assert alice.http.post("/v1/proofs", json={"proof": {bucket: proof(s3, bucket, "", "alice")}}).status_code == 200
    assert set(alice.list_all(vid)[1]) == {"k"}
    assert register(alice, {"again": spec(bucket)}, {}).status_code == 200


def test_revocation_and_new_principals_apply_without_restart(start_handler, s3, bucket):
    h = start_handler()
    alice = client(h, h.tokens["alice"])
    assert alice.health()["principal"] == "alice"

    def principal(*args):
        return subprocess.run([str(VENV_BIN / "delvefs"), "principal", *args, "--state-dir", str(h.state_dir)],
                              capture_output=True, text=True, timeout=60)

    r = principal("revoke", "alice")
    assert r.returncode == 0, r.stderr
    with pytest.raises(HandlerError) as err:
        alice.health()
    assert err.value.status == 401
    assert alice.http.get("/v1/views/0123456789abcdef/objects").status_code == 401
    r = principal("add", "carol")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("carol.") and token not in (h.state_dir / "principals.json").read_text()
    assert client(h, token).health()["principal"] == "carol"
    assert [line.split("\t")[0] for line in principal("list").stdout.splitlines()] == ["bob", "carol"]
    assert h.api.health()["principal"] == "default"  # DELVEFS_HANDLER_TOKEN still counts
    assert h.proc.poll() is None


def raw_request(h, method: str, target: str, headers: dict | None = None, body: bytes = b""):
    """One request sent as given (bytes headers, raw percent-encoding); (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=30)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_malformed_requests_are_4xx_and_the_handler_stays_up(start_handler, s3, bucket):
    h = start_handler()
    token = f"Bearer {h.token}".encode()
    r = register(h.api, {"all": spec(bucket)}, {bucket: proof(s3, bucket, "", "default")})
    assert r.status_code == 200, r.text
    vid = r.json()["views"][0]["id"]
    wait_until(lambda: h.http.get(f"/v1/views/{vid}/objects").status_code == 200, 30, "scan")
    view = f"/v1/views/{vid}"
    big = json.dumps({"views": [{"name": f"v{i}", "spec": {"bucket": bucket}} for i in range(1001)]}).encode()
    cases = [
        # tokens
        ("GET", f"{view}/objects", {}, b"", 401),
        ("GET", f"{view}/objects", {"Authorization": b"Basic dXNlcjpwdw=="}, b"", 401),
        ("GET", f"{view}/objects", {"Authorization": b"Bearer "}, b"", 401),
        ("GET", f"{view}/objects", {"Authorization": "Bearer café".encode()}, b"", 401),
        ("GET", f"{view}/objects", {"Authorization": b"Bearer \xff\xfe"}, b"", 401),
        ("GET", f"{view}/objects", {"Authorization": b"Bearer wrong-token"}, b"", 401),
        ("GET", "/healthz", {"Authorization": b"Bearer \xc3\xa9"}, b"", 401),
        # ids
        ("GET", "/v1/views/xyz/objects", {}, b"", 400),
        ("GET", "/v1/views/ABCDEF0123456789/objects", {}, b"", 400),
        ("GET", f"/v1/views/{vid}0/changes?since=1", {}, b"", 400),
        ("GET", "/v1/views/%FF%FE/objects", {}, b"", 400),
        # since
        *[("GET", f"{view}/changes?since={v}", {}, b"", 400)
          for v in ("-1", str(2**64), "abc", "1e3", "", "0x10", "%FF")],
        *[("GET", f"{view}/stream?since={v}", {}, b"", 400) for v in ("-1", str(2**64), "x")],
        ("GET", f"{view}/stream", {"Last-Event-ID": b"\xff\xfe"}, b"", 400),
        ("GET", f"{view}/stream", {"Last-Event-ID": b"-5"}, b"", 400),
        # limit, wait, after
        *[("GET", f"{view}/objects?limit={v}", {}, b"", 400) for v in ("0", "-5", "many", "1" * 40)],
        *[("GET", f"{view}/objects?wait={v}", {}, b"", 400) for v in ("-1", "nan", "inf", "-inf", "1e999", "soon")],
        *[("GET", f"{view}/changes?since=1&wait={v}", {}, b"", 400) for v in ("-0.5", "NaN", "Infinity")],
        ("GET", f"{view}/objects?after=%FF", {}, b"", 400),
        ("GET", f"{view}/objects?after=" + "k" * 1025, {}, b"", 400),
        # bodies
        ("POST", "/v1/views", {}, b"not json", 400),
        ("POST", "/v1/views", {}, b"[]", 400),
        ("POST", "/v1/views", {}, b'{"views": "x"}', 400),
        ("POST", "/v1/views", {}, b'{"views": [1]}', 400),
        ("POST", "/v1/views", {}, b'{"views": [{"name": 5, "spec": {}}]}', 400),
        ("POST", "/v1/views", {}, b'{"views": [{"name": "", "spec": {"bucket": "abc"}}]}', 400),
        ("POST", "/v1/views", {}, b'{"views": [{"name": "v", "spec": {"bucket": 7}}]}', 400),
        ("POST", "/v1/views", {}, b'{"views": [{"name": "v", "spec": {"bucket": "Bad Bucket!"}}]}', 400),
        ("POST", "/v1/views", {}, b'{"views": [{"name": "v", "spec": {"bucket": "abc", "size": {}}}]}', 400),
        ("POST", "/v1/views", {}, b'{"views": [], "proof": "x"}', 400),
        ("POST", "/v1/views", {}, b'{"views": [], "proof": {"b!": "u"}}', 400),
        ("POST", "/v1/views", {}, b'{"views": [], "proof": {"abc": 5}}', 400),
        ("POST", "/v1/views", {}, b"[" * 5000 + b"]" * 5000, 400),
        ("POST", "/v1/views", {}, big, 400),
        ("POST", "/v1/views", {}, b"x" * (2 << 20), 413),
        ("POST", "/v1/views", {"Content-Type": b"application/msgpack"}, b"\xc1", 400),
        ("POST", "/v1/proofs", {}, b"{}", 400),
        ("POST", "/v1/proofs", {}, json.dumps({"proof": {bucket: ["u"] * 65}}).encode(), 400),
        ("POST", "/v1/proofs", {}, json.dumps({"proof": {bucket: "http://x/" + "a" * 9000}}).encode(), 403),
        # keys and bucket names
        ("GET", f"/v1/objects/{bucket}/%FF", {}, b"", 400),
        ("GET", f"/v1/objects/{bucket}/a%C3", {}, b"", 400),
        ("GET", f"/v1/objects/{bucket}/" + "k" * 1025, {}, b"", 400),
        ("GET", f"/v1/objects/{bucket}/" + "%C3%A9" * 513, {}, b"", 400),
        ("GET", "/v1/objects/Bad!Bucket/k", {}, b"", 400),
        ("GET", "/v1/objects/ab/k", {}, b"", 400),
        ("POST", "/v1/reconcile?bucket=no!", {}, b"", 400),
    ]
    for method, target, headers, body, expected in cases:
        if "Authorization" not in headers and expected != 401:
            headers = {**headers, "Authorization": token}
        status, answer = raw_request(h, method, target, headers, body)
        assert status == expected, (method, target[:80], headers, status, answer[:300])
        if status != 413:
            assert json.loads(answer)["error"], answer
        assert h.proc.poll() is None
    assert h.api.health()["status"] == "ok"
    assert set(h.api.list_all(vid)[1]) == set()  # still serving
    log = h.log_path.read_text()
    assert "Traceback" not in log, h.log_tail()


def test_refuses_to_serve_beyond_loopback_without_authentication(services, service_env, tmp_path):
    env = {**os.environ, **service_env, "DELVEFS_AMQP_QUEUE": f"h-{uuid.uuid4().hex[:10]}"}
    env.pop("DELVEFS_HANDLER_TOKEN", None)
    port = free_port()
    cmd = [str(VENV_BIN / "delvefs"), "eventhandler", "--state-dir", str(tmp_path / "state"),
           "--listen", f"0.0.0.0:{port}"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to serve 0.0.0.0 without authentication" in r.stderr, r.stderr
    assert "delvefs principal add" in r.stderr
    # --allow-unauthenticated: served, with a warning
    log = tmp_path / "open.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd + ["--allow-unauthenticated"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "listening on" in log.read_text() or proc.poll() is not None, 30, "listening")
        assert "NO AUTHENTICATION" in log.read_text()
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json()
        assert health["principal"] == "default"  # everyone is the one principal
    finally:
        proc.terminate()
        proc.wait(30)
        pub = Publisher(services.rabbit.url)
        pub.delete_queue(env["DELVEFS_AMQP_QUEUE"])
        pub.close()


def test_tls(start_handler, s3, bucket, tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("DELVEFS_HANDLER_CA", str(cert))
    h = start_handler(tls=(cert, key))
    assert h.url.startswith("https://")
    r = register(h.api, {"all": spec(bucket)}, {bucket: proof(s3, bucket, "", "default")})
    assert r.status_code == 200, r.text
    monkeypatch.delenv("DELVEFS_HANDLER_CA")
    with pytest.raises(HandlerError):  # not a CA this client trusts
        client(h, h.token).health()
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on that port
        httpx.get(f"http://127.0.0.1:{h.port}/healthz", timeout=10)


def registrations(handler) -> int:
    """How many registration requests the handler's log shows (one line each)."""
    return sum(1 for line in handler.log_path.read_text().splitlines()
               if "(client " in line and ") registered " in line)


def renewals(handler) -> int:
    return sum(1 for line in handler.log_path.read_text().splitlines()
               if " renewed its proofs for " in line)


@pytest.mark.fuse
def test_a_mount_renews_its_proofs_before_they_expire(mounts, handler, s3, bucket):
    s3.put_object(Bucket=bucket, Key="data/a", Body=b"1")
    mnt = mounts.mount(data_views(bucket), env={**mounts.env, "DELVEFS_PROOF_LIFETIME": "10"})
    assert os.listdir(mnt / "data") == ["a"]
    # past the expiry of the registration's proofs: renewed at 5 s and 10 s, valid until 20 s
    wait_until(lambda: renewals(handler) >= 2, 30, "proofs renewed twice")
    s3.put_object(Bucket=bucket, Key="data/b", Body=b"2")
    wait_until(lambda: sorted(os.listdir(mnt / "data")) == ["a", "b"], CHANGE_TIMEOUT, "b listed")
    # renewed through POST /v1/proofs: the grants never lapsed, nothing was registered again
    assert registrations(handler) == 1


@pytest.mark.fuse
def test_a_mount_presents_its_proofs_again_after_a_restart_lost_them(mounts, handler, s3, bucket):
    s3.put_object(Bucket=bucket, Key="data/a", Body=b"1")
    mnt = mounts.mount(data_views(bucket))
    assert os.listdir(mnt / "data") == ["a"]
    assert handler.stop() == 0
    (handler.state_dir / "grants.json").unlink()  # as if they had expired meanwhile
    handler.start()
    s3.put_object(Bucket=bucket, Key="data/b", Body=b"2")
    wait_until(lambda: sorted(os.listdir(mnt / "data")) == ["a", "b"], CHANGE_TIMEOUT, "b listed")
    assert registrations(handler) == 2
    mount_log = (mounts.tmp / f"cache-{mounts.count}" / "mount.log").read_text()
    assert "presented new proofs" in mount_log
