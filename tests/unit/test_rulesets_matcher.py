"""The public matcher API by example, and the view model (filter specs, ids)."""
import math
import threading

import pytest

from rulesets import ObjectInfo, View, compile_views, parse_views, view_id
from rulesets import reference

# "raw" has a bucket glob: views files cannot have one yet, the matcher serves them.
VIEWS = parse_views("""
fastq:
  bucket: runs
  object: "run42/*.fastq"
recent:
  bucket: runs
  object: "*.bam"
  modified: "< 1h"
old:
  bucket: runs
  modified: "> 1d"
  any: [{modified: "1470m .. 1530m"}]
other:
  bucket: archive
""", "views.yaml")
VIEWS.insert(1, View(name="raw", bucket="runs*", properties={"stage": ("raw",)}))
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
    # "old": modified > 1d holds just after NOW; its `any` (age 24.5h .. 25.5h) from NOW + 30 min
    stale = obj(key="y", mtime=NOW - 86400)
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
          properties: {Color: [green, black], gone: ~}
          layout: flat
          ttl: 5s
        b:
          bucket: runs
          object: "x/*.bam"
          size: "1024 .. 1048576"
          modified: "< 1w"
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
    ({"bucket": "runs", "modified": {"kind": "age", "lo_open": 1}}, "must be true or false"),
    ({"bucket": "runs", "modified": {"kind": "age", "when": 1}}, "unknown time rule keys"),
    ({"bucket": "runs", "modified": 7}, "`modified` must be a time rule"),
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


def test_accessed_is_refused_in_specs_but_null_is_the_old_shape():
    for spec in ({"bucket": "runs", "accessed": {"kind": "age", "lo": 1.0}},
                 {"bucket": "runs", "any": [{"size": [1, None], "accessed": {"kind": "age", "lo": 1.0}}]}):
        with pytest.raises(ValueError, match="S3 records no access time.*use `modified`"):
            View.from_filter_spec("v", spec)
    assert View.from_filter_spec("v", {"bucket": "runs", "accessed": None}).filter_spec()["accessed"] is None


RICH = parse_views("""
rich:
  bucket: runs
  object: "run{1,2}/*.{fastq,fq}.gz"
  size: "> 10"
  properties: {lane: ">= 3"}
  tags: {stage: [raw, ~]}
  metadata: {score: "0.5 .. 1"}
  any:
    - {modified: "< 1d"}
    - {tags: {keep: "yes"}, metadata: {owner: "a*"}}
  not:
    - {object: "*/tmp/*"}
    - {properties: {flag: '\\> 2'}}
""", "views.yaml")


def test_filter_spec_carries_the_new_rules_and_the_handler_rebuilds_them():
    import json

    (view,) = RICH
    spec = view.filter_spec()
    assert spec["tags"] == {"stage": [None, "raw"]} and spec["metadata"] == {"score": ["0.5 .. 1"]}
    assert spec["properties"] == {"lane": [">= 3"]}
    assert spec["any"] == [{"metadata": {"owner": ["a*"]}, "tags": {"keep": ["yes"]}},
                           {"modified": {"kind": "age", "lo": None, "hi": 86400.0, "lo_open": False,
                                         "hi_open": True}}]
    assert spec["not"] == [{"object": "*/tmp/*"}, {"properties": {"flag": ["\\> 2"]}}]
    rebuilt = View.from_filter_spec("again", json.loads(json.dumps(spec)))
    assert rebuilt.filter_spec() == spec and view_id(rebuilt.filter_spec()) == view_id(spec)
    assert set(rebuilt.any_of) == set(view.any_of) and set(rebuilt.none_of) == set(view.none_of)
    objs = [obj(key=key, size=size, mtime=mtime, tags=tags, metadata=metadata)
            for key in ("run1/a.fq.gz", "run2/x/tmp/a.fastq.gz", "run3/a.fq.gz")
            for size in (5, 50) for mtime in (NOW - 10, NOW - 2 * 86400)
            for tags in ({}, {"stage": "raw", "keep": "yes"}, {"stage": "cooked"}, {"flag": "> 2"})
            for metadata in ({"lane": "3", "score": "0.5"}, {"lane": "2.5", "score": "1", "owner": "ab"},
                             {"lane": "x", "score": "1.0e0", "owner": "ab"})]
    assert compile_views([rebuilt]).match_batch(objs, NOW) == compile_views(RICH).match_batch(objs, NOW) \
        == [reference.match(RICH, o, NOW) for o in objs]
    assert any(compile_views(RICH).match_batch(objs, NOW))


def test_blocks_are_a_set_in_the_spec():
    a, b = parse_views("""
        a: {bucket: runs, any: [{size: 1}, {size: 2}, {size: 1}], not: {object: x}}
        b: {bucket: runs, any: [{size: 2}, {size: 1}], not: [{object: x}]}
    """.replace("\n        ", "\n"), "views.yaml")
    assert a.filter_spec() == b.filter_spec()


def test_comparisons_are_spelt_one_way_in_specs():
    a, b = parse_views("a: {bucket: runs, properties: {n: '>=3'}}\nb: {bucket: runs, properties: {n: ' >= 3'}}",
                       "views.yaml")
    assert a.filter_spec() == b.filter_spec()
    assert View.from_filter_spec("v", {"bucket": "runs", "tags": {"n": ["1..2"]}}).tags == {"n": ("1 .. 2",)}


