"""The pure parts of the handler's access control (eventhandler/auth.py): which proof URLs
are accepted and what they grant, grants and their expiry, the principals file and tokens,
and the mount's choice of what to prove."""
from __future__ import annotations

import datetime
import json
import os
import stat
import urllib.parse
from pathlib import Path

import pytest

from delvefs.client.handler.proofs import proof_prefixes
from delvefs.shared import s3
from delvefs.shared.config import S3Settings, principal_of_token
from eventhandler.auth import (GRANTED, LAPSED, NONE, Authenticator, Grants, ProofRefused,
                               PrincipalsError, Unauthorized, add_principal, listen_is_loopback,
                               parse_proof, principals_path, read_principals, revoke_principal)
from rulesets.loader import load_views

ENDPOINT = "http://127.0.0.1:9000"
SIGNED = datetime.datetime(2030, 5, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
NOW = SIGNED.timestamp() + 10


def presign(endpoint=ENDPOINT, bucket="data", *, region="us-east-1", when=SIGNED, **kw) -> str:
    settings = S3Settings(endpoint, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", region)
    kw.setdefault("principal", "alice")
    return s3.presign_list_url(settings, bucket, now=when, **kw)


def check(url, *, bucket="data", principal="alice", endpoint=ENDPOINT, now=NOW):
    return parse_proof(url, bucket=bucket, principal=principal, endpoint=endpoint, now=now)


def with_query(url, **changes) -> str:
    """``url`` with query parameters replaced (None: removed), the rest as it was."""
    parts = urllib.parse.urlsplit(url)
    params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    for k, v in changes.items():
        k = k.replace("_", "-")
        if v is None:
            params.pop(k, None)
        else:
            params[k] = v
    return parts._replace(query=urllib.parse.urlencode(params, quote_via=urllib.parse.quote)).geturl()


# ---- what a valid proof grants

def test_a_proof_grants_its_bucket_and_prefix_until_it_expires():
    proof = check(presign(prefix="runs/2024/", expires=600))
    assert (proof.bucket, proof.prefix) == ("data", "runs/2024/")
    assert proof.until == SIGNED.timestamp() + 600


def test_a_proof_dated_ahead_grants_no_longer_than_its_lifetime():
    ahead = SIGNED + datetime.timedelta(seconds=200)
    proof = check(presign(when=ahead, expires=600))
    assert proof.until == NOW + 600  # not ahead + 600


def test_boto3_presigned_proof_is_accepted_and_equals_the_lean_one():
    settings = S3Settings(ENDPOINT, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "eu-west-2",
                          "session/token+x=")
    url = s3.presigned_list_url(s3.make_client(settings), "data", prefix="a b/", principal="alice")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True))
    assert query["x-delvefs-principal"] == "alice" and query["prefix"] == "a b/"
    when = datetime.datetime.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
    lean = s3.presign_list_url(settings, "data", prefix="a b/", principal="alice", now=when)
    assert dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(lean).query, keep_blank_values=True)) == query
    assert check(url, now=when.timestamp()).prefix == "a b/"


@pytest.mark.parametrize("url", [
    "https://s3.eu-west-2.amazonaws.com/data",        # path-style, regional
    "https://data.s3.eu-west-2.amazonaws.com/",       # virtual-hosted
    "https://data.s3.eu-west-2.amazonaws.com:443/",
])
def test_aws_standard_endpoints_of_the_signing_region_are_accepted(url):
    proof = with_query(presign("https://s3.eu-west-2.amazonaws.com", region="eu-west-2"))
    query = urllib.parse.urlsplit(proof).query
    assert check(f"{url}?{query}", endpoint=None).bucket == "data"


def test_us_east_1_also_on_the_global_endpoint():
    query = urllib.parse.urlsplit(presign("https://s3.amazonaws.com")).query
    assert check(f"https://s3.amazonaws.com/data?{query}", endpoint=None).bucket == "data"


