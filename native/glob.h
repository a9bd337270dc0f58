/* Glob matching on UTF-8 strings, the semantics of DelveFS rulesets:
 *   *      any run of characters, including '/'
 *   ?      exactly one character (a Unicode code point, not a byte)
 *   [...]  one character from a class; ranges a-z; '!' first negates;
 *          a ']' right after '[' or '[!' is literal; an unclosed '[' is literal
 *   \x     the character x literally
 * Everything else is literal ('.' and '+' have no special meaning), '{', '}' and ',' too:
 * brace alternatives are expanded into several patterns before they get here
 * (rulesets.globs.expand_braces). The Python reference implementation in
 * rulesets/globs.py (brace_free_match) must agree. */
#ifndef DELVEFS_GLOB_H
#define DELVEFS_GLOB_H
#include <stddef.h>

int dfs_glob_match(const char *pat, size_t plen, const char *str, size_t slen);

#endif
