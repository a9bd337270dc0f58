"""The public matcher API by example, and the view model (filter specs, ids)."""
import math
import threading

import pytest

from rulesets import ObjectInfo, View, compile_views, parse_views, view_id
from rulesets import reference

VIEWS = parse_views("""
fastq:
  bucket: runs
  object: "run42/*.fastq"
raw:
  bucket: "runs*"
  properties: {stage: raw}
recent:
  bucket: runs
  object: "*.bam"
  modified: "< 1h"
old:
  bucket: runs
  modified: "> 1d"
  accessed: "1h .. 2h"
other:
  bucket: archive
""", "views.yaml")
NOW = 1_000_000.0


def obj(key="run42/a.fastq", bucket="runs", mtime=NOW - 10, **kw):
    return ObjectInfo(bucket, key, kw.pop("size", 1), mtime, **kw)


def test_match_returns_ascending_view_indices():
    matcher = compile_views(VIEWS)
    assert matcher.match(obj(tags={"Stage": "raw"}), now=NOW) == [0, 1]
    assert matcher.match(obj(bucket="runs-2", metadata={"STAGE": "raw"}), now=NOW) == [1]
    assert matcher.match(obj(key="x.bam"), now=NOW) == [2]
    assert matcher.match(obj(bucket="nothing"), now=NOW) == []


def test_match_defaults_now_to_the_clock():
    import time

    matcher = compile_views(VIEWS)
    assert matcher.match(obj(key="x.bam", mtime=time.time())) == [2]
    assert matcher.match(obj(key="x.bam", mtime=time.time() - 7200)) == []


def test_match_batch_answers_each_object():
    matcher = compile_views(VIEWS)
    objs = [obj(), obj(bucket="archive"), obj(key="x.bam"), obj(bucket="nothing")]
    assert matcher.match_batch(objs, now=NOW) == [[0], [4], [2], []]
    assert matcher.match_batch([], now=NOW) == []
    assert matcher.match_batch(tuple(objs), now=NOW) == [matcher.match(o, now=NOW) for o in objs]


def test_bad_objects_raise_type_errors_not_crashes():
    matcher = compile_views(VIEWS)
    with pytest.raises(TypeError, match="key must be str"):
        matcher.match(ObjectInfo("runs", b"k", 1, 0.0), now=NOW)
    with pytest.raises(TypeError, match="tags must be a dict"):
        matcher.match(ObjectInfo("runs", "k", 1, 0.0, tags=[("stage", "raw")]), now=NOW)
    with pytest.raises(TypeError, match="tag value"):
        matcher.match(ObjectInfo("runs", "k", 1, 0.0, tags={"stage": 2}), now=NOW)
    with pytest.raises(AttributeError):
        matcher.match_batch([obj(), "not an object"], now=NOW)


def test_bucket_questions():
    matcher = compile_views(VIEWS)
    assert matcher.names_bucket("runs") and matcher.names_bucket("runs-7") and matcher.names_bucket("archive")
    assert not matcher.names_bucket("logs")
    assert matcher.needs_tags("runs") and matcher.needs_tags("runs-7")
    assert not matcher.needs_tags("archive") and not matcher.needs_tags("logs")
    assert matcher.property_keys == frozenset({"stage"})


def test_next_flip_is_when_a_relative_age_rule_changes():
    matcher = compile_views(VIEWS)
    young_bam = obj(key="x.bam", mtime=NOW - 10)
    flip = matcher.next_flip(young_bam, now=NOW)
    assert flip == NOW - 10 + 3600                    # "< 1h" stops holding at age 1h
    assert matcher.match(young_bam, now=flip - 1) == [2] and matcher.match(young_bam, now=flip) == []
    # "old": modified > 1d holds just after NOW; accessed 1h .. 2h holds from NOW + 30 min
    stale = obj(key="y", mtime=NOW - 86400, atime=NOW - 1800)
    flip = matcher.next_flip(stale, now=NOW)
    assert flip == math.nextafter(NOW, math.inf)
    assert matcher.match(stale, now=flip) == []
    flip = matcher.next_flip(stale, now=flip)
    assert flip == NOW + 1800
    assert matcher.match(stale, now=flip - 1e-3) == [] and matcher.match(stale, now=flip) == [3]
    assert matcher.next_flip(stale, now=flip) == math.nextafter(NOW + 5400, math.inf)


def test_next_flip_of_a_strict_lower_bound_is_just_after_it():
    matcher = compile_views(parse_views("v: {bucket: runs, modified: '> 1d'}", "views.yaml"))
    created = 1_700_000_000.123
    flip = matcher.next_flip(obj(mtime=created), now=created)
    assert created + 86400 < flip < created + 86400 + 1e-5
    assert matcher.match(obj(mtime=created), now=math.nextafter(flip, -math.inf)) == []
    assert matcher.match(obj(mtime=created), now=flip) == [0]
    assert matcher.next_flip(obj(mtime=created), now=flip) is None


