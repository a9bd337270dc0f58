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
    size_t nentries;             /* index entries: a view has one per index key */
    int reads;
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

static int glob_matches(const dfs_glob *glob, dfs_str text)
{
    for (size_t i = 0; i < glob->n; i++)
        if (dfs_glob_match(glob->patterns[i].s, glob->patterns[i].n, text.s, text.n)) return 1;
    return 0;
}

dfs_group *dfs_group_build(const dfs_view *views, size_t nviews, const char *bucket, size_t blen)
{
    size_t nkeys = 0;
    for (size_t i = 0; i < nviews; i++) nkeys += views[i].n_index_keys;
    dfs_group *g = calloc(1, sizeof *g);
    keyed_view *by_prefix = malloc((nkeys ? nkeys : 1) * sizeof *by_prefix);
    keyed_view *by_suffix = malloc((nkeys ? nkeys : 1) * sizeof *by_suffix);
    size_t np = 0, ns = 0;
    if (!g || !by_prefix || !by_suffix) goto fail;
    for (size_t i = 0; i < nviews; i++) {
        const dfs_view *v = &views[i];
        int accepts = v->bucket_is_glob
            ? glob_matches(&v->bucket, (dfs_str){bucket, blen})
            : (v->bucket.n == 1 && v->bucket.patterns[0].n == blen
               && memcmp(v->bucket.patterns[0].s, bucket, blen) == 0);
        if (!accepts) continue;
        g->reads |= v->reads;
        for (size_t k = 0; k < v->n_index_keys; k++) {
            if (v->index_by_suffix) by_suffix[ns++] = (keyed_view){v->index_keys[k], i};
            else by_prefix[np++] = (keyed_view){v->index_keys[k], i};
        }
    }
    g->nentries = np + ns;
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

int dfs_group_reads(const dfs_group *g)
{
    return g->reads;
}

size_t dfs_group_size(const dfs_group *g)
{
    return g->nentries;
}

static int block_reads(const dfs_block *b)
{
    int reads = 0;
    for (size_t r = 0; r < b->nprops; r++) reads |= b->props[r].sources;
    return reads;
}

void dfs_view_summarise(dfs_view *v)
{
    v->reads = block_reads(&v->rules);
    v->time_dependent = v->rules.modified.kind == DFS_TIME_AGE;
    for (size_t i = 0; i < v->n_any_of; i++) {
        v->reads |= block_reads(&v->any_of[i]);
        v->time_dependent |= v->any_of[i].modified.kind == DFS_TIME_AGE;
    }
    for (size_t i = 0; i < v->n_none_of; i++) {
        v->reads |= block_reads(&v->none_of[i]);
        v->time_dependent |= v->none_of[i].modified.kind == DFS_TIME_AGE;
    }
}

/* ---- decimal numbers ---- */

/* Exponents of values saturate here; bounds have at most 4 exponent digits (rulesets
 * refuses more), so every value still orders exactly against them. */
#define EXPONENT_CAP 1000000000000000LL

static inline int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

int dfs_decimal_parse(const char *s, size_t n, dfs_decimal *out)
{
    size_t i = 0, whole = 0, fraction = 0;
    int negative = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
    const char *mantissa = s + i;
    while (i < n && is_digit(s[i])) { i++; whole++; }
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && is_digit(s[i])) { i++; fraction++; }
    }
    if (whole + fraction == 0) return 0;
    const char *mantissa_end = s + i;
    int64_t exponent = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        int exponent_negative = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) exponent_negative = s[i++] == '-';
        if (i == n || !is_digit(s[i])) return 0;
        for (; i < n && is_digit(s[i]); i++)
            if (exponent < EXPONENT_CAP) exponent = exponent * 10 + (s[i] - '0');
        if (exponent_negative) exponent = -exponent;
    }
    if (i != n) return 0;
    const char *first = mantissa;
    int64_t leading_zeros = 0;
    while (first < mantissa_end && (*first == '0' || *first == '.')) leading_zeros += *first++ == '0';
    if (first == mantissa_end) {
        *out = (dfs_decimal){0, 0, first, first};
        return 1;
    }
    const char *last = mantissa_end;
    while (last[-1] == '0' || last[-1] == '.') last--;   /* stops at the first digit at the latest */
    *out = (dfs_decimal){negative ? -1 : 1, (int64_t)whole - leading_zeros + exponent, first, last};
    return 1;
}

