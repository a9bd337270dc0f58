"""The demo behind `make demo` runs end to end with small inputs: a pool of aligners shares
the read files as one work-queue group, one of them is SIGKILLed holding a file, and still
every sample is aligned exactly once — checked here on what the demo leaves behind (S3 and
the aligners' journals), not on what it prints."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from delvefs.devtools.demo.roles import (INPUT_BUCKET, OUTPUT_BUCKET, OUTPUT_ROOT, STATS, killed_marker,
                                         read_journals, read_key, sample_of)
from delvefs.shared.s3 import get_object_tags

from .mounts import fuse_available
from ..conftest import service_unavailable

pytestmark = [pytest.mark.services, pytest.mark.fuse]

RUN = "demo-test"
FILES, ALIGNERS = 6, 3  # six files over three members: one takes a second, and is killed at it


def test_demo_aligns_every_sample_exactly_once_although_an_aligner_is_killed(service_env, s3, tmp_path):
    if not fuse_available():
        service_unavailable("/dev/fuse or fusermount3 missing")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELVEFS_HANDLER")}
    env.update(service_env)  # the session's MinIO and RabbitMQ; the demo starts its own handler
    workdir = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "delvefs.devtools.demo", "run", "--aligners", str(ALIGNERS),
                        "--files", str(FILES), "--reads", "300", "--interval", "0.1", "--kill-at", "2",
                        "--timeout", "150", "--run", RUN, "--workdir", str(workdir)],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr[-6000:]
    assert "0 missing, 0 duplicated" in r.stdout and "killed holding" in r.stdout, r.stdout

    keys = [read_key(RUN, i) for i in range(FILES)]
    samples = [sample_of(k) for k in keys]
    for key in keys:  # the inputs carry no share of a worker: the group decides
        assert get_object_tags(s3, INPUT_BUCKET, key) == {}

    # the outputs: per sample one directory with its SAM and stats, and nothing else at all
    objects = [o["Key"] for o in s3.list_objects_v2(Bucket=OUTPUT_BUCKET, Prefix=f"{OUTPUT_ROOT}{RUN}/")
               .get("Contents", [])]
    assert sorted(objects) == sorted(f"{OUTPUT_ROOT}{RUN}/{s}/{name}" for s in samples
                                     for name in (f"{s}.sam", STATS))
    stats = {}
    for sample in samples:
        prefix = f"{OUTPUT_ROOT}{RUN}/{sample}/"
        assert get_object_tags(s3, OUTPUT_BUCKET, prefix + f"{sample}.sam") == {"stage": "aligned"}
        assert s3.get_object(Bucket=OUTPUT_BUCKET, Key=prefix + f"{sample}.sam")["Body"].read(3) == b"@HD"
        stats[sample] = json.loads(s3.get_object(Bucket=OUTPUT_BUCKET, Key=prefix + STATS)["Body"].read())

    # the inputs each member took: every file published once, by the aligner its stats name
    journals = read_journals(workdir / "journals")
    assert len(journals) == ALIGNERS
    events = [(name, e) for name, entries in journals.items() for e in entries]
    published = Counter(e["sample"] for _, e in events if e["event"] == "published")
    assert published == Counter(samples)
    for name, e in events:
        if e["event"] == "published":
            assert stats[e["sample"]]["aligner"] == name
    took = Counter(e["key"] for _, e in events if e["event"] == "took")
    assert set(took) == set(keys)

    # the killed aligner: it held a file, which another member took again and published
    victim = killed_marker(workdir / "journals", RUN).read_text()
    killed = [e for e in journals[victim] if e["event"] == "killed"]
    assert len(killed) == 1 and journals[victim][-1] == killed[0]
    lost = killed[0]["key"]
    assert took[lost] >= 2
    assert stats[sample_of(lost)]["aligner"] != victim and stats[sample_of(lost)]["attempt"] >= 2

    # torn down: nothing of the demo stays mounted
    with open("/proc/self/mounts") as mounts:
        assert str(workdir) not in mounts.read()