def test_next_flip_is_none_without_relative_rules_or_when_other_rules_fail():
    matcher = compile_views(VIEWS)
    assert matcher.next_flip(obj(bucket="archive"), now=NOW) is None
    assert matcher.next_flip(obj(bucket="logs"), now=NOW) is None
    assert matcher.next_flip(obj(key="x.fastq-not-bam"), now=NOW) is not None   # "old" can flip
    assert compile_views(VIEWS[:2]).next_flip(obj(), now=NOW) is None


def test_many_views_on_shared_prefixes_and_suffixes():
    text = "".join(f"p{i}:\n  bucket: runs\n  object: 'run{i % 7}/lane{i % 3}/*_{i}.fastq'\n"
                   f"s{i}:\n  bucket: runs\n  object: '*{i}.bam'\n" for i in range(60))
    views = parse_views(text + "all:\n  bucket: runs\n", "views.yaml")
    matcher = compile_views(views)
    keys = [f"run{i % 7}/lane{i % 3}/x_{i}.fastq" for i in range(60)] + \
           [f"a/{i}.bam" for i in range(120)] + ["run1/lane1/x_1.bam", "run1/", ""]
    for key in keys:
        o = obj(key=key)
        assert matcher.match(o, now=NOW) == reference.match(views, o, now=NOW), key


def test_match_batch_from_many_threads_at_once():
    matcher = compile_views(VIEWS)
    objs = [obj(key=f"run42/{i}.fastq", tags={"stage": "raw"}) for i in range(2000)]
    expected = matcher.match_batch(objs, now=NOW)
    results = []

    def worker():
        results.append(matcher.match_batch(objs, now=NOW) == expected)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


def test_filter_spec_round_trips_and_ids_ignore_options_and_value_order():
    a, b = parse_views("""
        a:
          bucket: runs
          object: "x/*.bam"
          size: "1 KiB .. 1 MiB"
          modified: "< 7d"
          accessed: ">= 2026-01-01"
          properties: {Color: [green, black], gone: ~}
          layout: flat
          ttl: 5s
        b:
          bucket: runs
          object: "x/*.bam"
          size: "1024 .. 1048576"
          modified: "< 1w"
          accessed: ">= 2026-01-01T00:00"
          properties: {color: [black, green, black], GONE: null}
    """.replace("\n        ", "\n"), "views.yaml")
    spec = a.filter_spec()
    assert spec == b.filter_spec() and view_id(spec) == view_id(b.filter_spec())
    assert set(spec) == {"bucket", "object", "size", "modified", "accessed", "properties"}
    assert spec["properties"] == {"color": ["black", "green"], "gone": [None]}
    import json

    assert json.loads(json.dumps(spec)) == spec
    rebuilt = View.from_filter_spec("again", json.loads(json.dumps(spec)))
    assert rebuilt.filter_spec() == spec
    assert (rebuilt.name, rebuilt.root, rebuilt.layout, rebuilt.ttl) == ("again", "x/", "tree", 2.0)
    assert len(view_id(spec)) == 16 and int(view_id(spec), 16) >= 0
    other = dict(spec, object="y/*.bam")
    assert view_id(other) != view_id(spec)


@pytest.mark.parametrize("spec,complaint", [
    ([], "must be a mapping"),
    ({"bucket": "runs", "colour": 1}, "unknown filter keys ['colour']"),
    ({"object": "*"}, "`bucket` must be a non-empty string"),
    ({"bucket": "runs", "object": 5}, "`object` must be a string"),
    ({"bucket": "runs", "size": [5, 1]}, "`size` must be [lo, hi]"),
    ({"bucket": "runs", "size": [-1, None]}, "`size` must be [lo, hi]"),
    ({"bucket": "runs", "size": ["1", None]}, "`size` must be [lo, hi]"),
    ({"bucket": "runs", "properties": {"a": "x"}}, "property 'a' must map to a non-empty list"),
    ({"bucket": "runs", "properties": {"a": [1]}}, "property 'a' must map to a non-empty list"),
    ({"bucket": "runs", "properties": {"a": []}}, "property 'a' must map to a non-empty list"),
    ({"bucket": "runs", "modified": {"kind": "later"}}, "`modified`: time rule kind"),
    ({"bucket": "runs", "modified": {"kind": "age", "hi": "1d"}}, "bounds must be numbers"),
    ({"bucket": "runs", "accessed": {"kind": "age", "lo_open": 1}}, "must be true or false"),
    ({"bucket": "runs", "accessed": {"kind": "age", "when": 1}}, "unknown time rule keys"),
    ({"bucket": "runs", "accessed": 7}, "`accessed` must be a time rule"),
])
def test_malformed_filter_specs_from_clients_raise_value_errors(spec, complaint):
    with pytest.raises(ValueError) as caught:
        View.from_filter_spec("v", spec)
    assert complaint in str(caught.value)


def test_a_partial_filter_spec_gets_defaults():
    view = View.from_filter_spec("v", {"bucket": "runs", "properties": {"Stage": ["raw"]}, "size": [5, None]})
    assert view.properties == {"stage": ("raw",)} and view.set == {"stage": "raw"}
    assert view.filter_spec() == {"bucket": "runs", "object": None, "size": [5, None], "modified": None,
                                  "accessed": None, "properties": {"stage": ["raw"]}}
