"""The examples of docs/RULESETS.md are true: valid YAML validates, invalid YAML gives the
errors shown, and each `objects` block belongs to the views shown."""
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from rulesets import ViewsError, compile_views, parse_views
from rulesets.check import parse_object

DOC = Path(__file__).resolve().parents[2] / "docs" / "RULESETS.md"
NOW = datetime(2026, 3, 1, tzinfo=timezone.utc).timestamp()  # the docs' "now"
BLOCK = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.M | re.S)


def blocks():
    return [(info.strip(), body) for info, body in BLOCK.findall(DOC.read_text(encoding="utf-8"))]


def test_docs_have_examples_of_every_kind():
    kinds = {info for info, _ in blocks()}
    assert {"yaml", "yaml invalid", "objects", "text"} <= kinds


@pytest.mark.parametrize("body", [body for info, body in blocks() if info == "yaml"])
def test_valid_examples_validate(body):
    assert parse_views(body, "views.yaml")


def test_invalid_examples_give_the_errors_shown():
    found = blocks()
    cases = [(body, found[i + 1]) for i, (info, body) in enumerate(found) if info == "yaml invalid"]
    assert cases
    for body, (next_info, expected) in cases:
        assert next_info == "text"
        with pytest.raises(ViewsError) as caught:
            parse_views(body, "views.yaml")
        assert str(caught.value) == expected.strip()


def test_objects_examples_belong_to_the_views_shown():
    views = None
    checked = 0
    for info, body in blocks():
        if info == "yaml":
            views = parse_views(body, "views.yaml")
        elif info == "objects":
            matcher = compile_views(views)
            for line in body.strip().splitlines():
                record = json.loads(line)
                expected = record.pop("views")
                obj = parse_object(json.dumps(record))
                assert sorted(views[i].name for i in matcher.match(obj, now=NOW)) == expected, line
                checked += 1
    assert checked >= 20


def test_documented_defaults_of_the_options_example():
    body = next(body for info, body in blocks() if info == "yaml" and "incoming:" in body)
    incoming, published = parse_views(body, "views.yaml")
    assert (incoming.root, incoming.set, incoming.layout, incoming.ttl) == (
        "incoming/", {"stage": "raw"}, "flat", 0.5)
    assert (published.root, published.writable) == ("pub/", False)


def test_merge_key_example_shares_rules():
    body = next(body for info, body in blocks() if info == "yaml" and "<<:" in body)
    raw, raw_bams = parse_views(body, "views.yaml")
    assert raw_bams.bucket == "runs" and raw_bams.properties == {"stage": ("raw",)}
    assert raw_bams.object == "*.bam" and raw.object is None


def test_layout_by_example():
    body = next(body for info, body in blocks() if info == "yaml" and "by_sample:" in body)
    (view,) = parse_views(body, "views.yaml")
    assert (view.layout, view.layout_by, view.root) == ("flat", ("sample", "lane"), "fastq/")
