"""Loading views files: what valid files give, and every problem of an invalid one, with its place."""
import textwrap

import pytest

from rulesets import Problem, View, ViewsError, load_views, parse_views


def views_of(text: str) -> list[View]:
    return parse_views(textwrap.dedent(text), "views.yaml")


def problems_of(text: str) -> list[str]:
    with pytest.raises(ViewsError) as caught:
        parse_views(textwrap.dedent(text), "views.yaml")
    assert str(caught.value) == "\n".join(str(p) for p in caught.value.problems)
    return [str(p) for p in caught.value.problems]


def test_a_full_view():
    (view,) = views_of("""
        gecko:
          bucket: genomes
          object: "gecko/*.fasta"
          size: ">= 1 KiB"
          modified: "< 7d"
          accessed: "> 1h"
          properties:
            Color: [black, green]
            sample: "S1*"
          layout: flat
          root: "gecko/"
          set: {color: green}
          ttl: 500ms
          writable: false
    """)
    assert view.name == "gecko" and view.bucket == "genomes" and view.object == "gecko/*.fasta"
    assert view.size == (1024, None)
    assert view.modified.kind == "age" and view.modified.hi == 7 * 86400
    assert view.accessed.lo == 3600 and view.accessed.lo_open
    assert view.properties == {"color": ("black", "green"), "sample": ("S1*",)}
    assert (view.layout, view.root, view.set, view.ttl, view.writable) == (
        "flat", "gecko/", {"color": "green"}, 0.5, False)


def test_defaults_and_file_order():
    first, second = views_of("""
        zeta:
          bucket: runs
          object: "run42/lane[0-9]/*.fastq"
          properties: {stage: raw, Lane: 2, sample: "S*", gone: ~, color: [a, b], esc: "a\\\\*"}
        alpha:
          bucket: "runs-*"
    """)
    assert [first.name, second.name] == ["zeta", "alpha"]
    assert first.root == "run42/"                 # literal start of object, cut at its last /
    assert first.set == {"stage": "raw", "Lane": "2", "esc": "a*"}   # single literal values only
    assert (first.layout, first.ttl, first.writable) == ("tree", 2.0, True)
    assert second.root == "" and second.object is None and second.set == {}


def test_yaml_scalars_match_as_written():
    (view,) = views_of("""
        v:
          bucket: runs
          properties:
            lane: 2
            flag: True
            ratio: 0.50
            padded: 007
            absent: null
            empty:
            list: [1, ~]
    """)
    assert view.properties == {"lane": ("2",), "flag": ("true",), "ratio": ("0.50",),
                               "padded": ("007",), "absent": (None,), "empty": (None,),
                               "list": ("1", None)}


def test_view_names_become_directories():
    problems = problems_of("""
        "a/b": {bucket: runs}
        ".": {bucket: runs}
        "..": {bucket: runs}
        "": {bucket: runs}
        "nul\\0": {bucket: runs}
        ok: {bucket: runs}
        ok: {bucket: runs}
    """)
    assert [p.split(": ")[0] for p in problems] == [f"views.yaml:{n}:1" for n in range(2, 9) if n != 7]
    assert "contains /" in problems[0] and "contains NUL" in problems[4]
    assert "duplicate view name 'ok' (first defined at line 7)" in problems[5]


def test_every_problem_is_reported_at_once_with_its_place():
    problems = problems_of("""
        gecko:
          bucket: genomes
          objct: "*.fasta"
          size: "huge"
          size: "< 1"
          modified: "< 7 days"
          properties:
            color: black
            Color: green
          layout: tre
        nobucket:
          object: "*"
    """)
    assert problems == [
        "views.yaml:4:3: unknown key 'objct' in view 'gecko'; did you mean 'object'? allowed: bucket, "
        "object, size, modified, accessed, properties, layout, root, set, ttl, writable",
        "views.yaml:5:9: bad `size`: cannot read 'huge' as a number with a unit; allowed: \"< N\", "
        "\"<= N\", \"> N\", \">= N\", \"N .. M\" (inclusive) or \"N\" (exactly), where N is bytes or a "
        "number with a unit B, KiB, MiB, GiB, TiB, KB, MB, GB, TB",
        "views.yaml:6:3: duplicate key 'size' in view 'gecko' (first at line 5); each key may appear once",
        "views.yaml:7:13: bad `modified`: unknown unit 'days' in '7 days'; allowed: an age \"< 7d\", "
        "\"<= 12h\", \"> 30m\", \">= 2w\", \"1d .. 7d\" (units s m h d w), or ISO-8601 dates/times "
        "\"2026-01-01 .. 2026-02-01T12:00\", \">= 2026-01-01\", \"< 2026-03-01T08:00:00+01:00\"",
        "views.yaml:10:5: duplicate property 'Color' (first at line 9; names are compared "
        "case-insensitively): a key may appear once; to accept several values write a list: "
        "color: [black, green]",
        "views.yaml:11:11: unknown layout 'tre'; allowed: tree, flat",
        "views.yaml:12:1: view 'nobucket' has no `bucket`; every view needs one (a bucket name or a "
        "glob such as 'runs-*')",
    ]


