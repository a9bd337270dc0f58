/* The compiled matcher of DelveFS views: plain C, no Python objects, so that matching
 * runs without the GIL. A "group" holds the views whose bucket rule accepts one bucket
 * name, indexed by the literal prefixes or suffixes of their object globs (one per brace
 * alternative); matching an object tests only the views one of whose keys the object's
 * key starts (or ends) with.
 *
 * A view holds when its top-level rules hold, one of its `any` blocks holds (if it has
 * any) and none of its `not` blocks does. Answers can be partial: with the tags or the
 * relative ages unknown, a rule is yes, no or maybe, combined in three-valued logic.
 * rulesets/reference.py is the reference of these semantics. */
#ifndef DELVEFS_MATCHER_H
#define DELVEFS_MATCHER_H
#include <stddef.h>
#include <stdint.h>

typedef struct { const char *s; size_t n; } dfs_str;   /* UTF-8, not NUL-terminated */

/* A glob as the brace-free patterns it expands to (rulesets.globs.expand_braces); it
 * matches when one of them does. */
typedef struct {
    size_t n;
    dfs_str *patterns;
} dfs_glob;

/* A decimal number: sign * 0.DIGITS * 10^exponent, DIGITS without leading or trailing
 * zeros, as rulesets.expressions.decimal_parts. The digits point into the text they
 * were read from and may contain its '.', which comparisons skip. */
typedef struct {
    int sign;                    /* -1, 0 (the number is zero) or 1 */
    int64_t exponent;
    const char *digits, *digits_end;
} dfs_decimal;

/* 1 and *out when s[0..n) is a number (rulesets.expressions.NUMBER), else 0. */
int dfs_decimal_parse(const char *s, size_t n, dfs_decimal *out);
/* -1, 0 or 1 as a is below, equal to or above b. */
int dfs_decimal_compare(const dfs_decimal *a, const dfs_decimal *b);

enum { DFS_TIME_NONE = 0, DFS_TIME_AGE = 1, DFS_TIME_STAMP = 2 };

typedef struct {
    int kind;                    /* DFS_TIME_*: an age (now - mtime) or a time stamp (mtime) */
    int has_lo, has_hi, lo_open, hi_open;
    double lo, hi;
} dfs_time_rule;

enum { DFS_VALUE_ABSENT = 0, DFS_VALUE_GLOB = 1, DFS_VALUE_NUMBER = 2 };

/* One accepted value of a property rule. */
typedef struct {
    int kind;                    /* DFS_VALUE_*: "the key is absent", a glob, or a number range */
    dfs_glob glob;
    int has_lo, has_hi, lo_open, hi_open;
    dfs_decimal lo, hi;
} dfs_value;

enum { DFS_FROM_TAGS = 1, DFS_FROM_METADATA = 2 };

typedef struct {
    dfs_str key;                 /* lowercased */
    int sources;                 /* DFS_FROM_* where the key is looked up */
    int absent_ok;               /* some value is DFS_VALUE_ABSENT */
    int has_patterns;            /* some value is not */
    size_t nvalues;
    dfs_value *values;
} dfs_prop_rule;

/* Rules that must all hold: a view's top level, or one block of its `any` or `not`. */
typedef struct {
    int has_object;
    dfs_glob object;
    int64_t size_lo, size_hi;    /* inclusive */
    dfs_time_rule modified;
    size_t nprops;
    dfs_prop_rule *props;
} dfs_block;

typedef struct {
    int bucket_is_glob;
    dfs_glob bucket;             /* a literal bucket: its one pattern is the name */
    int index_by_suffix;         /* the index keys are literal suffixes, not prefixes */
    size_t n_index_keys;
    dfs_str *index_keys;         /* every key the top-level object glob matches starts (ends)
                                  * with one of these; "" when it has none */
    dfs_block rules;
    size_t n_any_of, n_none_of;
    dfs_block *any_of, *none_of; /* the blocks of `any` and of `not` */
    int reads;                   /* DFS_FROM_* read by some property rule */
    int time_dependent;          /* some block has a relative-age rule */
} dfs_view;

typedef struct {
    dfs_str key;                 /* lowercased */
    dfs_str value;
    int source;                  /* DFS_FROM_TAGS or DFS_FROM_METADATA */
} dfs_prop;

typedef struct {
    dfs_str key;
    int64_t size;
    double mtime;
    size_t nprops;
    const dfs_prop *props;       /* the tags and metadata the group's views read */
} dfs_object;

/* Sets dfs_view.reads and .time_dependent from its blocks. */
void dfs_view_summarise(dfs_view *view);

typedef struct dfs_group dfs_group;

/* The views of `views` whose bucket rule accepts `bucket`; NULL when out of memory. */
dfs_group *dfs_group_build(const dfs_view *views, size_t nviews, const char *bucket, size_t blen);
void dfs_group_free(dfs_group *group);
/* DFS_FROM_* that some view of the group reads: what objects need converted. */
int dfs_group_reads(const dfs_group *group);
/* Upper bound of the number of views one object of this group can match (of its index
 * entries: room for the candidates). */
size_t dfs_group_size(const dfs_group *group);
/* Writes the indices of matching views, ascending, to out (room for dfs_group_size()). */
size_t dfs_group_match(const dfs_group *group, const dfs_view *views, const dfs_object *obj,
                       double now, size_t *out);
/* For an object whose tags are unknown (obj has none): writes the views that match
 * whatever the tags are to `yes` and returns their number; the views whose answer may
 * depend on the tags to `maybe`, their number to *nmaybe. Both ascending, both with
 * dfs_group_size() room. */
size_t dfs_group_match_partial(const dfs_group *group, const dfs_view *views, const dfs_object *obj,
                               double now, size_t *yes, size_t *maybe, size_t *nmaybe);
/* 1 when dfs_group_match_partial would report a view whose answer may depend on the tags
 * (stops at the first); `scratch` has dfs_group_size() room. */
int dfs_group_tags_could_matter(const dfs_group *group, const dfs_view *views, const dfs_object *obj,
                                double now, size_t *scratch);
/* Earliest time > now at which a relative-age rule of a view whose answer depends on its
 * ages changes (rules of blocks that are false whatever the ages aside); returns 0 when
 * there is none, else 1 and *when. With `tags_unknown` (obj has no tags), views and blocks
 * that may hold whatever the tags count too: at that time the tags may start to matter.
 * `scratch` has dfs_group_size() room. */
int dfs_group_next_flip(const dfs_group *group, const dfs_view *views, const dfs_object *obj,
                        double now, int tags_unknown, size_t *scratch, double *when);

#endif
