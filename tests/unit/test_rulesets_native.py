"""The compiled matcher (native/matcher.c) gives the reference's answers (rulesets.reference)
for random views and objects: match, match_batch and next_flip."""
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rulesets import ObjectInfo, TimeRule, View, compile_views
from rulesets import reference

KEY_CHARS = st.sampled_from(list("ab/._é"))
PATTERN_PARTS = st.sampled_from(list("ab/._é") + ["*", "?", "[ab]", "[!a]", "\\*", "a/", ".b"])
keys = st.lists(KEY_CHARS, max_size=8).map("".join)
globs = st.lists(PATTERN_PARTS, max_size=6).map("".join)
values = st.sampled_from(["x", "y", "X", "2", "true", "é", ""])
value_globs = st.sampled_from(["x", "y", "X", "*", "?", "[xy]", "2", "tru*", "é", ""])
prop_names = st.sampled_from(["k", "color", "lane"])
cased_names = st.sampled_from(["k", "K", "color", "Color", "lane", "LANE", "other"])
times = st.one_of(st.integers(0, 40).map(float), st.floats(0, 40, allow_nan=False))
sizes = st.integers(0, 40)


@st.composite
def time_rules(draw):
    kind = draw(st.sampled_from(["age", "time"]))
    lo = draw(st.one_of(st.none(), times))
    hi = draw(st.one_of(st.none(), times))
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    return TimeRule(kind, lo, hi, draw(st.booleans()), draw(st.booleans()))


@st.composite
def views(draw):
    size = None
    if draw(st.booleans()):
        lo = draw(sizes)
        size = (lo, draw(st.one_of(st.none(), st.integers(lo, 45))))
    properties = draw(st.dictionaries(
        prop_names, st.lists(st.one_of(st.none(), value_globs), min_size=1, max_size=3).map(tuple),
        max_size=2))
    return View(
        name="v",
        bucket=draw(st.sampled_from(["b1", "b2", "b*", "b?", "[bc]1"])),
        object=draw(st.one_of(st.none(), globs)),
        size=size,
        modified=draw(st.one_of(st.none(), time_rules())),
        accessed=draw(st.one_of(st.none(), time_rules())),
        properties=properties,
    )


objects = st.builds(
    ObjectInfo,
    bucket=st.sampled_from(["b1", "b2", "c1", "bb"]),
    key=keys,
    size=sizes,
    mtime=times,
    atime=st.one_of(st.none(), times),
    tags=st.dictionaries(cased_names, values, max_size=3),
    metadata=st.dictionaries(cased_names, values, max_size=2),
)


@settings(max_examples=250, deadline=None)
@given(st.lists(views(), min_size=1, max_size=12), st.lists(objects, min_size=1, max_size=8),
       st.one_of(times, st.floats(0, 100, allow_nan=False)))
def test_native_matches_like_the_reference(view_list, objs, now):
    matcher = compile_views(view_list)
    expected = [reference.match(view_list, obj, now) for obj in objs]
    assert [matcher.match(obj, now) for obj in objs] == expected
    assert matcher.match_batch(objs, now) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(views(), min_size=1, max_size=8), objects, times)
def test_native_next_flip_like_the_reference_and_nothing_changes_before_it(view_list, obj, now):
    matcher = compile_views(view_list)
    flip = matcher.next_flip(obj, now)
    assert flip == reference.next_flip(view_list, obj, now)
    answer = matcher.match(obj, now)
    if flip is None:
        assert matcher.match(obj, now + 1e6) == answer
        return
    assert flip > now
    for before in (math.nextafter(flip, -math.inf), (now + flip) / 2):
        if before > now:
            assert matcher.match(obj, before) == answer


@settings(max_examples=100, deadline=None)
@given(st.lists(views(), min_size=1, max_size=8), st.sampled_from(["b1", "b2", "c1", "bb"]))
def test_bucket_questions_agree_with_the_views(view_list, bucket):
    matcher = compile_views(view_list)
    on_bucket = [v for v in view_list if reference.bucket_matches(v, bucket)]
    assert matcher.names_bucket(bucket) == bool(on_bucket)
    assert matcher.needs_tags(bucket) == any(v.properties for v in on_bucket)


short_texts = st.text(alphabet="ab/", max_size=5)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(short_texts, st.sampled_from(["{}*", "*{}", "{}*a", "b*{}", "{}"])),
                min_size=1, max_size=30),
       st.lists(st.text(alphabet="ab/", max_size=7), min_size=1, max_size=10))
def test_index_of_nested_literal_prefixes_and_suffixes(shapes, keys):
    """Many views whose literal ends nest (a, ab, aba, ...): the index walks long chains."""
    view_list = [View(name=f"v{i}", bucket="b1", object=shape.format(text))
                 for i, (text, shape) in enumerate(shapes)]
    matcher = compile_views(view_list)
    objs = [ObjectInfo("b1", key, 1, 0.0) for key in keys]
    assert matcher.match_batch(objs, 0.0) == [reference.match(view_list, o, 0.0) for o in objs]
