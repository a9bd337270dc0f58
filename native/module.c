/* rulesets._native: the compiled hot path of DelveFS rulesets. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "glob.h"

static PyObject *py_glob_match(PyObject *self, PyObject *args)
{
    const char *pat, *str;
    Py_ssize_t plen, slen;
    (void)self;
    if (!PyArg_ParseTuple(args, "s#s#:glob_match", &pat, &plen, &str, &slen))
        return NULL;
    return PyBool_FromLong(dfs_glob_match(pat, (size_t)plen, str, (size_t)slen));
}

static PyMethodDef native_methods[] = {
    {"glob_match", py_glob_match, METH_VARARGS,
     "glob_match(pattern, text) -> bool: DelveFS glob semantics (see rulesets.globs)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "rulesets._native",
    "Compiled matcher for DelveFS rulesets.", -1, native_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&native_module);
}
