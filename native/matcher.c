#include "matcher.h"
#include "glob.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One distinct literal prefix (or reversed suffix) and the views filed under it.
 * parent: the entry whose key is the longest proper prefix of this key, or -1. */
typedef struct {
    dfs_str key;
    ptrdiff_t parent;
    size_t first, count;         /* view ids in index.ids[first .. first+count) */
} index_entry;

typedef struct {
    index_entry *entries;        /* sorted by key */
    size_t n;
    size_t *ids;
    char *keys;                  /* storage of reversed suffix keys */
    int reversed;                /* keys are reversed suffixes, queried from the key's end */
} key_index;

struct dfs_group {
    size_t nviews;
    int uses_properties;
    key_index prefix, suffix;
};

typedef struct { dfs_str key; size_t id; } keyed_view;

static int compare_keyed(const void *a, const void *b)
{
    const keyed_view *x = a, *y = b;
    size_t n = x->key.n < y->key.n ? x->key.n : y->key.n;
    int c = memcmp(x->key.s, y->key.s, n);
    if (c) return c;
    if (x->key.n != y->key.n) return x->key.n < y->key.n ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Byte i of the query text as the index sees it (from the end for suffix indexes). */
static inline unsigned char query_byte(const key_index *ix, dfs_str text, size_t i)
{
    return (unsigned char)(ix->reversed ? text.s[text.n - 1 - i] : text.s[i]);
}

/* <0, 0, >0 as entry key sorts before, equal to or after the (possibly reversed) text. */
static int compare_entry(const key_index *ix, dfs_str key, dfs_str text)
{
    size_t n = key.n < text.n ? key.n : text.n;
    for (size_t i = 0; i < n; i++) {
        unsigned char a = (unsigned char)key.s[i], b = query_byte(ix, text, i);
        if (a != b) return a < b ? -1 : 1;
    }
    return key.n < text.n ? -1 : key.n > text.n;
}

static int entry_is_prefix(const key_index *ix, dfs_str key, dfs_str text)
{
    if (key.n > text.n) return 0;
    for (size_t i = 0; i < key.n; i++)
        if ((unsigned char)key.s[i] != query_byte(ix, text, i)) return 0;
    return 1;
}

static int index_build(key_index *ix, keyed_view *items, size_t n, int reversed)
{
    memset(ix, 0, sizeof *ix);
    ix->reversed = reversed;
    if (n == 0) return 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += items[i].key.n;
    ix->ids = malloc(n * sizeof *ix->ids);
    ix->entries = malloc(n * sizeof *ix->entries);
    ix->keys = malloc(total ? total : 1);
    ptrdiff_t *stack = malloc(n * sizeof *stack);
    if (!ix->ids || !ix->entries || !ix->keys || !stack) { free(stack); return -1; }
    if (reversed) {
        char *out = ix->keys;
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j < items[i].key.n; j++) out[j] = items[i].key.s[items[i].key.n - 1 - j];
            items[i].key.s = out;
            out += items[i].key.n;
        }
    }
    qsort(items, n, sizeof *items, compare_keyed);
    size_t depth = 0;
    for (size_t i = 0; i < n; i++) {
        ix->ids[i] = items[i].id;
        index_entry *last = ix->n ? &ix->entries[ix->n - 1] : NULL;
        if (last && last->key.n == items[i].key.n && memcmp(last->key.s, items[i].key.s, last->key.n) == 0) {
            last->count++;
            continue;
        }
        index_entry *e = &ix->entries[ix->n];
        e->key = items[i].key;
        e->first = i;
        e->count = 1;
        /* In sorted order, the entries that are prefixes of this key are on the stack. */
        while (depth) {
            dfs_str top = ix->entries[stack[depth - 1]].key;
            if (top.n <= e->key.n && memcmp(top.s, e->key.s, top.n) == 0) break;
            depth--;
        }
        e->parent = depth ? stack[depth - 1] : -1;
        stack[depth++] = (ptrdiff_t)ix->n;
        ix->n++;
    }
    free(stack);
    return 0;
}

