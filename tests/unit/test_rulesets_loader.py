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
          bucket: "runs-2"
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
        "object, size, modified, properties, tags, metadata, any, not, layout, root, set, ttl, writable, write",
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
        "views.yaml:11:11: unknown layout 'tre'; allowed: tree, flat, or {by: [property, ...]}",
        "views.yaml:12:1: view 'nobucket' has no `bucket`; every view needs one (the name of an S3 "
        "bucket, such as 'runs')",
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
                                             "needs one (the name of an S3 bucket, such as 'runs')")]


def test_any_not_tags_metadata_braces_and_comparisons():
    (view,) = views_of("""
        reads:
          bucket: runs
          object: "run42/*.{fastq,fq}.gz"
          properties: {lane: ">=3", ratio: "0.5..1", literal: '\\> 2'}
          tags: {Stage: raw}
          metadata: {score: "< 1e3"}
          any:
            - {size: "> 1 MiB"}
            - tags: {keep: "yes"}
              modified: "< 1d"
          not: {object: "*/tmp/*"}
    """)
    assert view.object == "run42/*.{fastq,fq}.gz" and view.root == "run42/"
    assert view.properties == {"lane": (">= 3",), "ratio": ("0.5 .. 1",), "literal": ("\\> 2",)}
    assert view.tags == {"stage": ("raw",)} and view.metadata == {"score": ("< 1e3",)}
    assert [block.spec() for block in view.any_of] == [
        {"size": [2**20 + 1, None]},
        {"modified": {"kind": "age", "lo": None, "hi": 86400.0, "lo_open": False, "hi_open": True},
         "tags": {"keep": ["yes"]}}]
    assert [block.object for block in view.none_of] == ["*/tmp/*"]
    # files get the single literal values of `properties` and `tags`; a comparison is none
    assert view.set == {"literal": "> 2", "Stage": "raw"}
    assert view.reads_tags and view.reads_metadata and view.is_time_dependent


def test_accessed_is_refused_where_it_is_written():
    problems = problems_of("""
        v:
          bucket: runs
          accessed: "< 7d"
          any:
            - {accessed: "> 1h", size: 1}
    """)
    assert problems == [
        "views.yaml:4:3: `accessed` in view 'v' cannot be used: S3 records no access time, so no rule "
        "can select by it; use `modified` (the time of the last write) instead",
        "views.yaml:6:8: `accessed` in block 1 of `any` in view 'v' cannot be used: S3 records no access "
        "time, so no rule can select by it; use `modified` (the time of the last write) instead",
    ]


@pytest.mark.parametrize("bucket", ["runs-*", "lab-?", "[ab]-runs", "runs-{a,b}", "run\\\\s"])
def test_bucket_globs_are_refused_like_the_handler_does(bucket):
    (problem,) = problems_of(f'v: {{object: "*", bucket: "{bucket}"}}')
    assert problem.startswith("views.yaml:1:26: bucket ") and problem.endswith(
        " is a glob: bucket globs are not supported by the handler yet; name the bucket (one view per bucket)")


