/* rulesets._native: the compiled hot path of DelveFS rulesets.
 *
 * Matcher(view_specs) holds compiled views (see rulesets/matcher.py for the spec tuples).
 * A call converts its Python inputs to C structs with the GIL held, matches without the
 * GIL (native/matcher.c), then builds the Python results with the GIL again. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "glob.h"
#include "matcher.h"

static PyObject *py_glob_match(PyObject *self, PyObject *args)
{
    const char *pat, *str;
    Py_ssize_t plen, slen;
    (void)self;
    if (!PyArg_ParseTuple(args, "s#s#:glob_match", &pat, &plen, &str, &slen))
        return NULL;
    return PyBool_FromLong(dfs_glob_match(pat, (size_t)plen, str, (size_t)slen));
}

/* Attribute names of rulesets.ObjectInfo, interned once. */
static PyObject *attr_bucket, *attr_key, *attr_size, *attr_mtime, *attr_tags, *attr_metadata, *str_lower;

typedef struct {
    PyObject_HEAD
    dfs_view *views;
    size_t nviews;
    PyObject *owned;             /* list of the str objects the views' UTF-8 points into */
    PyObject *group_by_bucket;   /* dict: bucket name -> int index into groups */
    dfs_group **groups;          /* never freed before the matcher: calls hold pointers */
    size_t ngroups, groups_cap;
    size_t max_group;            /* largest dfs_group_size, for scratch buffers */
    PyObject **view_numbers;     /* cached ints 0..nviews-1 for results */
} MatcherObject;

/* ---- compiling view specs ---- */

static int utf8_of(MatcherObject *self, PyObject *text, dfs_str *out, const char *what)
{
    Py_ssize_t n;
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(text)->tp_name);
        return -1;
    }
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (!s || PyList_Append(self->owned, text) < 0) return -1;
    out->s = s;
    out->n = (size_t)n;
    return 0;
}

/* (pattern, ...): the brace-free patterns of a glob */
static int glob_of(MatcherObject *self, PyObject *spec, dfs_glob *glob, const char *what)
{
    PyObject *patterns = PySequence_Fast(spec, "a glob must be a sequence of patterns");
    if (!patterns) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(patterns);
    glob->patterns = PyMem_Calloc(n ? (size_t)n : 1, sizeof *glob->patterns);
    if (!glob->patterns) { Py_DECREF(patterns); PyErr_NoMemory(); return -1; }
    glob->n = (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (utf8_of(self, PySequence_Fast_GET_ITEM(patterns, i), &glob->patterns[i], what) < 0) {
            Py_DECREF(patterns);
            return -1;
        }
    }
    Py_DECREF(patterns);
    return 0;
}

static void glob_free(dfs_glob *glob)
{
    PyMem_Free(glob->patterns);
}