/* Appends the ids of all views whose key is a prefix of text; returns the new count. */
static size_t index_candidates(const key_index *ix, dfs_str text, size_t *out, size_t count)
{
    if (ix->n == 0) return count;
    /* the last entry <= text: the entries that are prefixes of text are on its parent chain */
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (compare_entry(ix, ix->entries[mid].key, text) <= 0) lo = mid + 1;
        else hi = mid;
    }
    ptrdiff_t i = (ptrdiff_t)lo - 1;
    while (i >= 0 && !entry_is_prefix(ix, ix->entries[i].key, text)) i = ix->entries[i].parent;
    for (; i >= 0; i = ix->entries[i].parent) {
        const index_entry *e = &ix->entries[i];
        memcpy(out + count, ix->ids + e->first, e->count * sizeof *out);
        count += e->count;
    }
    return count;
}

static void index_free(key_index *ix)
{
    free(ix->entries);
    free(ix->ids);
    free(ix->keys);
}

dfs_group *dfs_group_build(const dfs_view *views, size_t nviews, const char *bucket, size_t blen)
{
    dfs_group *g = calloc(1, sizeof *g);
    keyed_view *by_prefix = malloc((nviews ? nviews : 1) * sizeof *by_prefix);
    keyed_view *by_suffix = malloc((nviews ? nviews : 1) * sizeof *by_suffix);
    size_t np = 0, ns = 0;
    if (!g || !by_prefix || !by_suffix) goto fail;
    for (size_t i = 0; i < nviews; i++) {
        const dfs_view *v = &views[i];
        int accepts = v->bucket_is_glob
            ? dfs_glob_match(v->bucket.s, v->bucket.n, bucket, blen)
            : (v->bucket.n == blen && memcmp(v->bucket.s, bucket, blen) == 0);
        if (!accepts) continue;
        if (v->nprops) g->uses_properties = 1;
        /* file each view under its more selective literal end */
        if (v->index_suffix.n > v->index_prefix.n)
            by_suffix[ns++] = (keyed_view){v->index_suffix, i};
        else
            by_prefix[np++] = (keyed_view){v->index_prefix, i};
    }
    g->nviews = np + ns;
    if (index_build(&g->prefix, by_prefix, np, 0) || index_build(&g->suffix, by_suffix, ns, 1))
        goto fail;
    free(by_prefix);
    free(by_suffix);
    return g;
fail:
    free(by_prefix);
    free(by_suffix);
    dfs_group_free(g);
    return NULL;
}

void dfs_group_free(dfs_group *g)
{
    if (!g) return;
    index_free(&g->prefix);
    index_free(&g->suffix);
    free(g);
}

int dfs_group_uses_properties(const dfs_group *g)
{
    return g->uses_properties;
}

size_t dfs_group_size(const dfs_group *g)
{
    return g->nviews;
}

static int time_contains(const dfs_time_rule *r, double value)
{
    if (r->has_lo && (r->lo_open ? value <= r->lo : value < r->lo)) return 0;
    if (r->has_hi && (r->hi_open ? value >= r->hi : value > r->hi)) return 0;
    return 1;
}

static int props_match(const dfs_view *v, const dfs_object *obj)
{
    for (size_t r = 0; r < v->nprops; r++) {
        const dfs_prop_rule *rule = &v->props[r];
        int present = 0, accepted = 0, absent_ok = 0;
        for (size_t k = 0; k < rule->nvalues; k++)
            if (!rule->values[k].s) absent_ok = 1;
        for (size_t p = 0; p < obj->nprops && !accepted; p++) {
            const dfs_prop *prop = &obj->props[p];
            if (prop->key.n != rule->key.n || memcmp(prop->key.s, rule->key.s, rule->key.n) != 0)
                continue;
            present = 1;
            for (size_t k = 0; k < rule->nvalues && !accepted; k++) {
                const dfs_str *pat = &rule->values[k];
                accepted = pat->s && dfs_glob_match(pat->s, pat->n, prop->value.s, prop->value.n);
            }
        }
        if (present ? !accepted : !absent_ok) return 0;
    }
    return 1;
}

