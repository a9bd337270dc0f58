"""The pipeline benchmark (benchmarks/bench_pipeline.py), tiny, against real services: one
sample through Snakemake, bowtie2 and samtools on the local disk (the baseline), on DelveFS
(default and eager) and on the pass-through floor; every run's outputs reach S3 whole and
right. (It checks that the benchmark works, not how fast: no timings are asserted.)
Snakemake comes from the benchmark's own venv (build/bench-pipeline-venv, installed by the
benchmark when missing)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import service_unavailable

pytestmark = pytest.mark.services


def test_a_tiny_pipeline_runs_on_each_file_system_and_its_outputs_check(tmp_path, monkeypatch):
    if not os.path.exists("/dev/fuse"):
        service_unavailable("/dev/fuse is missing")
    if not all(shutil.which(t) for t in ("bowtie2", "bowtie2-build", "samtools")):
        service_unavailable("bowtie2 or samtools missing (apt-get install bowtie2 samtools)")
    from benchmarks import bench_pipeline
    monkeypatch.setattr(bench_pipeline, "BASE", tmp_path / "base")  # its own MinIO, inputs
    out = tmp_path / "pipeline.txt"
    status = bench_pipeline.main(["--samples", "1", "--reads", "200", "--repeat", "1", "--cpus", "unpinned",
                                  "--only", "local,delvefs,eager,floor", "--out", str(out)])
    text = out.read_text()
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]["unpinned"]
    assert status == 0, text
    assert [r["variant"] for r in runs] == ["local", "delvefs", "eager", "floor"]
    for r in runs:
        assert "error" not in r and r["problems"] == [], r
        assert r["jobs"] == 9 and r["total_s"] > 0
    assert [r.get("pending") for r in runs] == [None, 0, 0, None]
    assert "| local disk + boto3 stage-in/out (baseline) | 1 |" in text and "| 1.00 |" in text