/* Compares 0.DIGITS of a and b. */
static int compare_digits(const dfs_decimal *a, const dfs_decimal *b)
{
    const char *p = a->digits, *q = b->digits;
    for (;;) {
        if (p < a->digits_end && *p == '.') p++;
        if (q < b->digits_end && *q == '.') q++;
        int a_done = p == a->digits_end, b_done = q == b->digits_end;
        if (a_done || b_done) return a_done == b_done ? 0 : (a_done ? -1 : 1);
        if (*p != *q) return *p < *q ? -1 : 1;
        p++;
        q++;
    }
}

int dfs_decimal_compare(const dfs_decimal *a, const dfs_decimal *b)
{
    if (a->sign != b->sign) return a->sign < b->sign ? -1 : 1;
    if (a->sign == 0) return 0;
    int magnitude = a->exponent != b->exponent ? (a->exponent < b->exponent ? -1 : 1) : compare_digits(a, b);
    return magnitude * a->sign;
}

/* ---- three-valued evaluation ---- */

enum { NO = 0, YES = 1, MAYBE = 2 };
enum { KNOWN = 0, TAGS_UNKNOWN = 1, AGES_UNKNOWN = 2 };

static int time_contains(const dfs_time_rule *r, double value)
{
    if (r->has_lo && (r->lo_open ? value <= r->lo : value < r->lo)) return 0;
    if (r->has_hi && (r->hi_open ? value >= r->hi : value > r->hi)) return 0;
    return 1;
}

static int value_accepts(const dfs_value *v, dfs_str text)
{
    if (v->kind == DFS_VALUE_GLOB) return glob_matches(&v->glob, text);
    if (v->kind != DFS_VALUE_NUMBER) return 0;
    dfs_decimal number;
    if (!dfs_decimal_parse(text.s, text.n, &number)) return 0;   /* not a number: no comparison holds */
    if (v->has_lo) {
        int order = dfs_decimal_compare(&number, &v->lo);
        if (order < 0 || (order == 0 && v->lo_open)) return 0;
    }
    if (v->has_hi) {
        int order = dfs_decimal_compare(&number, &v->hi);
        if (order > 0 || (order == 0 && v->hi_open)) return 0;
    }
    return 1;
}

/* Some value of the key (in the rule's sources) is accepted, or the key is absent and
 * absence is accepted. With the tags unknown (the object has none), a rule that reads
 * them is decided only by an accepted metadata value, or by a present key when nothing
 * but absence is accepted. */
static int prop_rule_value(const dfs_prop_rule *rule, const dfs_object *obj, int unknown)
{
    int present = 0;
    for (size_t p = 0; p < obj->nprops; p++) {
        const dfs_prop *prop = &obj->props[p];
        if (!(prop->source & rule->sources) || prop->key.n != rule->key.n
            || memcmp(prop->key.s, rule->key.s, rule->key.n) != 0)
            continue;
        present = 1;
        for (size_t k = 0; k < rule->nvalues; k++)
            if (value_accepts(&rule->values[k], prop->value)) return YES;
    }
    if ((unknown & TAGS_UNKNOWN) && (rule->sources & DFS_FROM_TAGS))
        return present && !rule->has_patterns ? NO : MAYBE;
    if (present) return NO;
    return rule->absent_ok ? YES : NO;
}

static int block_value(const dfs_block *b, const dfs_object *obj, double now, int unknown)
{
    int result = YES;
    if (obj->size < b->size_lo || obj->size > b->size_hi) return NO;
    if (b->modified.kind == DFS_TIME_STAMP) {
        if (!time_contains(&b->modified, obj->mtime)) return NO;
    } else if (b->modified.kind == DFS_TIME_AGE) {
        if (unknown & AGES_UNKNOWN) result = MAYBE;
        else if (!time_contains(&b->modified, now - obj->mtime)) return NO;
    }
    if (b->has_object && !glob_matches(&b->object, obj->key)) return NO;
    for (size_t r = 0; r < b->nprops; r++) {
        int value = prop_rule_value(&b->props[r], obj, unknown);
        if (value == NO) return NO;
        if (value == MAYBE) result = MAYBE;
    }
    return result;
}

/* The view's answer; its bucket is the group's business. */
static int view_value(const dfs_view *v, const dfs_object *obj, double now, int unknown)
{
    int result = block_value(&v->rules, obj, now, unknown);
    if (result == NO) return NO;
    if (v->n_any_of) {
        int any = NO;
        for (size_t i = 0; i < v->n_any_of && any != YES; i++) {
            int value = block_value(&v->any_of[i], obj, now, unknown);
            if (value != NO) any = value;
        }
        if (any == NO) return NO;
        if (any == MAYBE) result = MAYBE;
    }
    for (size_t i = 0; i < v->n_none_of; i++) {
        int value = block_value(&v->none_of[i], obj, now, unknown);
        if (value == YES) return NO;
        if (value == MAYBE) result = MAYBE;
    }
    return result;
}