static int bound_of(PyObject *value, int *has, double *out)
{
    *has = value != Py_None;
    *out = *has ? PyFloat_AsDouble(value) : 0.0;
    return (*has && *out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* (kind, lo, hi, lo_open, hi_open) or None */
static int time_rule_of(PyObject *spec, dfs_time_rule *r)
{
    PyObject *lo, *hi;
    memset(r, 0, sizeof *r);
    if (spec == Py_None) return 0;
    if (!PyArg_ParseTuple(spec, "iOOpp:time rule", &r->kind, &lo, &hi, &r->lo_open, &r->hi_open))
        return -1;
    if (r->kind != DFS_TIME_AGE && r->kind != DFS_TIME_STAMP) {
        PyErr_SetString(PyExc_ValueError, "time rule kind must be 1 (age) or 2 (time stamp)");
        return -1;
    }
    if (bound_of(lo, &r->has_lo, &r->lo) < 0 || bound_of(hi, &r->has_hi, &r->hi) < 0) return -1;
    return 0;
}

/* A number bound (str) or None. */
static int decimal_of(MatcherObject *self, PyObject *spec, int *has, dfs_decimal *out)
{
    dfs_str text;
    *has = spec != Py_None;
    if (!*has) return 0;
    if (utf8_of(self, spec, &text, "number bound") < 0) return -1;
    if (!dfs_decimal_parse(text.s, text.n, out)) {
        PyErr_Format(PyExc_ValueError, "number bound %R is not a number", spec);
        return -1;
    }
    return 0;
}

/* None (the key is absent), (1, (pattern, ...)) a glob, or (2, lo|None, lo_open, hi|None, hi_open) */
static int value_of(MatcherObject *self, PyObject *spec, dfs_value *v)
{
    PyObject *first, *second = NULL, *lo, *hi;
    if (spec == Py_None) {
        v->kind = DFS_VALUE_ABSENT;
        return 0;
    }
    if (!PyArg_ParseTuple(spec, "iO|pOp:property value", &v->kind, &first, &v->lo_open, &second, &v->hi_open))
        return -1;
    if (v->kind == DFS_VALUE_GLOB && PyTuple_GET_SIZE(spec) == 2)
        return glob_of(self, first, &v->glob, "property value");
    if (v->kind != DFS_VALUE_NUMBER || PyTuple_GET_SIZE(spec) != 5) {
        PyErr_SetString(PyExc_ValueError, "a property value must be None, (1, patterns) or "
                                          "(2, lo, lo_open, hi, hi_open)");
        return -1;
    }
    lo = first;
    hi = second;
    return decimal_of(self, lo, &v->has_lo, &v->lo) < 0 || decimal_of(self, hi, &v->has_hi, &v->hi) < 0
        ? -1 : 0;
}

/* ((key, sources, (value, ...)), ...) */
static int prop_rules_of(MatcherObject *self, PyObject *spec, dfs_block *b)
{
    PyObject *rules = PySequence_Fast(spec, "property rules must be a sequence");
    if (!rules) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(rules);
    b->props = PyMem_Calloc(n ? (size_t)n : 1, sizeof *b->props);
    if (!b->props) { Py_DECREF(rules); PyErr_NoMemory(); return -1; }
    b->nprops = (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key, *values_spec;
        dfs_prop_rule *rule = &b->props[i];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(rules, i), "UiO:property rule", &key, &rule->sources,
                              &values_spec)
            || utf8_of(self, key, &rule->key, "property key") < 0)
            goto fail;
        PyObject *values = PySequence_Fast(values_spec, "property values must be a sequence");
        if (!values) goto fail;
        Py_ssize_t nv = PySequence_Fast_GET_SIZE(values);
        rule->values = PyMem_Calloc(nv ? (size_t)nv : 1, sizeof *rule->values);
        if (!rule->values) { Py_DECREF(values); PyErr_NoMemory(); goto fail; }
        rule->nvalues = (size_t)nv;
        for (Py_ssize_t k = 0; k < nv; k++) {
            if (value_of(self, PySequence_Fast_GET_ITEM(values, k), &rule->values[k]) < 0) {
                Py_DECREF(values);
                goto fail;
            }
            if (rule->values[k].kind == DFS_VALUE_ABSENT) rule->absent_ok = 1;
            else rule->has_patterns = 1;
        }
        Py_DECREF(values);
    }
    Py_DECREF(rules);
    return 0;
fail:
    Py_DECREF(rules);
    return -1;
}

/* (object patterns|None, size_lo, size_hi|None, modified|None, property rules) */
static int block_of(MatcherObject *self, PyObject *spec, dfs_block *b)
{
    PyObject *object, *size_lo, *size_hi, *modified, *props;
    if (!PyArg_ParseTuple(spec, "OOOOO:block spec", &object, &size_lo, &size_hi, &modified, &props))
        return -1;
    b->has_object = object != Py_None;
    if (b->has_object && glob_of(self, object, &b->object, "object") < 0) return -1;
    b->size_lo = PyLong_AsLongLong(size_lo);
    if (b->size_lo == -1 && PyErr_Occurred()) return -1;
    b->size_hi = size_hi == Py_None ? INT64_MAX : PyLong_AsLongLong(size_hi);
    if (b->size_hi == -1 && PyErr_Occurred()) return -1;
    if (time_rule_of(modified, &b->modified) < 0) return -1;
    return prop_rules_of(self, props, b);
}

