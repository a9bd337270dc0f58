"""Reference implementation of DelveFS glob semantics (see native/glob.h).

``*`` any run of characters including ``/``; ``?`` one character; ``[...]`` a
class with ranges and ``!`` negation (``]`` first is literal, an unclosed ``[``
is literal); ``{a,b}`` one of the comma-separated alternatives (nesting allowed;
an unclosed ``{`` is literal); ``\\x`` escapes x. Nothing else is special.

Braces are expanded before matching: a pattern matches when one of its expansions
(brace-free patterns, see expand_braces) does. The C matcher matches the expansions
that rulesets.matcher hands it and must give glob_match's answer for every brace-free
pattern and text; tests/unit/test_globs.py checks it.
"""

from functools import lru_cache

# A pattern may expand to at most this many brace-free patterns: each one is matched
# separately, and nested braces multiply.
MAX_ALTERNATIVES = 256


def _parse_class(pat: str, i: int):
    """Parse a class at pat[i] == '['. Returns (ranges, negate, next_index) or None if unclosed."""
    j = i + 1
    negate = False
    if j < len(pat) and pat[j] == "!":
        negate = True
        j += 1
    ranges = []
    first = True
    while j < len(pat):
        if pat[j] == "]" and not first:
            return ranges, negate, j + 1
        first = False
        if pat[j] == "\\" and j + 1 < len(pat):
            j += 1
        lo = pat[j]
        j += 1
        hi = lo
        if j + 1 < len(pat) and pat[j] == "-" and pat[j + 1] != "]":
            j += 1
            if pat[j] == "\\" and j + 1 < len(pat):
                j += 1
            hi = pat[j]
            j += 1
        ranges.append((lo, hi))
    return None


def _skip_token(pat: str, i: int) -> int:
    """The index after the escape or closed class at pat[i], or i + 1 for any other character."""
    if pat[i] == "\\" and i + 1 < len(pat):
        return i + 2
    if pat[i] == "[":
        parsed = _parse_class(pat, i)
        if parsed is not None:
            return parsed[2]
    return i + 1


def _group(pat: str, i: int, end: int) -> list[int] | None:
    """For pat[i] == '{': the indices of its top-level commas and, last, of its closing '}'
    (within pat[:end]); None when unclosed. Escapes and classes hide braces and commas."""
    depth = 0
    commas = []
    j = i + 1
    while j < end:
        c = pat[j]
        if c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                return commas + [j]
            depth -= 1
        elif c == "," and depth == 0:
            commas.append(j)
        j = _skip_token(pat, j)
    return None


def _expand(pat: str, start: int, end: int) -> list[str]:
    results = [""]
    chunk = i = start
    while i < end:
        bounds = _group(pat, i, end) if pat[i] == "{" else None
        if bounds is None:
            i = _skip_token(pat, i)
            continue
        options = []
        for lo, hi in zip([i] + bounds[:-1], bounds):
            options.extend(_expand(pat, lo + 1, hi))
        literal = pat[chunk:i]
        if len(results) * len(options) > MAX_ALTERNATIVES:
            raise ValueError(f"braces expand to more than {MAX_ALTERNATIVES} alternatives; allowed: at "
                             f"most {MAX_ALTERNATIVES} (use fewer or shorter lists, or a wildcard)")
        results = [r + literal + o for r in results for o in options]
        chunk = i = bounds[-1] + 1
    tail = pat[chunk:end]
    return [r + tail for r in results]


@lru_cache(maxsize=4096)
def expand_braces(pattern: str) -> tuple[str, ...]:
    """The brace-free patterns `pattern` stands for, in order, without repeats; ValueError
    when there are more than MAX_ALTERNATIVES. ``{``, ``}`` and ``,`` left in them are literal."""
    return tuple(dict.fromkeys(_expand(pattern, 0, len(pattern))))


def _match_brace_free(pattern: str, text: str) -> bool:
    p = s = 0
    star_p, star_s = -1, 0
    while s < len(text):
        if p < len(pattern):
            pc = pattern[p]
            if pc == "*":
                while p < len(pattern) and pattern[p] == "*":
                    p += 1
                if p == len(pattern):
                    return True
                star_p, star_s = p, s
                continue
            c = text[s]
            if pc == "?":
                p += 1
                s += 1
                continue
            literal = True
            if pc == "[":
                parsed = _parse_class(pattern, p)
                if parsed is not None:
                    literal = False
                    ranges, negate, nxt = parsed
                    if any(lo <= c <= hi for lo, hi in ranges) != negate:
                        p, s = nxt, s + 1
                        continue
            if literal:
                q = p + 1 if pc == "\\" and p + 1 < len(pattern) else p
                if pattern[q] == c:
                    p, s = q + 1, s + 1
                    continue
        if star_p < 0:
            return False
        star_s += 1
        s, p = star_s, star_p
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def glob_match(pattern: str, text: str) -> bool:
    """True when ``text`` matches ``pattern`` as a whole."""
    if "{" not in pattern:
        return _match_brace_free(pattern, text)
    return any(_match_brace_free(alternative, text) for alternative in expand_braces(pattern))


def brace_free_match(pattern: str, text: str) -> bool:
    """glob_match for a pattern whose braces are already expanded: '{', '}' and ',' are
    literal. The semantics of native glob_match."""
    return _match_brace_free(pattern, text)


def _tokens(pattern: str, braces: bool = True):
    """Split a pattern into (is_literal, text) tokens, following glob_match's grammar
    (brace_free_match's without `braces`)."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c in "*?":
            yield False, c
            i += 1
        elif c == "[" and _parse_class(pattern, i) is not None:
            nxt = _parse_class(pattern, i)[2]
            yield False, pattern[i:nxt]
            i = nxt
        elif c == "{" and braces and _group(pattern, i, len(pattern)) is not None:
            nxt = _group(pattern, i, len(pattern))[-1] + 1
            yield False, pattern[i:nxt]
            i = nxt
        elif c == "\\" and i + 1 < len(pattern):
            yield True, pattern[i + 1]
            i += 2
        else:
            yield True, c
            i += 1


def literal_prefix(pattern: str, braces: bool = True) -> str:
    """The text every match of ``pattern`` starts with (escapes resolved); without
    `braces`, of a brace-free pattern."""
    out = []
    for is_literal_token, text in _tokens(pattern, braces):
        if not is_literal_token:
            break
        out.append(text)
    return "".join(out)


def literal_suffix(pattern: str, braces: bool = True) -> str:
    """The text every match of ``pattern`` ends with (escapes resolved); without `braces`,
    of a brace-free pattern."""
    out = []
    for is_literal_token, text in _tokens(pattern, braces):
        if is_literal_token:
            out.append(text)
        else:
            out.clear()
    return "".join(out)


def is_literal(pattern: str) -> bool:
    """True when ``pattern`` has no wildcard, class or braces (it matches one text)."""
    return all(is_literal_token for is_literal_token, _ in _tokens(pattern))


def unescape(pattern: str) -> str:
    """The one text a literal pattern matches."""
    return "".join(text for _, text in _tokens(pattern))


def escape(text: str) -> str:
    """A pattern that matches exactly ``text``."""
    return "".join("\\" + c if c in "*?[{}\\" else c for c in text)