# ---- forged or malformed proofs

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9001/data",          # another port: the attacker's server
    "http://evil.example:9000/data",
    "https://127.0.0.1:9000/data",         # another scheme
    "http://127.0.0.1:9000/other",         # another bucket
    "http://127.0.0.1:9000/data/key",      # an object, not the bucket
    "http://127.0.0.1:9000/datax",
    "http://127.0.0.1:9000//data",
    "http://user@127.0.0.1:9000/data",     # user info
])
def test_proofs_of_anything_but_the_stores_bucket_are_refused(url):
    query = urllib.parse.urlsplit(presign()).query
    with pytest.raises(ProofRefused):
        check(f"{url}?{query}")


@pytest.mark.parametrize("host", [
    "https://s3.us-east-1.amazonaws.com/data",         # signed for eu-west-2: another region
    "https://s3.eu-west-2.amazonaws.com.evil.example/data",
    "https://evil.example/data",
    "http://s3.eu-west-2.amazonaws.com/data",          # not https
    "https://s3.eu-west-2.amazonaws.com:8443/data",
    "https://other.s3.eu-west-2.amazonaws.com/",       # another bucket, virtual-hosted
    "https://s3.eu-west-2.amazonaws.com/",             # no bucket
])
def test_without_an_endpoint_only_aws_endpoints_of_the_region_are_accepted(host):
    query = urllib.parse.urlsplit(presign("https://s3.eu-west-2.amazonaws.com", region="eu-west-2")).query
    with pytest.raises(ProofRefused):
        check(f"{host}?{query}", endpoint=None)


@pytest.mark.parametrize("changes, why", [
    ({"x_delvefs_principal": "bob"}, "bound to principal 'bob'"),
    ({"x_delvefs_principal": None}, "x-delvefs-principal"),
    ({"X-Amz-Signature": None}, "lacks X-Amz-Signature"),
    ({"X-Amz-Credential": None}, "lacks"),
    ({"X-Amz-Algorithm": "AWS4-HMAC-SHA1"}, "SigV4"),
    ({"X-Amz-SignedHeaders": "host;x-amz-date"}, "host header only"),
    ({"X-Amz-Signature": "abc"}, "64 hex"),
    ({"X-Amz-Expires": "3601"}, "X-Amz-Expires"),
    ({"X-Amz-Expires": "0"}, "X-Amz-Expires"),
    ({"X-Amz-Date": "20300501T1200Z"}, "X-Amz-Date"),
    ({"X-Amz-Date": "20301301T120000Z"}, "no valid date"),
    ({"X-Amz-Credential": "AKID/20300502/us-east-1/s3/aws4_request"}, "X-Amz-Credential"),
    ({"X-Amz-Credential": "AKID/20300501/us-east-1/iam/aws4_request"}, "X-Amz-Credential"),
    ({"list_type": None}, "lacks list-type"),
    ({"list_type": "1"}, "list-type=2"),
    ({"max_keys": "1000"}, "max-keys=0"),
    ({"delimiter": "/"}, "delimiter"),
    ({"start_after": "m"}, "start-after"),
    ({"encoding_type": "xml"}, "encoding-type"),
    ({"prefix": "k" * 1025}, "longer than 1024"),
])
def test_each_malformed_proof_is_refused_saying_why(changes, why):
    with pytest.raises(ProofRefused) as err:
        check(with_query(presign(), **changes))
    assert why in str(err.value)
    assert not err.value.expired


def test_repeated_parameters_fragments_and_odd_bytes_are_refused():
    url = presign()
    for bad in (url + "&prefix=other", url + "#frag", url + "&x=%FF", url.replace("list-type=2", "list-type=2+"),
                url + "&é=1", url.replace("9000", "90\n00"), url.replace("/data", "/da\tta"), " " + url,
                42, None, "", "not a url", "http://[::1/x"):
        with pytest.raises(ProofRefused):
            check(bad)


def test_expired_and_future_proofs():
    with pytest.raises(ProofRefused) as err:
        check(presign(expires=5), now=SIGNED.timestamp() + 6)
    assert err.value.expired
    with pytest.raises(ProofRefused) as err:
        check(presign(when=SIGNED + datetime.timedelta(seconds=600)))
    assert "future" in str(err.value) and not err.value.expired


