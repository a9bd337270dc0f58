"""The compiled matcher (native/matcher.c) gives the reference's answers (rulesets.reference)
for random views and objects: match, match_batch, the partial answers without tags, and
next_flip."""
import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from rulesets import ObjectInfo, TimeRule, View, compile_views
from rulesets import reference
from rulesets.expressions import NUMBER, parse_comparison
from rulesets.globs import expand_braces
from rulesets.model import RuleBlock

KEY_CHARS = st.sampled_from(list("ab/._é{},"))
PATTERN_PARTS = st.sampled_from(list("ab/._é") + ["*", "?", "[ab]", "[!a]", "\\*", "a/", ".b", "{a,b}",
                                                  "{a/,.b,}", "{é,a{b,_}}", "\\{a,b}", "{", ","])
keys = st.lists(KEY_CHARS, max_size=8).map("".join)


def _expandable(pattern: str) -> bool:
    """The loader refuses patterns whose braces expand to too many alternatives."""
    try:
        expand_braces(pattern)
    except ValueError:
        return False
    return True


globs = st.lists(PATTERN_PARTS, max_size=6).map("".join).filter(_expandable)
values = st.sampled_from(["x", "y", "X", "2", "2.0", "-1", "1e1", "10", ".5", "3", "true", "é", "", "> 2"])
value_globs = st.sampled_from(["x", "y", "X", "*", "?", "[xy]", "2", "tru*", "é", "", "{x,2}", "{,y}",
                               ">= 2", "< 1.5", "0 .. 2", "> -1", "<= 1e1", "2 .. 2", "\\> 2"])
prop_names = st.sampled_from(["k", "color", "lane"])
cased_names = st.sampled_from(["k", "K", "color", "Color", "lane", "LANE", "other"])
times = st.one_of(st.integers(0, 40).map(float), st.floats(0, 40, allow_nan=False))
sizes = st.integers(0, 40)
accepted_values = st.lists(st.one_of(st.none(), value_globs), min_size=1, max_size=3).map(tuple)
property_rules = st.dictionaries(prop_names, accepted_values, max_size=2)


@st.composite
def time_rules(draw):
    kind = draw(st.sampled_from(["age", "time"]))
    lo = draw(st.one_of(st.none(), times))
    hi = draw(st.one_of(st.none(), times))
    if lo is not None and hi is not None and lo > hi:
        lo, hi = hi, lo
    return TimeRule(kind, lo, hi, draw(st.booleans()), draw(st.booleans()))


size_rules = sizes.flatmap(lambda lo: st.tuples(st.just(lo), st.one_of(st.none(), st.integers(lo, 45))))
some_property_rules = st.dictionaries(prop_names, accepted_values, min_size=1, max_size=2)
# blocks of `any`/`not`: one or two rules each, cheap to draw
one_rule_blocks = st.one_of(
    st.builds(RuleBlock, object=globs), st.builds(RuleBlock, size=size_rules),
    st.builds(RuleBlock, modified=time_rules()), st.builds(RuleBlock, properties=some_property_rules),
    st.builds(RuleBlock, tags=some_property_rules), st.builds(RuleBlock, metadata=some_property_rules))
blocks = st.one_of(one_rule_blocks, st.tuples(one_rule_blocks, one_rule_blocks).map(
    lambda pair: RuleBlock(**{k: v for block in pair for k, v in vars(block).items() if v})))
optional_property_rules = st.one_of(st.just({}), some_property_rules)


@st.composite
def views(draw):
    size = None
    if draw(st.booleans()):
        lo = draw(sizes)
        size = (lo, draw(st.one_of(st.none(), st.integers(lo, 45))))
    return View(
        name="v",
        bucket=draw(st.sampled_from(["b1", "b2", "b*", "b?", "[bc]1", "{b,c}1"])),
        object=draw(st.one_of(st.none(), globs)),
        size=size,
        modified=draw(st.one_of(st.none(), time_rules())),
        properties=draw(property_rules),
        tags=draw(optional_property_rules),
        metadata=draw(optional_property_rules),
        any_of=tuple(draw(st.one_of(st.just([]), st.lists(blocks, min_size=1, max_size=2)))),
        none_of=tuple(draw(st.one_of(st.just([]), st.lists(blocks, min_size=1, max_size=2)))),
    )


