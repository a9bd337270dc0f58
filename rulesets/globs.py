"""Reference implementation of DelveFS glob semantics (see native/glob.h).

``*`` any run of characters including ``/``; ``?`` one character; ``[...]`` a
class with ranges and ``!`` negation (``]`` first is literal, an unclosed ``[``
is literal); ``\\x`` escapes x. Nothing else is special. The C matcher must give
the same answer for every pattern and text; tests/unit/test_globs.py checks it.
"""


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


def glob_match(pattern: str, text: str) -> bool:
    """True when ``text`` matches ``pattern`` as a whole."""
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


def _tokens(pattern: str):
    """Split a pattern into (is_literal, text) tokens, following glob_match's grammar."""
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
        elif c == "\\" and i + 1 < len(pattern):
            yield True, pattern[i + 1]
            i += 2
        else:
            yield True, c
            i += 1


def literal_prefix(pattern: str) -> str:
    """The text every match of ``pattern`` starts with (escapes resolved)."""
    out = []
    for is_literal_token, text in _tokens(pattern):
        if not is_literal_token:
            break
        out.append(text)
    return "".join(out)


def literal_suffix(pattern: str) -> str:
    """The text every match of ``pattern`` ends with (escapes resolved)."""
    out = []
    for is_literal_token, text in _tokens(pattern):
        if is_literal_token:
            out.append(text)
        else:
            out.clear()
    return "".join(out)


def is_literal(pattern: str) -> bool:
    """True when ``pattern`` matches exactly one text (no wildcard or class)."""
    return all(is_literal_token for is_literal_token, _ in _tokens(pattern))


def unescape(pattern: str) -> str:
    """The one text a literal pattern matches."""
    return "".join(text for _, text in _tokens(pattern))


def escape(text: str) -> str:
    """A pattern that matches exactly ``text``."""
    return "".join("\\" + c if c in "*?[\\" else c for c in text)
