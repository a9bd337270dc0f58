#include "glob.h"
#include <stdint.h>

/* Decode a multi-byte UTF-8 code point at s[*i] (s has n bytes); advance *i.
 * Invalid bytes decode as themselves so that matching stays total. */
static uint32_t next_cp_multibyte(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    uint32_t c = u[*i];
    size_t len = 1;
    if (c >= 0xF0) {
        len = 4; c &= 0x07;
    } else if (c >= 0xE0) {
        len = 3; c &= 0x0F;
    } else if (c >= 0xC0) {
        len = 2; c &= 0x1F;
    }
    if (len > 1) {
        if (*i + len > n) { (*i)++; return u[*i - 1]; }
        for (size_t k = 1; k < len; k++) {
            if ((u[*i + k] & 0xC0) != 0x80) { (*i)++; return u[*i - 1]; }
            c = (c << 6) | (u[*i + k] & 0x3F);
        }
    }
    *i += len;
    return c;
}

/* Decode one code point at s[*i]; keys are mostly ASCII, which this inlines. */
static inline uint32_t next_cp(const char *s, size_t n, size_t *i)
{
    unsigned char c = (unsigned char)s[*i];
    if (c < 0x80) {
        (*i)++;
        return c;
    }
    return next_cp_multibyte(s, n, i);
}

/* Match one class starting at pat[*pi] == '['. Returns 1 match, 0 no match,
 * -1 when the class is unclosed (then '[' is a literal). Advances *pi past ']'. */
static int match_class(const char *pat, size_t plen, size_t *pi, uint32_t c)
{
    size_t i = *pi + 1;
    int negate = 0, matched = 0, first = 1;
    if (i < plen && pat[i] == '!') { negate = 1; i++; }
    while (i < plen) {
        if (pat[i] == ']' && !first) {
            *pi = i + 1;
            return matched != negate;
        }
        first = 0;
        if (pat[i] == '\\' && i + 1 < plen) i++;
        uint32_t lo = next_cp(pat, plen, &i), hi = lo;
        if (i + 1 < plen && pat[i] == '-' && pat[i + 1] != ']') {
            i++;
            if (pat[i] == '\\' && i + 1 < plen) i++;
            hi = next_cp(pat, plen, &i);
        }
        if (lo <= c && c <= hi) matched = 1;
    }
    return -1;
}

int dfs_glob_match(const char *pat, size_t plen, const char *str, size_t slen)
{
    size_t p = 0, s = 0;
    size_t star_p = (size_t)-1, star_s = 0;   /* backtrack point of the last '*' */
    while (s < slen) {
        if (p < plen) {
            char pc = pat[p];
            if (pc == '*') {
                while (p < plen && pat[p] == '*') p++;
                if (p == plen) return 1;        /* trailing '*' eats the rest */
                star_p = p; star_s = s;
                continue;
            }
            size_t s_next = s;
            uint32_t c = next_cp(str, slen, &s_next);
            if (pc == '?') { p++; s = s_next; continue; }
            if (pc == '[') {
                size_t q = p;
                int r = match_class(pat, plen, &q, c);
                if (r == 1) { p = q; s = s_next; continue; }
                if (r == 0) goto backtrack;
                /* unclosed: literal '[' falls through */
            }
            size_t q = p;
            if (pc == '\\' && q + 1 < plen) q++;
            uint32_t lit = next_cp(pat, plen, &q);
            if (lit == c) { p = q; s = s_next; continue; }
        }
    backtrack:
        if (star_p == (size_t)-1) return 0;
        /* let the last '*' eat one more character and retry */
        next_cp(str, slen, &star_s);
        s = star_s;
        p = star_p;
    }
    while (p < plen && pat[p] == '*') p++;
    return p == plen;
}