objects = st.builds(
    ObjectInfo,
    bucket=st.sampled_from(["b1", "b2", "c1", "bb"]),
    key=keys,
    size=sizes,
    mtime=times,
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


@settings(max_examples=150, deadline=None)
@given(st.lists(views(), min_size=1, max_size=8), st.lists(objects, min_size=1, max_size=6),
       st.lists(st.dictionaries(cased_names, values, max_size=3), min_size=1, max_size=4), times)
def test_partial_answers_without_tags_like_the_reference_and_true_for_every_tags(view_list, objs, tag_sets, now):
    matcher = compile_views(view_list)
    partial = matcher.match_partial_batch(objs, now)
    assert partial == [reference.match_partial(view_list, obj, now) for obj in objs]
    assert matcher.tags_could_matter_batch(objs, now) == [bool(undecided) for _, undecided in partial]
    for obj, (definite, undecided) in zip(objs, partial):
        for tags in tag_sets:
            tagged = ObjectInfo(obj.bucket, obj.key, obj.size, obj.mtime, None, tags, obj.metadata)
            answer = set(matcher.match(tagged, now))
            assert set(definite) <= answer <= set(definite) | set(undecided)


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


@settings(max_examples=300, deadline=None)
@given(st.lists(views(), min_size=1, max_size=8), objects, times)
def test_next_flip_with_tags_unknown_like_the_reference_and_no_partial_answer_changes_before_it(
        view_list, obj, now):
    """An object whose tags were not fetched (they could not change its answer) must be
    looked at again when they may start to: the next flip with the tags unknown."""
    matcher = compile_views(view_list)
    flip = matcher.next_flip(obj, now, tags_unknown=True)
    assert flip == reference.next_flip(view_list, obj, now, tags_unknown=True)
    answer = matcher.match_partial(obj, now)
    if flip is None:
        assert matcher.match_partial(obj, now + 1e6) == answer
        return
    assert flip > now
    for before in (math.nextafter(flip, -math.inf), (now + flip) / 2):
        if before > now:
            assert matcher.match_partial(obj, before) == answer


@settings(max_examples=100, deadline=None)
@given(st.lists(views(), min_size=1, max_size=8), st.sampled_from(["b1", "b2", "c1", "bb"]))
def test_bucket_questions_agree_with_the_views(view_list, bucket):
    matcher = compile_views(view_list)
    on_bucket = [v for v in view_list if reference.bucket_matches(v, bucket)]
    assert matcher.names_bucket(bucket) == bool(on_bucket)
    assert matcher.needs_tags(bucket) == any(v.reads_tags for v in on_bucket)
    assert matcher.needs_metadata(bucket) == any(v.reads_metadata for v in on_bucket)


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


digits = st.text("0012349", max_size=4)
numbers = st.one_of(
    st.builds("{}{}{}{}".format, st.sampled_from(["", "+", "-"]), digits,
              st.one_of(st.just(""), digits.map(".{}".format)),
              st.one_of(st.just(""), st.builds("{}{}{}".format, st.sampled_from("eE"),
                                                 st.sampled_from(["", "+", "-"]), digits.filter(bool)))
              ).filter(NUMBER.fullmatch),
    st.sampled_from(["0", "-0", "+0.0", "00012.3400", "1e3", "1000", "0.001", "1E-3", ".0", "5.", "-2.50e+1"]))
not_numbers = st.sampled_from(["", " 1", "1 ", "1e", "e1", ".", "-", "1.2.3", "0x10", "inf", "nan", "1_0", "١"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["<", "<=", ">", ">="]), numbers), min_size=1, max_size=4),
       st.lists(st.one_of(numbers, not_numbers), min_size=1, max_size=6))
