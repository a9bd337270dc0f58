/* The compiled matcher of DelveFS views: plain C, no Python objects, so that matching
 * runs without the GIL. A "group" holds the views whose bucket rule accepts one bucket
 * name, indexed by the literal prefix or suffix of their object globs; matching an
 * object tests only the views whose literal prefix (or suffix) the key has.
 * rulesets/reference.py is the reference of these semantics. */
#ifndef DELVEFS_MATCHER_H
#define DELVEFS_MATCHER_H
#include <stddef.h>
#include <stdint.h>

typedef struct { const char *s; size_t n; } dfs_str;   /* UTF-8, not NUL-terminated */

enum { DFS_TIME_NONE = 0, DFS_TIME_AGE = 1, DFS_TIME_STAMP = 2 };

typedef struct {
    int kind;                    /* DFS_TIME_*: an age (now - base) or a time stamp (base) */
    int has_lo, has_hi, lo_open, hi_open;
    double lo, hi;
} dfs_time_rule;

typedef struct {
    dfs_str key;                 /* lowercased */
    size_t nvalues;
    dfs_str *values;             /* globs; .s == NULL means "the key is absent" */
} dfs_prop_rule;

typedef struct {
    dfs_str bucket;
    int bucket_is_glob;
    int has_object;
    dfs_str object;
    dfs_str index_prefix;        /* literal prefix of object, "" when none */
    dfs_str index_suffix;        /* literal suffix of object, "" when none */
    int64_t size_lo, size_hi;    /* inclusive */
    dfs_time_rule modified, accessed;
    size_t nprops;
    dfs_prop_rule *props;
} dfs_view;

typedef struct { dfs_str key; dfs_str value; } dfs_prop;   /* key lowercased */

typedef struct {
    dfs_str key;
    int64_t size;
    double mtime;
    double atime;                /* the caller substitutes mtime when unknown */
    size_t nprops;
    const dfs_prop *props;       /* tags and user metadata together */
} dfs_object;

typedef struct dfs_group dfs_group;

/* The views of `views` whose bucket rule accepts `bucket`; NULL when out of memory. */
dfs_group *dfs_group_build(const dfs_view *views, size_t nviews, const char *bucket, size_t blen);
void dfs_group_free(dfs_group *group);
/* True when some view of the group has property rules (objects need their tags). */
int dfs_group_uses_properties(const dfs_group *group);
/* Upper bound of the number of views one object of this group can match. */
size_t dfs_group_size(const dfs_group *group);
/* Writes the indices of matching views, ascending, to out (room for dfs_group_size()). */
size_t dfs_group_match(const dfs_group *group, const dfs_view *views, const dfs_object *obj,
                       double now, size_t *out);
/* Earliest time > now at which a relative-age rule of a view that otherwise matches changes
 * its answer; returns 0 when there is none, else 1 and *when. `scratch` has dfs_group_size() room. */
int dfs_group_next_flip(const dfs_group *group, const dfs_view *views, const dfs_object *obj,
                        double now, size_t *scratch, double *when);

#endif