/* Every rule except relative ages (bucket is the group's business). */
static int static_match(const dfs_view *v, const dfs_object *obj)
{
    if (obj->size < v->size_lo || obj->size > v->size_hi) return 0;
    if (v->modified.kind == DFS_TIME_STAMP && !time_contains(&v->modified, obj->mtime)) return 0;
    if (v->accessed.kind == DFS_TIME_STAMP && !time_contains(&v->accessed, obj->atime)) return 0;
    if (v->has_object && !dfs_glob_match(v->object.s, v->object.n, obj->key.s, obj->key.n)) return 0;
    return props_match(v, obj);
}

static int view_matches(const dfs_view *v, const dfs_object *obj, double now)
{
    if (v->modified.kind == DFS_TIME_AGE && !time_contains(&v->modified, now - obj->mtime)) return 0;
    if (v->accessed.kind == DFS_TIME_AGE && !time_contains(&v->accessed, now - obj->atime)) return 0;
    return static_match(v, obj);
}

static size_t candidates(const dfs_group *g, const dfs_object *obj, size_t *out)
{
    size_t n = index_candidates(&g->prefix, obj->key, out, 0);
    return index_candidates(&g->suffix, obj->key, out, n);
}

static int compare_ids(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

size_t dfs_group_match(const dfs_group *g, const dfs_view *views, const dfs_object *obj,
                       double now, size_t *out)
{
    size_t n = candidates(g, obj, out), kept = 0;
    for (size_t i = 0; i < n; i++)
        if (view_matches(&views[out[i]], obj, now)) out[kept++] = out[i];
    if (kept <= 16) {   /* usually a few matches: insertion sort beats qsort's calls */
        for (size_t i = 1; i < kept; i++) {
            size_t id = out[i], j = i;
            while (j > 0 && out[j - 1] > id) { out[j] = out[j - 1]; j--; }
            out[j] = id;
        }
    } else {
        qsort(out, kept, sizeof *out, compare_ids);
    }
    return kept;
}

/* Earliest t with t - base >= bound (> bound when strict), exact under float rounding;
 * identical to rulesets.reference.first_time_age_reaches. */
static double first_time_age_reaches(double base, double bound, int strict)
{
#define REACHED(t) (strict ? (t) - base > bound : (t) - base >= bound)
    double t = base + bound;
    if (REACHED(t)) {
        while (REACHED(nextafter(t, -INFINITY))) t = nextafter(t, -INFINITY);
    } else {
        while (!REACHED(t)) t = nextafter(t, INFINITY);
    }
    return t;
#undef REACHED
}

static void consider_flips(const dfs_time_rule *r, double base, double now, int *found, double *when)
{
    double t[2];
    int n = 0;
    if (r->kind != DFS_TIME_AGE) return;
    if (r->has_lo) t[n++] = first_time_age_reaches(base, r->lo, r->lo_open);
    if (r->has_hi) t[n++] = first_time_age_reaches(base, r->hi, !r->hi_open);
    for (int i = 0; i < n; i++) {
        if (t[i] > now && (!*found || t[i] < *when)) { *when = t[i]; *found = 1; }
    }
}

int dfs_group_next_flip(const dfs_group *g, const dfs_view *views, const dfs_object *obj,
                        double now, size_t *scratch, double *when)
{
    size_t n = candidates(g, obj, scratch);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        const dfs_view *v = &views[scratch[i]];
        if (v->modified.kind != DFS_TIME_AGE && v->accessed.kind != DFS_TIME_AGE) continue;
        if (!static_match(v, obj)) continue;
        consider_flips(&v->modified, obj->mtime, now, &found, when);
        consider_flips(&v->accessed, obj->atime, now, &found, when);
    }
    return found;
}
