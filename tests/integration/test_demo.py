"""The demo behind `make demo` runs end to end with small inputs: every read file a
publisher puts through the S3 API is aligned by the subscriber it was tagged for, and
the alignment lands in S3 with the tags of that subscriber's output view."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from delvefs.devtools.demo.roles import ALIGN_MS, INPUT_BUCKET, OUTPUT_BUCKET, SEEN_AFTER_MS, read_key
from delvefs.shared.s3 import get_object_tags

from .mounts import fuse_available
from ..conftest import service_unavailable

pytestmark = [pytest.mark.services, pytest.mark.fuse]


def test_demo_aligns_every_input_into_its_workers_output_view(service_env, s3, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELVEFS_HANDLER")}
    env.update(service_env)  # the session's MinIO and RabbitMQ; the demo starts its own handler
    files, workers = 5, 2
    r = subprocess.run([sys.executable, "-m", "delvefs.devtools.demo", "run", "--workers", str(workers),
                        "--files", str(files), "--reads", "300", "--interval", "0.1",
                        "--timeout", "120", "--workdir", str(tmp_path / "demo")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert "correct %" in r.stdout and "upload -> visible" in r.stdout

    for i in range(files):
        worker = str(i % workers + 1)
        input_tags = get_object_tags(s3, INPUT_BUCKET, read_key(i))
        assert input_tags == {"worker": worker}
        output = read_key(i).rsplit("/", 1)[1].replace(".fastq", ".sam")
        tags = get_object_tags(s3, OUTPUT_BUCKET, output)
        assert tags is not None, f"no alignment for {read_key(i)}"
        assert tags["stage"] == "aligned" and tags["worker"] == worker
        assert int(tags[SEEN_AFTER_MS]) >= 0 and int(tags[ALIGN_MS]) > 0
        head = s3.get_object(Bucket=OUTPUT_BUCKET, Key=output)["Body"].read(3)
        assert head == b"@HD"
    # nothing else was written: no scratch or temp objects
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=OUTPUT_BUCKET).get("Contents", [])]
    assert len(keys) == files