@pytest.mark.parametrize("text,where,complaint", [
    ("v: {bucket: runs, any: {size: 1}}", "1:24", "`any` in view 'v' must be a list of blocks of rules, "
                                                  "like `any: [{object: '*.bam'}, {size: '> 1 GiB'}]`; found a mapping"),
    ("v: {bucket: runs, any: []}", "1:24", "`any` in view 'v' has an empty list"),
    ("v: {bucket: runs, not: []}", "1:24", "`not` in view 'v' has an empty list; give one block of rules or a list"),
    ("v: {bucket: runs, not: x}", "1:24", "`not` in view 'v' must be one block of rules or a list of blocks"),
    ("v: {bucket: runs, any: [x]}", "1:25", "block 1 of `any` in view 'v' must be a mapping of rules (object, "
                                            "size, modified, properties, tags, metadata), found 'x'"),
    ("v: {bucket: runs, any: [{size: 1}, {}]}", "1:36", "block 2 of `any` in view 'v' has no rule"),
    ("v: {bucket: runs, not: {objet: x}}", "1:25", "unknown key 'objet' in block 1 of `not` in view 'v'; "
                                                   "did you mean 'object'? allowed: object, size, modified, "
                                                   "properties, tags, metadata"),
    ("v: {bucket: runs, not: {bucket: x}}", "1:25", "unknown key 'bucket' in block 1 of `not`"),
    ("v: {bucket: runs, any: [{size: 1, size: 2}]}", "1:35", "duplicate key 'size' in block 1 of `any`"),
    ("v: {bucket: runs, any: [{size: huge}]}", "1:32", "bad `size`: cannot read 'huge'"),
    ("v: {bucket: runs, properties: {lane: '> three'}}", "1:38", "property 'lane': '> three' starts with '>', "
                                                                "but 'three' is not a number; allowed:"),
    ("v: {bucket: runs, tags: {lane: [x, '<']}}", "1:36", "tag 'lane': incomplete comparison '<'"),
    ("v: {bucket: runs, metadata: {n: '2 .. 1'}}", "1:33", "metadata key 'n': '2 .. 1' matches no value "
                                                          "(empty range)"),
    ("v: {bucket: runs, tags: {n: '> 1e12345'}}", "1:29", "the exponent of '1e12345' in '> 1e12345' is too large"),
    ("v: {bucket: runs, tags: [a]}", "1:25", "`tags` must be a mapping of tag names to values, found a list"),
    ("v: {bucket: runs, metadata: {a: x, A: y}}", "1:36", "duplicate metadata key 'A'"),
    ("v: {bucket: runs, object: '{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}'}", "1:27",
     "`object` '{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}': braces expand to more than 256 alternatives; "
     "allowed: at most 256"),
    ("v: {bucket: runs, tags: {n: '>= 3'}, set: {n: 2}}", "1:47", "`set` gives n='2', but the view's tags "
                                                                  "accept only ['>= 3']"),
    ('v: {bucket: runs, properties: {n: "\\> 2"}}', "1:37", "in double quotes a backslash starts a YAML escape: "
                                                          "write a value with a backslash in single quotes"),
])
def test_problems_of_the_new_rules(text, where, complaint):
    (problem,) = problems_of(text)
    assert problem.startswith(f"views.yaml:{where}: ") and complaint in problem, problem


def test_values_that_are_not_comparisons_stay_globs():
    (view,) = views_of("""
        v:
          bucket: runs
          properties: {a: "a..b", b: "1 .. x", c: "=3", d: "3", e: '\\<none>'}
          set: {n: 4, d: "3"}
          tags: {n: [">= 3", "none"]}
    """)
    assert view.properties == {"a": ("a..b",), "b": ("1 .. x",), "c": ("=3",), "d": ("3",), "e": ("\\<none>",)}
    assert view.set == {"n": "4", "d": "3"}


def test_layout_by_properties():
    tree, flat, by, one = views_of("""
        tree: {bucket: runs}
        flat: {bucket: runs, layout: flat}
        by:
          bucket: runs
          layout: {by: [Sample, lane]}
        one: {bucket: runs, layout: {by: run id}}
    """)
    assert (tree.layout, tree.layout_by) == ("tree", None)
    assert (flat.layout, flat.layout_by) == ("flat", None)
    assert (by.layout, by.layout_by) == ("flat", ("sample", "lane"))   # files named as in flat
    assert (one.layout, one.layout_by) == ("flat", ("run id",))


