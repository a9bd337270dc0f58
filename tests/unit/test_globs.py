"""Glob semantics: the reference (rulesets.globs) by example, and the C matcher agreeing on
brace-free patterns (braces are expanded before compiling)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rulesets import _native
from rulesets.globs import (MAX_ALTERNATIVES, brace_free_match, escape, expand_braces, glob_match, is_literal,
                            literal_prefix, literal_suffix, unescape)

EXAMPLES = [
    ("*.fastq", "run42/lane3/sample_017_R1.fastq", True),   # * crosses /
    ("*.fastq", "x.fastq.gz", False),
    ("run?/x", "run4/x", True),
    ("run?/x", "run42/x", False),
    ("a.b", "axb", False),                                  # . is literal
    ("a+b", "a+b", True),
    ("a+b", "aab", False),
    ("[ab]x", "bx", True),
    ("[!ab]x", "bx", False),
    ("[!ab]x", "cx", True),
    ("[a-c]", "b", True),
    ("[]]", "]", True),                                     # ] first is literal
    ("[!]]", "a", True),
    ("[abc", "[abc", True),                                 # unclosed [ is literal
    ("\\*", "*", True),
    ("\\*", "x", False),
    ("?", "é", True),                                       # ? is one character, not one byte
    ("[é-ê]", "ê", True),
    ("", "", True),
    ("*", "", True),
    ("**a**", "xxaxx", True),
    ("a*b*c", "abbbc", True),
    ("a*b*c", "abbbcd", False),
    ("trailing\\", "trailing\\", True),
]
BRACE_EXAMPLES = [
    ("*.{fastq,fq}.gz", "a/b.fq.gz", True),
    ("*.{fastq,fq}.gz", "a/b.fastq.gz", True),
    ("*.{fastq,fq}.gz", "a/b.f.gz", False),
    ("run{1,2{a,b}}/x", "run2b/x", True),                   # nesting
    ("run{1,2{a,b}}/x", "run2/x", False),
    ("{,x}y", "y", True),                                   # an empty alternative
    ("{a}", "a", True),                                     # one alternative
    ("\\{a,b}", "{a,b}", True),                             # \{ is literal
    ("\\{a,b}", "a", False),
    ("{a,b", "{a,b", True),                                 # unclosed: literal
    ("a,b}", "a,b}", True),                                 # , and } outside braces: literal
    ("{[,}],x}", ",", True),                                # a class hides , and }
    ("{[,}],x}", "x", True),
    ("{a\\,b,c}", "a,b", True),                             # an escaped comma does not split
    ("{*.bam,*.bai}", "x/y.bai", True),
]


@pytest.mark.parametrize("pattern,text,expected", EXAMPLES + BRACE_EXAMPLES)
def test_reference_examples(pattern, text, expected):
    assert glob_match(pattern, text) is expected


@pytest.mark.parametrize("pattern,text,expected", EXAMPLES)
def test_native_examples(pattern, text, expected):
    assert _native.glob_match(pattern, text) is expected


@pytest.mark.parametrize("pattern,text,expected", BRACE_EXAMPLES)
def test_native_matches_the_expansions(pattern, text, expected):
    assert any(_native.glob_match(p, text) for p in expand_braces(pattern)) is expected


def test_expansions():
    assert expand_braces("*.{fastq,fq}.gz") == ("*.fastq.gz", "*.fq.gz")
    assert expand_braces("{a,b}{1,2}") == ("a1", "a2", "b1", "b2")
    assert expand_braces("x{a,{b,c}d}") == ("xa", "xbd", "xcd")
    assert expand_braces("{a,a}") == ("a",)
    assert expand_braces("{a,b") == ("{a,b",)              # left literal for brace_free_match
    assert expand_braces("\\{a,b}") == ("\\{a,b}",)
    assert expand_braces("{[,]x,y}") == ("[,]x", "y")
    assert len(expand_braces("{a,b}" * 8)) == MAX_ALTERNATIVES
    with pytest.raises(ValueError, match=f"more than {MAX_ALTERNATIVES} alternatives"):
        expand_braces("{a,b}" * 9)


PATTERN_CHARS = st.sampled_from(list("ab/.*?[]!-\\é{},") + ["[a-b]", "[!a]", "*.", "ab", "{a,b}", "{,*}"])
TEXT_CHARS = st.sampled_from(list("ab/.*[]!-\\é€{},"))
patterns = st.lists(PATTERN_CHARS, max_size=8).map("".join)
texts = st.lists(TEXT_CHARS, max_size=10).map("".join)


@settings(max_examples=1500, deadline=None)
@given(patterns, texts)
def test_native_agrees_with_reference(pattern, text):
    assert _native.glob_match(pattern, text) == brace_free_match(pattern, text)
    assert any(_native.glob_match(p, text) for p in expand_braces(pattern)) == glob_match(pattern, text)


@settings(max_examples=500, deadline=None)
@given(patterns, texts)
def test_matches_start_and_end_with_the_literal_ends(pattern, text):
    if glob_match(pattern, text):
        assert text.startswith(literal_prefix(pattern))
        assert text.endswith(literal_suffix(pattern))


@settings(max_examples=300, deadline=None)
@given(texts, texts)
def test_escaped_text_matches_only_itself(text, other):
    pattern = escape(text)
    assert is_literal(pattern) and unescape(pattern) == text
    assert glob_match(pattern, text)
    assert glob_match(pattern, other) == (other == text)


def test_literal_ends_resolve_escapes_and_stop_at_wildcards():
    assert literal_prefix("run42/lane?/x*.fastq") == "run42/lane"
    assert literal_suffix("run42/lane?/x*.fastq") == ".fastq"
    assert literal_prefix("a\\*b*") == "a*b"
    assert literal_prefix("[abc") == "[abc"                  # unclosed: literal
    assert literal_suffix("*[ab]") == ""
    assert not is_literal("a[b]") and is_literal("a[b")
    assert literal_prefix("run{1,2}/x") == "run" and literal_suffix("*.{bam,bai}") == ""
    assert literal_suffix("*.{fastq,fq}.gz") == ".gz" and literal_prefix("\\{a}") == "{a}"
    assert not is_literal("{a}") and is_literal("{a") and unescape("a\\{b}") == "a{b}"
    assert escape("{a,b}") == "\\{a,b\\}"