@pytest.mark.parametrize("spec,complaint", [
    ({"bucket": "runs", "any": {"size": [1, None]}}, "`any` must be a non-empty list of rule blocks"),
    ({"bucket": "runs", "not": []}, "`not` must be a non-empty list of rule blocks"),
    ({"bucket": "runs", "any": [{}]}, "a block of `any` has no rule"),
    ({"bucket": "runs", "any": [{"bucket": "x"}]}, "unknown keys ['bucket'] in a block of `any`"),
    ({"bucket": "runs", "not": ["x"]}, "a block of `not` must be a mapping"),
    ({"bucket": "runs", "tags": {"n": ["> x"]}}, "`tags` 'n': '> x' starts with '>', but 'x' is not a number"),
    ({"bucket": "runs", "metadata": {"n": "x"}}, "metadata key 'n' must map to a non-empty list"),
    ({"bucket": "runs", "object": "{a,b}{c,d}{e,f}{g,h}{i,j}{k,l}{m,n}{o,p}{q,r}"},
     "braces expand to more than 256 alternatives"),
])
def test_malformed_new_rules_in_specs_raise_value_errors(spec, complaint):
    with pytest.raises(ValueError) as caught:
        View.from_filter_spec("v", spec)
    assert complaint in str(caught.value)


# ---- the tag pre-test: objects whose tags are not known yet ----

PRETEST = parse_views("""
by_meta:
  bucket: runs
  metadata: {sample: "S*"}
by_tag:
  bucket: runs
  object: "*.bam"
  tags: {stage: raw}
either:
  bucket: runs
  properties: {lane: ">= 3"}
unless_tagged:
  bucket: runs
  object: "*.txt"
  not: {tags: {hidden: "true"}}
plain:
  bucket: runs
  object: "*.txt"
meta_only:
  bucket: notes
  metadata: {kind: memo}
""", "views.yaml")


def test_match_partial_tells_definite_from_undecided_views():
    matcher = compile_views(PRETEST)
    # tags are ignored: only key, size, mtime and metadata count
    bam = obj(key="x.bam", metadata={"sample": "S1"}, tags={"stage": "raw"})
    assert matcher.match_partial(bam, NOW) == ([0], [1, 2])
    # a `properties` rule satisfied by the metadata needs no tags
    assert matcher.match_partial(obj(key="x.bam", metadata={"lane": "4"}), NOW) == ([2], [1])
    assert matcher.match_partial(obj(key="x.txt", metadata={"lane": "4"}), NOW) == ([2, 4], [3])
    assert matcher.match_partial(obj(key="x.csv", metadata={"lane": "4"}), NOW) == ([2], [])
    assert matcher.match_partial(obj(bucket="notes", key="m", metadata={"kind": "memo"}), NOW) == ([5], [])
    assert matcher.match_partial(obj(bucket="logs"), NOW) == ([], [])


def test_tags_could_matter_is_the_handlers_question_in_one_call_per_batch():
    matcher = compile_views(PRETEST)
    objs = [obj(key="x.bam"),                                    # by_tag depends on the stage tag
            obj(key="x.csv", metadata={"lane": "4"}),            # either holds by the metadata
            obj(key="x.csv"),                                    # either: the lane tag could hold
            obj(key="x.csv", metadata={"lane": "1", "sample": "S2"}),   # a tag lane could still hold
            obj(bucket="notes", key="m"),                        # metadata-only views
            obj(bucket="logs")]                                  # no view
    assert matcher.tags_could_matter_batch(objs, NOW) == [True, False, True, True, False, False]
    assert [matcher.tags_could_matter(o, NOW) for o in objs] == matcher.tags_could_matter_batch(objs, NOW)
    partial = matcher.match_partial_batch(objs, NOW)
    assert [bool(undecided) for _, undecided in partial] == matcher.tags_could_matter_batch(objs, NOW)
    assert partial == [reference.match_partial(PRETEST, o, NOW) for o in objs]
    assert matcher.tags_could_matter_batch([], NOW) == [] == matcher.match_partial_batch([], NOW)


def test_needs_tags_only_for_buckets_whose_views_read_tags():
    matcher = compile_views(PRETEST)
    assert matcher.needs_tags("runs") and not matcher.needs_tags("notes") and not matcher.needs_tags("logs")
    assert matcher.needs_metadata("runs") and matcher.needs_metadata("notes") and not matcher.needs_metadata("logs")
    only_not = compile_views(parse_views("v: {bucket: b1b, not: {tags: {x: y}}}", "views.yaml"))
    assert only_not.needs_tags("b1b")
    assert matcher.property_keys == frozenset({"sample", "stage", "lane", "hidden", "kind"})


def test_without_undecided_views_the_answer_is_the_same_whatever_the_tags():
    matcher = compile_views(PRETEST)
    for base in (obj(key="x.csv", metadata={"lane": "4"}), obj(key="x.bam", metadata={"lane": "7", "sample": "S"})):
        definite, undecided = matcher.match_partial(base, NOW)
        for tags in ({}, {"stage": "raw"}, {"lane": "1"}, {"hidden": "true"}, {"STAGE": "raw", "lane": "x"}):
            answer = matcher.match(obj(key=base.key, metadata=base.metadata, tags=tags), NOW)
            assert set(definite) <= set(answer) <= set(definite) | set(undecided)


def test_views_without_the_newer_rules_keep_their_ids():
    """The handler stores views by id: the ids of views registered before tags, metadata,
    any and not existed must not change (these are the ids the first version gave)."""
    a, b, c = parse_views("""
        a: {bucket: runs, object: 'x/*.bam', size: '1 KiB .. 1 MiB', modified: '< 7d', properties: {gone: ~}}
        b: {bucket: runs}
        c: {bucket: runs, properties: {lane: 2, s: 'S1*'}}
    """.replace("\n        ", "\n"), "views.yaml")
    assert [view_id(v.filter_spec()) for v in (a, b, c)] == ["37edfffc56acedcf", "79d935f6e6f25e64",
                                                             "a5bffba2cc975da7"]