def test_numeric_comparisons_are_exact_decimals(comparisons, texts):
    """C reads and orders numbers like Fraction: exactly, whatever their spelling."""
    view_list = [View(name=f"v{i}", bucket="b1", metadata={"n": (f"{op} {bound}",)})
                 for i, (op, bound) in enumerate(comparisons)]
    matcher = compile_views(view_list)
    objs = [ObjectInfo("b1", "k", 1, 0.0, None, {}, {"n": text}) for text in texts]
    for obj, answer in zip(objs, matcher.match_batch(objs, 0.0)):
        text = obj.metadata["n"]
        expected = []
        for i, (op, bound) in enumerate(comparisons):
            if NUMBER.fullmatch(text):
                x, y = Fraction(text), Fraction(bound)
                if {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]:
                    expected.append(i)
        assert answer == expected, (text, comparisons)
        assert answer == reference.match(view_list, obj, 0.0)


def test_huge_exponents_in_values_still_order_against_bounds():
    view_list = [View(name="big", bucket="b1", metadata={"n": ("> 1e9999",)}),
                 View(name="small", bucket="b1", metadata={"n": ("0 .. 1e-9999",)})]
    matcher = compile_views(view_list)
    texts = ["1e99999999999999999999", "-1e99999999999999999999", "1e-99999999999999999999", "9e9999", "1e9999"]
    objs = [ObjectInfo("b1", "k", 1, 0.0, None, {}, {"n": text}) for text in texts]
    assert matcher.match_batch(objs, 0.0) == [[0], [], [1], [0], []]
    assert parse_comparison("> 1e9999") is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(short_texts, short_texts, st.sampled_from(["{{{},{}}}*", "*{{{},{}}}", "{{{},{}}}*a{{b,}}",
                                                                     "b*{{{},{}}}", "{{{},{}}}", "{{{}*,*{}}}"])),
                min_size=1, max_size=30),
       st.lists(st.text(alphabet="ab/", max_size=7), min_size=1, max_size=10))
def test_index_of_brace_alternatives(shapes, keys):
    """A view is filed once per alternative's literal end; alternatives that nest (a, ab)
    must not make it match twice."""
    view_list = [View(name=f"v{i}", bucket="b1", object=shape.format(x, y))
                 for i, (x, y, shape) in enumerate(shapes)]
    matcher = compile_views(view_list)
    objs = [ObjectInfo("b1", key, 1, 0.0) for key in keys]
    assert matcher.match_batch(objs, 0.0) == [reference.match(view_list, o, 0.0) for o in objs]


def test_the_compiled_matcher_finds_a_view_once_even_under_nested_keys():
    from rulesets import _native

    block = (None, 0, None, None, ())
    matcher = _native.Matcher([(False, ("b1",), False, ("a", "ab", "abc", ""), block, (), ()),
                               (False, ("b1",), True, ("c", "bc"), block, (block,), ())])
    assert matcher.match(ObjectInfo("b1", "abc", 1, 0.0), 0.0) == [0, 1]
    assert matcher.match_partial_batch([ObjectInfo("b1", "abc", 1, 0.0)], 0.0) == [([0, 1], [])]


def test_malformed_native_specs_raise_instead_of_crashing():
    import pytest
    from rulesets import _native

    block = (None, 0, None, None, ())

    def view(**parts):
        spec = dict(bucket_is_glob=False, bucket=("b1",), by_suffix=False, keys=("",), rules=block,
                    any_of=(), none_of=())
        spec.update(parts)
        return tuple(spec.values())

    def rule(*values):
        return (None, 0, None, None, (("k", 3, values),))

    for spec, error in [
        (view(keys=()), ValueError),
        (view(bucket=("a", "b")), ValueError),
        (view(bucket=(1,)), TypeError),
        (view(rules=rule((3, ("x",)))), ValueError),
        (view(rules=rule((2, "x", False, None, False))), ValueError),
        (view(rules=rule((2, 1, False, None, False))), TypeError),
        (view(rules=rule((1, ("x",), True))), ValueError),
        (view(any_of=(block, rule((1, (None,))))), TypeError),
        (view(none_of=(block, (None, 0, None, (9, None, None, False, False), ()))), ValueError),
        (view(rules=("x",)), TypeError),
    ]:
        with pytest.raises(error):
            _native.Matcher([view(), spec])