static size_t candidates(const dfs_group *g, const dfs_object *obj, size_t *out)
{
    size_t n = index_candidates(&g->prefix, obj->key, out, 0);
    return index_candidates(&g->suffix, obj->key, out, n);
}

/* Drops repeats from ascending ids: a view whose index keys nest (rulesets never compiles
 * such) would be found once per key. */
static size_t unique_ids(size_t *ids, size_t n)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (kept == 0 || ids[kept - 1] != ids[i]) ids[kept++] = ids[i];
    return kept;
}

static int compare_ids(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static void sort_ids(size_t *ids, size_t n)
{
    if (n <= 16) {   /* usually a few matches: insertion sort beats qsort's calls */
        for (size_t i = 1; i < n; i++) {
            size_t id = ids[i], j = i;
            while (j > 0 && ids[j - 1] > id) { ids[j] = ids[j - 1]; j--; }
            ids[j] = id;
        }
    } else {
        qsort(ids, n, sizeof *ids, compare_ids);
    }
}

size_t dfs_group_match(const dfs_group *g, const dfs_view *views, const dfs_object *obj,
                       double now, size_t *out)
{
    size_t n = candidates(g, obj, out), kept = 0;
    for (size_t i = 0; i < n; i++)
        if (view_value(&views[out[i]], obj, now, KNOWN) == YES) out[kept++] = out[i];
    sort_ids(out, kept);
    return unique_ids(out, kept);
}

size_t dfs_group_match_partial(const dfs_group *g, const dfs_view *views, const dfs_object *obj,
                               double now, size_t *yes, size_t *maybe, size_t *nmaybe)
{
    size_t n = candidates(g, obj, yes), kept = 0;
    *nmaybe = 0;
    for (size_t i = 0; i < n; i++) {
        int value = view_value(&views[yes[i]], obj, now, TAGS_UNKNOWN);
        if (value == YES) yes[kept++] = yes[i];
        else if (value == MAYBE) maybe[(*nmaybe)++] = yes[i];
    }
    sort_ids(yes, kept);
    sort_ids(maybe, *nmaybe);
    *nmaybe = unique_ids(maybe, *nmaybe);
    return unique_ids(yes, kept);
}

int dfs_group_tags_could_matter(const dfs_group *g, const dfs_view *views, const dfs_object *obj,
                                double now, size_t *scratch)
{
    if (!(g->reads & DFS_FROM_TAGS)) return 0;
    size_t n = candidates(g, obj, scratch);
    for (size_t i = 0; i < n; i++) {
        const dfs_view *v = &views[scratch[i]];
        if ((v->reads & DFS_FROM_TAGS) && view_value(v, obj, now, TAGS_UNKNOWN) == MAYBE) return 1;
    }
    return 0;
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

/* The age rule of a block can change the view's answer unless the block is false whatever the ages. */
static void consider_block_flips(const dfs_block *b, const dfs_object *obj, double now, int unknown,
                                 int *found, double *when)
{
    if (b->modified.kind == DFS_TIME_AGE && block_value(b, obj, now, unknown) != NO)
        consider_flips(&b->modified, obj->mtime, now, found, when);
}

int dfs_group_next_flip(const dfs_group *g, const dfs_view *views, const dfs_object *obj,
                        double now, int tags_unknown, size_t *scratch, double *when)
{
    size_t n = candidates(g, obj, scratch);
    int found = 0, unknown = AGES_UNKNOWN | (tags_unknown ? TAGS_UNKNOWN : 0);
    for (size_t i = 0; i < n; i++) {
        const dfs_view *v = &views[scratch[i]];
        if (!v->time_dependent || view_value(v, obj, now, unknown) != MAYBE) continue;
        consider_flips(&v->rules.modified, obj->mtime, now, &found, when);
        for (size_t k = 0; k < v->n_any_of; k++)
            consider_block_flips(&v->any_of[k], obj, now, unknown, &found, when);
        for (size_t k = 0; k < v->n_none_of; k++)
            consider_block_flips(&v->none_of[k], obj, now, unknown, &found, when);
    }
    return found;
}