def test_duplicate_properties_point_to_the_list_form_with_all_values():
    problems = problems_of("""
        v:
          bucket: runs
          properties:
            color: black
            color: [green, blue]
            COLOR: red
    """)
    assert problems[0].startswith("views.yaml:6:5: duplicate property 'color'")
    assert problems[0].endswith("write a list: color: [black, green, blue]")
    assert problems[1].endswith("write a list: color: [black, green, blue, red]")


@pytest.mark.parametrize("text,where,complaint", [
    ("[a, b]", "1:1", "must be a mapping of view names to rules, found a list"),
    ("just text", "1:1", "found 'just text'"),
    ("", "1:1", "found an empty file"),
    ("v: [1,\n", "2:1", "YAML syntax error: expected the node content"),
    ("v:\n  bucket: runs\n   bad: indent", "3:7", "YAML syntax error: mapping values are not allowed here"),
    ("v:", "1:1", "view 'v' must be a mapping of rules (at least `bucket:`), found nothing (null)"),
    ("v: {bucket: [a, b]}", "1:13", "`bucket` must be a single value, found a list"),
    ("v: {bucket: Runs}", "1:13", "'Runs' is not a valid bucket name"),
    ("v: {bucket: runs, object: ''}", "1:27", "`object` is empty"),
    ("v: {bucket: runs, properties: [a]}", "1:31", "`properties` must be a mapping"),
    ("v: {bucket: runs, properties: {a: {b: c}}}", "1:35", "must be a value, a list of values or null"),
    ("v: {bucket: runs, properties: {a: []}}", "1:35", "empty list, which matches nothing"),
    ("v: {bucket: runs, properties: {a: [[x]]}}", "1:36", "each value of property 'a' must be a single value"),
    ("v: {bucket: runs, writable: 1}", "1:29", "`writable` must be true or false, found '1'"),
    ("v: {bucket: runs, ttl: 2 days}", "1:24", "bad `ttl`"),
    ("v: {bucket: runs, object: 'a/*', root: b/}", "1:40", "root 'b/' is not a prefix of every key"),
    ("v: {bucket: runs, root: b/}", "1:25", "or add object: 'b/*'"),
    ("v: {bucket: runs, object: 'a/b*', root: a}", "1:41", "must end with '/'"),
    ("v: {bucket: runs, properties: {s: raw}, set: {S: cooked}}", "1:50",
     "`set` gives S='cooked', but the view's properties accept only ['raw']"),
    ("v: {bucket: runs, properties: {s: ~}, set: {s: x}}", "1:48", "accept only [None]"),
    ("v: {bucket: runs, set: {s: x, S: y}}", "1:31", "duplicate key 'S' in `set`"),
    ("v: {bucket: runs, set: [a]}", "1:24", "`set` must be a mapping"),
    ("v: {bucket: runs, <<: [a]}", "1:24", "`<<` merges a mapping"),
    ("v: {bucket: runs, ? [a] : b}", "1:21", "a rule name must be a plain text, found a list"),
])
def test_single_problems(text, where, complaint):
    (problem,) = problems_of(text)
    assert problem.startswith(f"views.yaml:{where}: ") and complaint in problem, problem


def test_unknown_key_without_a_close_match_lists_what_is_allowed():
    (problem,) = problems_of("v: {bucket: runs, zzzzzz: 1}")
    assert "did you mean" not in problem and "allowed: bucket, object" in problem


def test_set_matching_a_glob_property_is_fine():
    (view,) = views_of("v: {bucket: runs, properties: {sample: 'S*'}, set: {sample: S17}}")
    assert view.set == {"sample": "S17"}


def test_merge_keys_share_rules_and_explicit_keys_win():
    base, derived = views_of("""
        base: &base
          bucket: runs
          size: "< 10"
        derived:
          <<: *base
          size: "> 10"
    """)
    assert derived.bucket == "runs" and derived.size == (11, None) and base.size == (0, 9)


def test_load_views_reads_files_and_reports_unreadable_ones(tmp_path):
    path = tmp_path / "views.yaml"
    path.write_text("v:\n  bucket: runs\n")
    assert [v.name for v in load_views(path)] == ["v"]
    with pytest.raises(ViewsError) as caught:
        load_views(tmp_path / "missing.yaml")
    (problem,) = caught.value.problems
    assert problem.file.endswith("missing.yaml") and "cannot read the views file" in problem.message
    path.write_text("v: {size: 1}\n")
    with pytest.raises(ViewsError) as caught:
        load_views(path)
    assert caught.value.problems == [Problem(str(path), 1, 1, "view 'v' has no `bucket`; every view "
                                             "needs one (a bucket name or a glob such as 'runs-*')")]
