"""``delvefs status``: the handler's view during a first scan (its progress, before the scan
ends), the members of a work-queue group, a mount's files that S3 did not take yet and its
daemon's pid and pid record (real handler, MinIO, RabbitMQ, FUSE)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from delvefs.shared import s3 as s3api

from ..waiting import wait_until
from .mounts import (  # noqa: F401  (handler, mounts: fixtures)
    DELVEFS,
    Mounts,
    close_private_stack,
    handler,
    listdir,
    mounts,
    private_stack,
    started_handler,
)

pytestmark = [pytest.mark.services]


def status_json(env, *args) -> dict:
    import subprocess
    r = subprocess.run([DELVEFS, "status", *args, "--json"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_handler_status_shows_a_first_scan_in_progress(services, service_env, tmp_path):
    client = s3api.make_client()
    bucket = f"st-{uuid.uuid4().hex[:10]}"
    s3api.ensure_bucket(client, bucket)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"data/{i:04d}", Body=b"x"), range(300)))
    # one key a listing page: the scan lasts long enough to be seen under way
    h = started_handler(services.env(), tmp_path / "state",
                        extra_env={"DELVEFS_SCAN_PAGE_SIZE": "1", "DELVEFS_SCAN_LOG_INTERVAL": "0.1"})
    minio = services.minio.proc
    frozen = False
    try:
        proof = s3api.presigned_list_url(client, bucket, principal="default")
        r = h.register({"data": {"bucket": bucket, "object": "data/*"}}, {bucket: proof})
        assert r.status_code == 200, r.text
        vid = r.json()["views"][0]["id"]
        wait_until(lambda: h.api.status()["buckets"][bucket].get("listing", {}).get("listed", 0) > 0,
                   30, "the first scan's progress")
        os.killpg(minio.pid, signal.SIGSTOP)  # the scan cannot end while we look
        frozen = True
        env = {**os.environ, "DELVEFS_HANDLER_TOKEN": h.token}
        st = status_json(env, "--handler", h.url)
        b = st["buckets"][bucket]
        assert b["state"] == "scanning" and b["listing"]["kind"] == "first scan"
        assert 0 < b["listing"]["listed"] < 300 and b["listing"]["rate"] > 0
        assert b["listing"]["eta"] is None  # no earlier listing of the bucket: total unknown
        assert [v["id"] for v in st["views"]] == [vid] and st["views"][0]["clients"] == 1
        assert st["source"]["kind"] == "amqp" and st["source"]["state"] == "connected"
        # the 503 a mount waits on says as much
        resp = h.http.get(f"/v1/views/{vid}/objects", params={"wait": 0})
        assert resp.status_code == 503 and resp.json()["listed"] > 0 and resp.json()["rate"] > 0
        os.killpg(minio.pid, signal.SIGCONT)
        frozen = False
        wait_until(lambda: h.api.status()["buckets"][bucket]["state"] == "ready", 60, "the scan's end")
        assert len(h.keys(vid)) == 300
        assert f"first scan of bucket {bucket}: " in h.log_path.read_text()  # progress logged
        # another principal sees nothing of buckets it holds no proof for
        issued = Mounts(tmp_path, os.environ).run("principal", "add", "bob", "--state-dir", str(h.state_dir))
        assert issued.returncode == 0, issued.stderr
        bob = issued.stdout.splitlines()[0]
        other = status_json({**os.environ, "DELVEFS_HANDLER_TOKEN": bob}, "--handler", h.url)
        assert (other["principal"], other["buckets"], other["views"]) == ("bob", {}, [])
    finally:
        if frozen:
            os.killpg(minio.pid, signal.SIGCONT)
        h.close()


def test_mount_status_lists_files_s3_has_not_taken(private_services, tmp_path):
    m = private_stack(private_services, tmp_path)
    svc, bucket = m.svc, m.bucket
    try:
        mp = m.mount(f"""
        data:
          bucket: {bucket}
          object: "data/*"
          ttl: 1s
        """)
        assert listdir(mp / "data") == []
        st = status_json(m.env, str(mp))
        assert [(v["name"], v["bucket"], v["listed"], v["stale"]) for v in st["views"]] == \
            [("data", bucket, True, None)]
        assert st["files"] == [] and st["cache"]["limit"] is None
        svc.minio.stop()
        try:
            with open(mp / "data/kept.bin", "wb") as f:
                f.write(b"k" * 1000)
        except OSError as exc:  # close: the upload failed
            assert exc.errno == errno.EIO
        st = status_json(m.env, str(mp))
        (f,) = st["files"]
        assert f["path"] == "data/kept.bin" and f["size"] == 1000
        assert f["state"] in ("pending", "uploading", "failed")
        assert st["cache"]["dirty_bytes"] == 1000
        human = m.run("status", str(mp))
        assert human.returncode == 0 and "data/kept.bin" in human.stdout, human.stderr
        svc.minio.start()
        wait_until(lambda: status_json(m.env, str(mp))["files"] == [], 90, "the retried upload")
        r = m.run("status", str(tmp_path))
        assert r.returncode == 1 and "not mounted" in r.stderr
    finally:
        close_private_stack(m)


def test_handler_status_lists_the_members_of_a_group(handler, s3, bucket):  # noqa: F811
    proof = s3api.presigned_list_url(s3, bucket, principal="default")
    answer = handler.register({"data": {"bucket": bucket, "object": "data/*"}}, {bucket: proof})
    assert answer.status_code == 200, answer.text
    vid = answer.json()["views"][0]["id"]
    for member, client in (("node1:41:aa", "node1:41"), ("node2:42:bb", "node2:42")):
        handler.api.group_join(vid, "align", member, client=client)
    env = {**os.environ, "DELVEFS_HANDLER_TOKEN": handler.token}
    (group,) = status_json(env, "--handler", handler.url)["groups"]
    assert sorted((m["id"], m["client"]) for m in group["members"]) == \
        [("node1:41:aa", "node1:41"), ("node2:42:bb", "node2:42")]
    text = Mounts(handler.state_dir, env).run("status", "--handler", handler.url)
    assert text.returncode == 0, text.stderr
    rows = [line.split() for line in text.stdout.splitlines()]
    assert ["GROUP", "MEMBER", "IN", "FLIGHT", "LAST", "HEARD", "CLIENT"] in rows, text.stdout
    members = sorted(row for row in rows if row[:1] == ["align"] and row[1].startswith("node"))
    assert [(row[1], row[2], row[-1]) for row in members] == \
        [("node1:41:aa", "0", "node1:41"), ("node2:42:bb", "0", "node2:42")], text.stdout


def test_mount_status_shows_the_daemon_pid_and_where_it_is_recorded(mounts, bucket):  # noqa: F811
    mp = mounts.mount(f"""
    data:
      bucket: {bucket}
      object: "data/*"
    """)
    record = mounts.tmp / "state" / "run" / f"{hashlib.sha256(str(mp).encode()).hexdigest()[:16]}.json"
    recorded = json.loads(record.read_text())
    assert set(recorded) == {"pid", "mountpoint", "cache_dir"} and recorded["mountpoint"] == str(mp)
    pid = recorded["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:  # the daemon itself
        assert b"mount" in cmdline.read().split(b"\0")
    st = status_json(mounts.env, str(mp))
    assert (st["pid"], st["pid_record"]) == (pid, str(record))
    text = mounts.run("status", str(mp))
    assert text.returncode == 0, text.stderr
    assert f"(daemon pid {pid}, recorded in {record}; " in text.stdout.splitlines()[0], text.stdout