def test_problems_of_layout_by():
    problems = problems_of("""
        a: {bucket: runs, layout: {by: []}}
        b: {bucket: runs, layout: {}}
        c: {bucket: runs, layout: {bye: [x]}}
        d: {bucket: runs, layout: {by: [x, X, "a;b", "aws:k", [y], ~]}}
        e: {bucket: runs, layout: [x]}
    """)
    assert problems == [
        "views.yaml:2:32: `by` in `layout` has an empty list; name at least one property, "
        "like `layout: {by: [sample, lane]}`",
        "views.yaml:3:27: `layout` is an empty mapping; allowed: tree, flat, or {by: [property, ...]}",
        "views.yaml:4:28: unknown key 'bye' in `layout`; did you mean 'by'? allowed: by",
        "views.yaml:5:36: property 'X' appears twice in `by` of `layout` (first at line 5; names are "
        "compared case-insensitively): each gives one directory level",
        "views.yaml:5:39: `by` in `layout`: 'a;b' is not a property name; allowed: 1-128 letters, "
        "digits, spaces and + - = . _ : / @ (what S3 allows in a tag key)",
        "views.yaml:5:46: `by` in `layout`: 'aws:k' is not a property name: the prefix 'aws:' is "
        "reserved by S3",
        "views.yaml:5:55: each property of `by` in `layout` (like `layout: {by: [sample, lane]}`) "
        "must be a single value, found a list",
        "views.yaml:5:60: each property of `by` in `layout` (like `layout: {by: [sample, lane]}`) "
        "must be a single value, found nothing (null)",
        "views.yaml:6:27: `layout` must be tree, flat or a mapping with `by`, found a list",
    ]


def test_a_write_policy_names_the_files_written_back_eagerly():
    workflow, one, plain = views_of("""
        workflow:
          bucket: runs
          object: "results/*"
          write:
            eager: [".snakemake/*", "*.log"]
        one: {bucket: runs, object: "tmp/*", write: {eager: "*.part"}}
        plain: {bucket: runs, object: "results/*"}
    """)
    assert workflow.eager_writes == (".snakemake/*", "*.log") and one.eager_writes == ("*.part",)
    assert plain.eager_writes == ()
    assert workflow.writes_eagerly("results/.snakemake/metadata/a")
    assert workflow.writes_eagerly("results/logs/deep/a.log")       # `*` crosses '/'
    assert not workflow.writes_eagerly("results/a.bam")
    assert not workflow.writes_eagerly("other/.snakemake/x")        # below the root only
    assert not plain.writes_eagerly("results/a.log")
    # an option of the mount, no part of the filter: the view keeps its id at the handler
    assert workflow.filter_spec() == plain.filter_spec() | {"bucket": "runs"}


def test_problems_of_a_write_policy():
    problems = problems_of("""
        a: {bucket: runs, write: [x]}
        b: {bucket: runs, write: {}}
        c: {bucket: runs, write: {eagr: [x]}}
        d: {bucket: runs, write: {eager: []}}
        e: {bucket: runs, write: {eager: ["/x", "", [y], ~, "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}"]}}
        f: {bucket: runs, writable: false, write: {eager: "*"}}
    """)
    assert problems == [
        "views.yaml:2:26: `write` must be a mapping, like `write: {eager: ['.snakemake/*', "
        "'*.log']}`; found a list",
        "views.yaml:3:26: `write` is an empty mapping; give `eager`, like `write: {eager: "
        "['.snakemake/*', '*.log']}`",
        "views.yaml:4:27: unknown key 'eagr' in `write`; did you mean 'eager'? allowed: eager",
        "views.yaml:5:34: `eager` in `write` has an empty list; give at least one glob, like "
        "`write: {eager: ['.snakemake/*', '*.log']}`",
        "views.yaml:6:35: `eager` glob '/x' in `write` must name a path below the view's "
        "directory, such as '.snakemake/*' (no leading '/')",
        "views.yaml:6:41: `eager` glob '' in `write` must name a path below the view's "
        "directory, such as '.snakemake/*' (no leading '/')",
        "views.yaml:6:45: each glob of `eager` in `write` (like `write: {eager: ['.snakemake/*', "
        "'*.log']}`) must be a single value, found a list",
        "views.yaml:6:50: each glob of `eager` in `write` (like `write: {eager: ['.snakemake/*', "
        "'*.log']}`) must be a single value, found nothing (null)",
        "views.yaml:6:53: `eager` glob in `write` '{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}': "
        "braces expand to more than 256 alternatives; allowed: at most 256 (use fewer or shorter "
        "lists, or a wildcard)",
        "views.yaml:7:43: `write` in a view with `writable: false`: nothing is written through "
        "it; drop one of the two",
    ]