static void block_free(dfs_block *b)
{
    for (size_t r = 0; r < b->nprops; r++) {
        for (size_t k = 0; k < b->props[r].nvalues; k++) glob_free(&b->props[r].values[k].glob);
        PyMem_Free(b->props[r].values);
    }
    PyMem_Free(b->props);
    glob_free(&b->object);
}

/* (block spec, ...) */
static int blocks_of(MatcherObject *self, PyObject *spec, dfs_block **blocks, size_t *count)
{
    PyObject *items = PySequence_Fast(spec, "blocks must be a sequence");
    if (!items) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    *blocks = PyMem_Calloc(n ? (size_t)n : 1, sizeof **blocks);
    if (!*blocks) { Py_DECREF(items); PyErr_NoMemory(); return -1; }
    *count = (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (block_of(self, PySequence_Fast_GET_ITEM(items, i), &(*blocks)[i]) < 0) {
            Py_DECREF(items);
            return -1;
        }
    }
    Py_DECREF(items);
    return 0;
}

/* (bucket_is_glob, bucket patterns, index_by_suffix, index keys, rules block, any blocks, not blocks) */
static int view_of(MatcherObject *self, PyObject *spec, dfs_view *v)
{
    PyObject *bucket, *keys, *rules, *any_of, *none_of;
    dfs_glob index_keys = {0, NULL};
    if (!PyArg_ParseTuple(spec, "pOpOOOO:view spec", &v->bucket_is_glob, &bucket, &v->index_by_suffix,
                          &keys, &rules, &any_of, &none_of))
        return -1;
    /* the keys are a list of strings like a glob's patterns */
    int failed = glob_of(self, keys, &index_keys, "index key");
    v->index_keys = index_keys.patterns;
    v->n_index_keys = index_keys.n;
    if (failed || glob_of(self, bucket, &v->bucket, "bucket") < 0
        || block_of(self, rules, &v->rules) < 0
        || blocks_of(self, any_of, &v->any_of, &v->n_any_of) < 0
        || blocks_of(self, none_of, &v->none_of, &v->n_none_of) < 0)
        return -1;
    if (!v->bucket_is_glob && v->bucket.n != 1) {
        PyErr_SetString(PyExc_ValueError, "a literal bucket has exactly one pattern");
        return -1;
    }
    if (v->n_index_keys == 0) {
        PyErr_SetString(PyExc_ValueError, "a view needs an index key (\"\" when its keys have no literal end)");
        return -1;
    }
    dfs_view_summarise(v);
    return 0;
}

static void view_free(dfs_view *v)
{
    PyMem_Free(v->index_keys);
    glob_free(&v->bucket);
    block_free(&v->rules);
    for (size_t i = 0; i < v->n_any_of; i++) block_free(&v->any_of[i]);
    PyMem_Free(v->any_of);
    for (size_t i = 0; i < v->n_none_of; i++) block_free(&v->none_of[i]);
    PyMem_Free(v->none_of);
}