# ---- grants

class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_grants_cover_keys_under_their_prefix_until_they_lapse(tmp_path):
    clock = Clock()
    grants = Grants(tmp_path / "grants.json", clock)
    grants.add("alice", "b", "runs/", 1100.0)
    assert grants.status("alice", "b", "runs/2024/x") == GRANTED
    assert grants.status("alice", "b", "runs/") == GRANTED
    assert grants.status("alice", "b", "run") == NONE          # a shorter root is not covered
    assert grants.status("alice", "b", "other/x") == NONE
    assert grants.status("alice", "c", "runs/x") == NONE
    assert grants.status("bob", "b", "runs/x") == NONE         # per principal
    assert grants.buckets("alice") == {"b"}
    grants.add("alice", "b", "runs/", 1050.0)                  # an older proof changes nothing
    assert grants.until("alice", "b", "runs/x") == 1100.0
    clock.t = 1100.0
    assert grants.status("alice", "b", "runs/x") == LAPSED
    assert grants.buckets("alice") == set()
    grants.add("alice", "b", "", 1200.0)                       # the whole bucket
    assert grants.status("alice", "b", "runs/x") == GRANTED
    # a restart keeps them (until they expire)
    again = Grants(tmp_path / "grants.json", clock)
    assert again.status("alice", "b", "other") == GRANTED
    assert stat.S_IMODE(os.stat(tmp_path / "grants.json").st_mode) == 0o600
    again.forget({"alice"})
    assert Grants(tmp_path / "grants.json", clock).status("alice", "b", "x") == NONE


def test_lapsed_grants_are_forgotten_after_a_day(tmp_path):
    clock = Clock()
    grants = Grants(None, clock)
    grants.add("alice", "b", "", 1100.0)
    clock.t = 1100.0 + 86400 + 1
    grants.add("alice", "c", "", clock.t + 10)  # adding prunes
    assert grants.status("alice", "b", "x") == NONE


def test_an_unreadable_grants_file_starts_empty(tmp_path):
    (tmp_path / "grants.json").write_text("{not json")
    assert Grants(tmp_path / "grants.json").status("alice", "b", "") == NONE


# ---- principals and tokens

def test_issued_tokens_name_their_principal():
    assert principal_of_token("alice.Q" + "x" * 42) == "alice"
    assert principal_of_token("test-token") == "default"
    assert principal_of_token("alice.short") == "default"
    assert principal_of_token(None) == "default"


def test_principals_file_keeps_hashes_only(tmp_path):
    path = tmp_path / "state" / "principals.json"
    token = add_principal(path, "alice")
    assert token.startswith("alice.") and principal_of_token(token) == "alice"
    assert token not in path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with pytest.raises(PrincipalsError, match="exists"):
        add_principal(path, "alice")
    with pytest.raises(PrincipalsError, match="invalid principal name"):
        add_principal(path, "al.ice")
    add_principal(path, "bob")
    revoke_principal(path, "alice")
    assert set(read_principals(path)) == {"bob"}
    with pytest.raises(PrincipalsError, match="no principal"):
        revoke_principal(path, "alice")


def test_principals_file_is_found_by_flag_then_state_dir_then_xdg_state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert principals_path(None, None) == tmp_path / "xdg" / "delvefs" / "principals.json"
    assert principals_path(str(tmp_path / "state"), None) == tmp_path / "state" / "principals.json"
    assert principals_path(str(tmp_path / "state"), "/etc/p.json") == Path("/etc/p.json")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert principals_path(None, None) == tmp_path / "home" / ".local/state/delvefs/principals.json"


