"""`delvefs check`: validation summary, per-object JSON lines, exit codes and error messages."""
import json
import time

import pytest

from delvefs.cli import main

VIEWS = """\
fastq:
  bucket: runs
  object: "run42/*.fastq"
  properties: {stage: raw}
big:
  bucket: runs
  size: ">= 1 MiB"
fresh:
  bucket: runs
  modified: "< 7d"
"""


@pytest.fixture
def views_file(tmp_path):
    path = tmp_path / "views.yaml"
    path.write_text(VIEWS)
    return path


def test_valid_file_prints_a_summary_per_view(views_file, capsys):
    assert main(["check", str(views_file)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == ("fastq: bucket runs; object run42/*.fastq; stage = raw "
                        "(tree, root 'run42/', ttl 2s, writable, set stage=raw)")
    assert lines[1].startswith("big: bucket runs; size >= 1048576 B")
    assert lines[2].startswith("fresh: bucket runs; modified age < 1w")
    assert lines[3] == f"{views_file}: 3 views, valid" and err == ""


def test_invalid_file_reports_every_problem_and_exits_1(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("a:\n  bucket: runs\n  sise: 1\nb:\n  object: x\n")
    assert main(["check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}:3:3: unknown key 'sise' in view 'a'; did you mean 'size'? allowed: bucket, object, "
        "size, modified, properties, tags, metadata, any, not, layout, root, set, ttl, writable, write",
        f"{path}:4:1: view 'b' has no `bucket`; every view needs one (the name of an S3 bucket, such as 'runs')",
    ]


def test_objects_get_one_json_line_each(views_file, tmp_path, capsys):
    now = time.time()
    objects = tmp_path / "objects.jsonl"
    records = [
        {"bucket": "runs", "key": "run42/a.fastq", "size": 2**20, "mtime": now - 60, "tags": {"stage": "raw"}},
        {"bucket": "runs", "key": "run42/a.fastq", "size": 1, "mtime": "2020-01-01T00:00:00Z",
         "metadata": {"x-amz-meta-Stage": "raw"}},
        {"bucket": "runs-b", "key": "x", "size": 2**21, "mtime": 0, "atime": 5},
        {"bucket": "logs", "key": "é", "size": 0, "mtime": "2020-01-01"},
    ]
    objects.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    assert main(["check", str(views_file), "--objects", str(objects)]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == [
        {"bucket": "runs", "key": "run42/a.fastq", "views": ["big", "fastq", "fresh"]},
        {"bucket": "runs", "key": "run42/a.fastq", "views": ["fastq"]},
        {"bucket": "runs-b", "key": "x", "views": []},
        {"bucket": "logs", "key": "é", "views": []},
    ]
    assert err == ""


def test_tag_values_that_are_json_numbers_or_booleans_read_as_text(tmp_path, capsys):
    views = tmp_path / "views.yaml"
    views.write_text("v: {bucket: runs, properties: {lane: 2, flag: true}}\n")
    objects = tmp_path / "objects.jsonl"
    objects.write_text('{"bucket": "runs", "key": "k", "size": 1, "mtime": 0, "tags": {"lane": 2, "flag": true}}\n')
    assert main(["check", str(views), "--objects", str(objects)]) == 0
    assert json.loads(capsys.readouterr().out)["views"] == ["v"]


def test_malformed_object_lines_are_reported_with_line_numbers(views_file, tmp_path, capsys):
    objects = tmp_path / "objects.jsonl"
    objects.write_text("\n".join([
        '{"bucket": "runs", "key": "k", "size": 1, "mtime": 0}',
        '{"bucket": "runs", "key": "k"',
        '[1, 2]',
        '{"bucket": "runs", "key": "k", "size": -1, "mtime": 0}',
        '{"bucket": "runs", "key": "k", "size": 1, "mtime": "yesterday"}',
        '{"bucket": "runs", "key": "k", "size": 1, "mtime": 0, "tag": {}}',
        '{"bucket": "runs", "key": 5, "size": 1, "mtime": 0}',
        '{"bucket": "runs", "size": 1}',
        '{"bucket": "runs", "key": "k", "size": 1, "mtime": 0, "tags": {"a": [1]}}',
    ]) + "\n")
    assert main(["check", str(views_file), "--objects", str(objects)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{objects}:2: not JSON: Expecting ',' delimiter at column 30",
        f"{objects}:3: each line must be a JSON object with bucket, key, size and mtime",
        f"{objects}:4: `size` must be a whole number of bytes >= 0",
        f"{objects}:5: `mtime` 'yesterday' is not an ISO-8601 date-time (like 2026-01-31T12:00:00Z) or epoch seconds",
        f"{objects}:6: unknown field 'tag'; did you mean 'tags'? allowed: bucket, key, size, mtime, atime, tags, metadata",
        f"{objects}:7: `key` must be a string",
        f"{objects}:8: missing key, mtime; each object needs bucket, key, size and mtime",
        f"{objects}:9: `tags` 'a' must be text, a number or a boolean, not [1]",
    ]


def test_missing_files(tmp_path, capsys):
    assert main(["check", str(tmp_path / "none.yaml")]) == 1
    assert "cannot read the views file" in capsys.readouterr().err
    views = tmp_path / "views.yaml"
    views.write_text(VIEWS)
    assert main(["check", str(views), "--objects", str(tmp_path / "none.jsonl")]) == 1
    assert "cannot read the objects file" in capsys.readouterr().err


def test_bucket_globs_and_accessed_are_refused_where_they_are_written(tmp_path, capsys):
    path = tmp_path / "views.yaml"
    path.write_text("all:\n  bucket: 'runs-*'\nold:\n  bucket: runs\n  accessed: '> 30d'\n")
    assert main(["check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}:2:11: bucket 'runs-*' is a glob: bucket globs are not supported by the handler yet; "
        "name the bucket (one view per bucket)",
        f"{path}:5:3: `accessed` in view 'old' cannot be used: S3 records no access time, so no rule can "
        "select by it; use `modified` (the time of the last write) instead",
    ]


def test_the_richer_rules_summarised_and_matched(tmp_path, capsys):
    views = tmp_path / "views.yaml"
    views.write_text("""\
reads:
  bucket: runs
  object: "*.{fastq,fq}.gz"
  properties: {lane: ">= 3"}
  tags: {stage: [raw, ~]}
  metadata: {score: "0.5 .. 1"}
  any: [{size: "> 1"}, {tags: {keep: "yes"}}]
  not: {object: "tmp/*"}
""")
    assert main(["check", str(views)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "reads: bucket runs; object *.{fastq,fq}.gz; lane >= 3; tag stage in [raw, (absent)]; "
        "metadata score 0.5 .. 1; any of (size >= 2 B) | (tag keep = yes); none of (object tmp/*) "
        "(tree, root '', ttl 2s, writable)")
    objects = tmp_path / "objects.jsonl"
    records = [
        {"key": "a.fq.gz", "size": 5, "tags": {"lane": 3}, "metadata": {"score": "0.75"}},
        {"key": "a.fastq.gz", "size": 1, "tags": {"keep": "yes", "stage": "raw"}, "metadata": {"lane": "10", "score": 1}},
        {"key": "tmp/a.fq.gz", "size": 5, "tags": {"lane": 3}, "metadata": {"score": "0.75"}},
        {"key": "a.fq.gz", "size": 5, "tags": {"lane": 3, "stage": "cooked"}, "metadata": {"score": "0.75"}},
        {"key": "a.fq.gz", "size": 5, "tags": {"lane": "three"}, "metadata": {"score": "0.75"}},
        {"key": "a.fq.gz", "size": 5, "metadata": {"lane": 3, "x-amz-meta-score": "2"}},
    ]
    objects.write_text("".join(json.dumps({"bucket": "runs", "mtime": 0, **r}) + "\n" for r in records))
    assert main(["check", str(views), "--objects", str(objects)]) == 0
    assert [json.loads(line)["views"] for line in capsys.readouterr().out.splitlines()] == [
        ["reads"], ["reads"], [], [], [], []]