static int Matcher_init(MatcherObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *specs_arg;
    static char *kwlist[] = {"view_specs", NULL};
    if (self->views) {
        PyErr_SetString(PyExc_RuntimeError, "Matcher is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Matcher", kwlist, &specs_arg)) return -1;
    PyObject *specs = PySequence_Fast(specs_arg, "view_specs must be a sequence");
    if (!specs) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(specs);
    self->owned = PyList_New(0);
    self->group_by_bucket = PyDict_New();
    self->views = PyMem_Calloc(n ? (size_t)n : 1, sizeof *self->views);
    self->view_numbers = PyMem_Calloc(n ? (size_t)n : 1, sizeof *self->view_numbers);
    if (!self->owned || !self->group_by_bucket || !self->views || !self->view_numbers) {
        Py_DECREF(specs);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        self->nviews = (size_t)i + 1;   /* so that dealloc frees what this view allocated */
        if (view_of(self, PySequence_Fast_GET_ITEM(specs, i), &self->views[i]) < 0
            || !(self->view_numbers[i] = PyLong_FromSsize_t(i))) {
            Py_DECREF(specs);
            return -1;
        }
    }
    self->nviews = (size_t)n;
    Py_DECREF(specs);
    return 0;
}

static void Matcher_dealloc(MatcherObject *self)
{
    for (size_t i = 0; i < self->nviews; i++) {
        view_free(&self->views[i]);
        if (self->view_numbers) Py_XDECREF(self->view_numbers[i]);
    }
    PyMem_Free(self->views);
    PyMem_Free(self->view_numbers);
    for (size_t g = 0; g < self->ngroups; g++) dfs_group_free(self->groups[g]);
    PyMem_Free(self->groups);
    Py_XDECREF(self->owned);
    Py_XDECREF(self->group_by_bucket);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The group of views whose bucket rule accepts `bucket`, built on first use and kept for
 * the matcher's life: bucket names come from notifications of a few configured buckets. */
static dfs_group *group_for(MatcherObject *self, PyObject *bucket)
{
    PyObject *found = PyDict_GetItemWithError(self->group_by_bucket, bucket);
    if (found) return self->groups[PyLong_AsSsize_t(found)];
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t blen;
    const char *b = PyUnicode_AsUTF8AndSize(bucket, &blen);
    if (!b) return NULL;
    if (self->ngroups == self->groups_cap) {
        size_t cap = self->groups_cap ? 2 * self->groups_cap : 8;
        dfs_group **grown = PyMem_Realloc(self->groups, cap * sizeof *grown);
        if (!grown) { PyErr_NoMemory(); return NULL; }
        self->groups = grown;
        self->groups_cap = cap;
    }
    dfs_group *g = dfs_group_build(self->views, self->nviews, b, (size_t)blen);
    if (!g) { PyErr_NoMemory(); return NULL; }
    PyObject *number = PyLong_FromSize_t(self->ngroups);
    if (!number || PyDict_SetItem(self->group_by_bucket, bucket, number) < 0) {
        Py_XDECREF(number);
        dfs_group_free(g);
        return NULL;
    }
    Py_DECREF(number);
    self->groups[self->ngroups++] = g;
    if (dfs_group_size(g) > self->max_group) self->max_group = dfs_group_size(g);
    return g;
}

/* ---- converting objects ---- */

/* What a call asks of each object; the partial answers take the tags as unknown. */
typedef enum { ASK_MATCH, ASK_PARTIAL, ASK_TAGS_COULD_MATTER } question;

typedef struct {
    dfs_object *objects;
    dfs_group **groups;          /* per object; NULL: no view names its bucket */
    size_t *prop_start;          /* per object, index into props (fixed up after growth) */
    dfs_prop *props;
    size_t nprops, props_cap;
    PyObject **refs;             /* strings the C structs point into, released at the end */
    size_t nrefs, refs_cap;
} batch;

static int keep(batch *b, PyObject *ref)
{
    if (b->nrefs == b->refs_cap) {
        size_t cap = b->refs_cap ? 2 * b->refs_cap : 64;
        PyObject **grown = PyMem_Realloc(b->refs, cap * sizeof *grown);
        if (!grown) { Py_DECREF(ref); PyErr_NoMemory(); return -1; }
        b->refs = grown;
        b->refs_cap = cap;
    }
    b->refs[b->nrefs++] = ref;
    return 0;
}

/* UTF-8 of a str attribute; steals the reference to `value`. */
static int text_of(batch *b, PyObject *value, dfs_str *out, const char *what)
{
    Py_ssize_t n;
    if (!value) return -1;
    if (keep(b, value) < 0) return -1;
    if (!PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(value)->tp_name);
        return -1;
    }
    out->s = PyUnicode_AsUTF8AndSize(value, &n);
    out->n = (size_t)n;
    return out->s ? 0 : -1;
}