def test_authenticator_follows_the_file_without_restart(tmp_path):
    path = tmp_path / "principals.json"
    revoked = []
    alice = add_principal(path, "alice")
    auth = Authenticator(path, "legacy-token", on_revoked=revoked.append)
    assert not auth.open
    assert auth.principal(f"Bearer {alice}") == "alice"
    assert auth.principal("bearer legacy-token") == "default"
    bob = add_principal(path, "bob")
    assert auth.principal(f"Bearer {bob}") == "bob"
    revoke_principal(path, "alice")
    with pytest.raises(Unauthorized, match="revoked"):
        auth.principal(f"Bearer {alice}")
    assert revoked == [{"alice"}]
    path.write_text("{broken")  # fails closed for the file's principals
    with pytest.raises(Unauthorized):
        auth.principal(f"Bearer {bob}")
    assert auth.principal("Bearer legacy-token") == "default"


@pytest.mark.parametrize("header, why", [
    (None, "missing"), ("", "missing"), ("Basic dXNlcjpwdw==", "Bearer"), ("Bearer", "empty"),
    ("Bearer ", "empty"), ("Bearer caf\u00e9", "malformed"), ("Bearer a\udcffb", "malformed"),
    ("Bearer a b", "malformed"), ("Bearer " + "x" * 600, "malformed"), ("Bearer wrong", "unknown"),
])
def test_bad_authorization_headers_are_unauthorized(tmp_path, header, why):
    auth = Authenticator(tmp_path / "principals.json", "legacy-token")
    with pytest.raises(Unauthorized, match=why):
        auth.principal(header)


def test_open_until_a_principals_file_appears(tmp_path):
    path = tmp_path / "principals.json"
    auth = Authenticator(path, None)
    assert auth.open and auth.principal(None) == "default"
    token = add_principal(path, "alice")
    with pytest.raises(Unauthorized):
        auth.principal(None)
    assert auth.principal(f"Bearer {token}") == "alice"
    revoke_principal(path, "alice")  # an empty file: closed, nobody gets in
    with pytest.raises(Unauthorized):
        auth.principal(None)
    assert not auth.open


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("10.1.2.3", False), ("handler.example", False)])
def test_listen_is_loopback(host, loopback):
    assert listen_is_loopback(host) is loopback


# ---- what a mount proves

def test_mount_proves_each_views_root_once(tmp_path):
    views = tmp_path / "views.yaml"
    views.write_text(json.dumps({
        "all": {"bucket": "aaa"},
        "runs": {"bucket": "aaa", "object": "runs/2024/*.fastq"},
        "deep": {"bucket": "bbb", "object": "x/y/z*"},
        "deeper": {"bucket": "bbb", "object": "x/y/z/w/*"},
        "other": {"bucket": "bbb", "object": "q/*", "root": ""},  # the handler asks for q/ all the same
    }))
    assert proof_prefixes(load_views(str(views))) == {"aaa": [""], "bbb": ["q/", "x/y/"]}


@pytest.mark.parametrize("store, answer", [("unreachable", 503), ("answers 500", 503),
                                           ("answers 403", 403), ("answers 200", None)])
def test_a_proof_the_store_could_not_be_asked_about_is_503_never_a_refusal(store, answer):
    # a registration during a storm (the store busy or down) is asked to come again; only
    # the store's own refusal is 403
    import asyncio

    import aiohttp

    from eventhandler.api.common import ApiError
    from eventhandler.api.core import ApiCore

    class Response:
        def __init__(self, status):
            self.status, self.content = status, self

        async def read(self, n):
            return b""

        async def __aenter__(self):
            if store == "unreachable":
                raise aiohttp.ClientConnectionError("connection refused")
            return self

        async def __aexit__(self, *exc):
            return False

    class Session:
        def get(self, url, allow_redirects):
            return Response(int(store.rsplit(" ", 1)[-1]) if store.startswith("answers") else 0)

    core = ApiCore.__new__(ApiCore)
    core.s3_endpoint, core.session, core.grants = ENDPOINT, Session(), Grants()
    url = presign(when=datetime.datetime.now(datetime.timezone.utc))
    try:
        asyncio.run(core.accept_proofs("alice", [("data", url)]))
    except ApiError as exc:
        assert exc.status == answer and exc.extra["bucket"] == "data"
    else:
        assert answer is None
    assert (core.grants.status("alice", "data", "") == GRANTED) == (answer is None)