/* A property key lowercased like str.lower(); ASCII keys already in lowercase skip the call. */
static int lowered_key_of(batch *b, PyObject *key, dfs_str *out)
{
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_TypeError, "tag and metadata keys must be str, not %.100s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    if (PyUnicode_IS_ASCII(key)) {
        const char *s = (const char *)PyUnicode_DATA(key);
        Py_ssize_t n = PyUnicode_GET_LENGTH(key), i = 0;
        while (i < n && !(s[i] >= 'A' && s[i] <= 'Z')) i++;
        if (i == n) {
            out->s = s;
            out->n = (size_t)n;
            return 0;
        }
    }
    return text_of(b, PyObject_CallMethodNoArgs(key, str_lower), out, "tag key");
}

/* Appends the entries of the object's `tags` or `metadata` attribute; steals `mapping`. */
static int add_props(batch *b, PyObject *mapping, int source, const char *what)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    if (!mapping || keep(b, mapping) < 0) return -1;
    if (!PyDict_Check(mapping)) {
        PyErr_Format(PyExc_TypeError, "%s must be a dict, not %.100s", what, Py_TYPE(mapping)->tp_name);
        return -1;
    }
    while (PyDict_Next(mapping, &pos, &key, &value)) {
        if (b->nprops == b->props_cap) {
            size_t cap = b->props_cap ? 2 * b->props_cap : 64;
            dfs_prop *grown = PyMem_Realloc(b->props, cap * sizeof *grown);
            if (!grown) { PyErr_NoMemory(); return -1; }
            b->props = grown;
            b->props_cap = cap;
        }
        dfs_prop *p = &b->props[b->nprops];
        p->source = source;
        Py_INCREF(value);
        if (text_of(b, value, &p->value, source == DFS_FROM_TAGS ? "tag value" : "metadata value") < 0
            || lowered_key_of(b, key, &p->key) < 0)
            return -1;
        b->nprops++;
    }
    return 0;
}

static int convert_object(MatcherObject *self, batch *b, size_t i, PyObject *obj, question asked)
{
    dfs_object *o = &b->objects[i];
    PyObject *bucket = PyObject_GetAttr(obj, attr_bucket);
    if (!bucket || keep(b, bucket) < 0) return -1;
    if (!PyUnicode_Check(bucket)) {
        PyErr_Format(PyExc_TypeError, "bucket must be str, not %.100s", Py_TYPE(bucket)->tp_name);
        return -1;
    }
    dfs_group *g = group_for(self, bucket);
    if (!g) return -1;
    b->prop_start[i] = b->nprops;
    if (dfs_group_size(g) == 0) return 0;   /* no view names this bucket */
    int reads = dfs_group_reads(g);
    if (asked == ASK_TAGS_COULD_MATTER && !(reads & DFS_FROM_TAGS)) return 0;   /* the answer is no */
    if (text_of(b, PyObject_GetAttr(obj, attr_key), &o->key, "key") < 0) return -1;
    PyObject *value = PyObject_GetAttr(obj, attr_size);
    if (!value) return -1;
    o->size = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (o->size == -1 && PyErr_Occurred()) return -1;
    value = PyObject_GetAttr(obj, attr_mtime);
    if (!value) return -1;
    o->mtime = PyFloat_AsDouble(value);
    Py_DECREF(value);
    if (o->mtime == -1.0 && PyErr_Occurred()) return -1;
    if ((reads & DFS_FROM_TAGS) && asked == ASK_MATCH
        && add_props(b, PyObject_GetAttr(obj, attr_tags), DFS_FROM_TAGS, "tags") < 0)
        return -1;
    if ((reads & DFS_FROM_METADATA)
        && add_props(b, PyObject_GetAttr(obj, attr_metadata), DFS_FROM_METADATA, "metadata") < 0)
        return -1;
    o->nprops = b->nprops - b->prop_start[i];
    b->groups[i] = g;
    return 0;
}

static void batch_free(batch *b)
{
    for (size_t i = 0; i < b->nrefs; i++) Py_DECREF(b->refs[i]);
    PyMem_Free(b->refs);
    PyMem_Free(b->props);
    PyMem_Free(b->objects);
    PyMem_Free(b->groups);
    PyMem_Free(b->prop_start);
}

static int batch_convert(MatcherObject *self, batch *b, PyObject *const *objs, size_t n, question asked)
{
    memset(b, 0, sizeof *b);
    b->objects = PyMem_Calloc(n ? n : 1, sizeof *b->objects);
    b->groups = PyMem_Calloc(n ? n : 1, sizeof *b->groups);
    b->prop_start = PyMem_Calloc(n ? n : 1, sizeof *b->prop_start);
    if (!b->objects || !b->groups || !b->prop_start) { PyErr_NoMemory(); return -1; }
    for (size_t i = 0; i < n; i++)
        if (convert_object(self, b, i, objs[i], asked) < 0) return -1;
    for (size_t i = 0; i < n; i++) b->objects[i].props = b->props + b->prop_start[i];
    return 0;
}

static int now_of(PyObject *arg, double *now)
{
    *now = PyFloat_AsDouble(arg);
    return (*now == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* One answer per object: `count` view ids at ids[offset..], the first `definite` of them
 * matching (whatever the tags, when partial) and the rest undecided. For
 * ASK_TAGS_COULD_MATTER, `definite` is the yes/no answer and there are no ids. */
typedef struct { size_t offset, count, definite; } answer;

/* Batches of at least this many objects are answered without the GIL. A smaller one
 * keeps it: giving it up for a few microseconds of work costs a thread that needs it
 * back (the mount's loop, one object per upload) up to the interpreter's switch interval
 * whenever another thread is busy. */
#define GIL_FREE_BATCH 64

/* Answers every object (a big batch without the GIL). */
static int batch_answer(MatcherObject *self, batch *b, size_t n, double now, question asked,
                        size_t **ids, answer *answers)
{
    size_t used = 0, cap = 0, room = self->max_group ? self->max_group : 1;
    size_t *out = NULL, *scratch = NULL;
    int failed = 0;
    PyThreadState *released = n >= GIL_FREE_BATCH ? PyEval_SaveThread() : NULL;
    if (asked != ASK_MATCH) failed = !(scratch = malloc(room * sizeof *scratch));
    for (size_t i = 0; i < n && !failed; i++) {
        answer *a = &answers[i];
        *a = (answer){used, 0, 0};
        if (!b->groups[i]) continue;
        if (asked == ASK_TAGS_COULD_MATTER) {
            a->definite = (size_t)dfs_group_tags_could_matter(b->groups[i], self->views, &b->objects[i],
                                                              now, scratch);
            continue;
        }
        if (used + room > cap) {
            size_t grown_cap = 2 * cap > used + room ? 2 * cap : used + room + 1024;
            size_t *grown = realloc(out, grown_cap * sizeof *grown);
            if (!grown) { failed = 1; break; }
            out = grown;
            cap = grown_cap;
        }
        if (asked == ASK_MATCH) {
            a->definite = a->count = dfs_group_match(b->groups[i], self->views, &b->objects[i], now, out + used);
        } else {
            size_t undecided;
            a->definite = dfs_group_match_partial(b->groups[i], self->views, &b->objects[i], now,
                                                  out + used, scratch, &undecided);
            memcpy(out + used + a->definite, scratch, undecided * sizeof *scratch);
            a->count = a->definite + undecided;
        }
        used += a->count;
    }
    free(scratch);
    if (released) PyEval_RestoreThread(released);
    if (failed) {
        free(out);
        PyErr_NoMemory();
        return -1;
    }
    *ids = out;
    return 0;
}

static PyObject *index_list(MatcherObject *self, const size_t *ids, size_t count)
{
    PyObject *list = PyList_New((Py_ssize_t)count);
    if (!list) return NULL;
    for (size_t k = 0; k < count; k++) {
        PyObject *number = self->view_numbers[ids[k]];
        Py_INCREF(number);
        PyList_SET_ITEM(list, (Py_ssize_t)k, number);
    }
    return list;
}

/* The Python form of one answer: list[int], (list[int], list[int]) or bool. */
static PyObject *answer_object(MatcherObject *self, const size_t *ids, const answer *a, question asked)
{
    if (asked == ASK_TAGS_COULD_MATTER) return PyBool_FromLong((long)a->definite);
    if (asked == ASK_MATCH) return index_list(self, ids + a->offset, a->count);
    PyObject *definite = index_list(self, ids + a->offset, a->definite);
    PyObject *undecided = definite ? index_list(self, ids + a->offset + a->definite, a->count - a->definite) : NULL;
    PyObject *pair = undecided ? PyTuple_Pack(2, definite, undecided) : NULL;
    Py_XDECREF(definite);
    Py_XDECREF(undecided);
    return pair;
}

/* A list of answers, one per object. */
static PyObject *answer_objects(MatcherObject *self, PyObject *const *objs, size_t n, double now, question asked)
{
    batch b;
    size_t *ids = NULL;
    answer *answers = NULL;
    PyObject *list = NULL;
    if (batch_convert(self, &b, objs, n, asked) < 0) goto done;
    answers = PyMem_Malloc((n ? n : 1) * sizeof *answers);
    if (!answers) { PyErr_NoMemory(); goto done; }
    if (batch_answer(self, &b, n, now, asked, &ids, answers) < 0) goto done;
    list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *item = answer_object(self, ids, &answers[i], asked);
        if (!item) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
done:
    free(ids);
    PyMem_Free(answers);
    batch_free(&b);
    return list;
}

/* (objs, now) -> one answer per object */
static PyObject *answer_batch(MatcherObject *self, PyObject *args, question asked, const char *format)
{
    PyObject *objs_arg, *now_arg;
    double now;
    if (!PyArg_ParseTuple(args, format, &objs_arg, &now_arg) || now_of(now_arg, &now) < 0)
        return NULL;
    PyObject *objs = PySequence_Fast(objs_arg, "a batch is a sequence of objects");
    if (!objs) return NULL;
    PyObject *list = answer_objects(self, PySequence_Fast_ITEMS(objs),
                                    (size_t)PySequence_Fast_GET_SIZE(objs), now, asked);
    Py_DECREF(objs);
    return list;
}

static PyObject *Matcher_match(MatcherObject *self, PyObject *args)
{
    PyObject *obj, *now_arg;
    double now;
    if (!PyArg_ParseTuple(args, "OO:match", &obj, &now_arg) || now_of(now_arg, &now) < 0) return NULL;
    PyObject *lists = answer_objects(self, &obj, 1, now, ASK_MATCH);
    if (!lists) return NULL;
    PyObject *result = PyList_GET_ITEM(lists, 0);
    Py_INCREF(result);
    Py_DECREF(lists);
    return result;
}

static PyObject *Matcher_match_batch(MatcherObject *self, PyObject *args)
{
    return answer_batch(self, args, ASK_MATCH, "OO:match_batch");
}

static PyObject *Matcher_match_partial_batch(MatcherObject *self, PyObject *args)
{
    return answer_batch(self, args, ASK_PARTIAL, "OO:match_partial_batch");
}

static PyObject *Matcher_tags_could_matter_batch(MatcherObject *self, PyObject *args)
{
    return answer_batch(self, args, ASK_TAGS_COULD_MATTER, "OO:tags_could_matter_batch");
}

static PyObject *Matcher_next_flip(MatcherObject *self, PyObject *args)
{
    PyObject *obj, *now_arg;
    double now, when = 0.0;
    int found = 0;
    batch b;
    int tags_unknown = 0;
    if (!PyArg_ParseTuple(args, "OO|p:next_flip", &obj, &now_arg, &tags_unknown) || now_of(now_arg, &now) < 0)
        return NULL;
    if (batch_convert(self, &b, &obj, 1, tags_unknown ? ASK_PARTIAL : ASK_MATCH) < 0) {
        batch_free(&b);
        return NULL;
    }
    if (b.groups[0]) {
        size_t *scratch = PyMem_Malloc((self->max_group ? self->max_group : 1) * sizeof *scratch);
        if (!scratch) { batch_free(&b); return PyErr_NoMemory(); }
        found = dfs_group_next_flip(b.groups[0], self->views, &b.objects[0], now, tags_unknown, scratch, &when);
        PyMem_Free(scratch);
    }
    batch_free(&b);
    if (!found) Py_RETURN_NONE;
    return PyFloat_FromDouble(when);
}

static PyMethodDef Matcher_methods[] = {
    {"match", (PyCFunction)Matcher_match, METH_VARARGS,
     "match(obj, now) -> list[int]: indices of the views obj matches, ascending."},
    {"match_batch", (PyCFunction)Matcher_match_batch, METH_VARARGS,
     "match_batch(objs, now) -> list[list[int]]: match for each object; runs without the GIL."},
    {"match_partial_batch", (PyCFunction)Matcher_match_partial_batch, METH_VARARGS,
     "match_partial_batch(objs, now) -> list[tuple[list[int], list[int]]]: with the tags unknown, "
     "per object the views it matches whatever its tags and the views whose answer may depend on them."},
    {"tags_could_matter_batch", (PyCFunction)Matcher_tags_could_matter_batch, METH_VARARGS,
     "tags_could_matter_batch(objs, now) -> list[bool]: per object, whether some view's answer may "
     "depend on its tags (its tags are ignored)."},
    {"next_flip", (PyCFunction)Matcher_next_flip, METH_VARARGS,
     "next_flip(obj, now, tags_unknown=False) -> float | None: earliest time > now at which time alone "
     "can change match (with tags_unknown, obj's tags are ignored and may be anything)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rulesets._native.Matcher",
    .tp_basicsize = sizeof(MatcherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Matcher(view_specs): compiled views (build it with rulesets.compile_views).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Matcher_init,
    .tp_dealloc = (destructor)Matcher_dealloc,
    .tp_methods = Matcher_methods,
};

static PyMethodDef native_methods[] = {
    {"glob_match", py_glob_match, METH_VARARGS,
     "glob_match(pattern, text) -> bool: DelveFS glob semantics for a brace-free pattern "
     "(rulesets.globs.brace_free_match; braces are expanded before compiling)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "rulesets._native",
    "Compiled matcher for DelveFS rulesets.", -1, native_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&attr_bucket, "bucket"}, {&attr_key, "key"}, {&attr_size, "size"}, {&attr_mtime, "mtime"},
        {&attr_tags, "tags"}, {&attr_metadata, "metadata"}, {&str_lower, "lower"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].name))) return NULL;
    if (PyType_Ready(&MatcherType) < 0) return NULL;
    PyObject *module = PyModule_Create(&native_module);
    if (!module) return NULL;
    if (PyModule_AddObjectRef(module, "Matcher", (PyObject *)&MatcherType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
