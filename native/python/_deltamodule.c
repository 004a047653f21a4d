/* native._delta: the CPython binding of the delta engine. Deliberately thin:
 * it takes file descriptors, releases the GIL for the whole operation, and
 * turns an md_status into _delta.EngineError(code, message, errno); the Python
 * front (native/delta.py) maps codes to Meridian's exception classes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "meridian_delta.h"

static PyObject *EngineError;

static PyObject *raise_status(md_status st, const md_error *err) {
    PyObject *args = Py_BuildValue("(isi)", (int)st, err->message, err->sys_errno);
    if (args) {
        PyErr_SetObject(EngineError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *stats_dict(const md_stats *s) {
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:I,s:I}", "input_bytes",
                         (unsigned long long)s->input_bytes, "output_bytes",
                         (unsigned long long)s->output_bytes, "copy_bytes",
                         (unsigned long long)s->copy_bytes, "literal_bytes",
                         (unsigned long long)s->literal_bytes, "block_len", s->block_len,
                         "strong_len", s->strong_len);
}

/* An optional writable buffer of at least 8 aligned bytes receives progress. */
static int get_progress(PyObject *obj, Py_buffer *view, volatile uint64_t **out) {
    *out = NULL;
    if (obj == NULL || obj == Py_None) return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) != 0) return -1;
    if (view->len < 8 || ((uintptr_t)view->buf % 8) != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "progress must be a writable, aligned buffer of 8 bytes");
        return -1;
    }
    *out = (volatile uint64_t *)view->buf;
    return 1;
}

static int check_threads(int threads) {
    if (threads < 1 || threads > 64) {
        PyErr_SetString(PyExc_ValueError, "threads must be between 1 and 64");
        return -1;
    }
    return 0;
}

static PyObject *py_signature(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"old_fd", "sig_fd", "threads", "block_len", "progress", NULL};
    int old_fd, sig_fd, threads = 1;
    unsigned int block_len = 0;
    PyObject *prog = NULL;
    Py_buffer view;
    md_options opt = {0};
    md_stats st = {0};
    md_error err = {0};
    md_status rc;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|iIO", kwlist, &old_fd, &sig_fd, &threads,
                                     &block_len, &prog))
        return NULL;
    if (check_threads(threads) != 0) return NULL;
    int held = get_progress(prog, &view, &opt.progress);
    if (held < 0) return NULL;
    opt.threads = (uint32_t)threads;
    opt.block_len = block_len;
    Py_BEGIN_ALLOW_THREADS
    rc = md_signature(old_fd, sig_fd, &opt, &st, &err);
    Py_END_ALLOW_THREADS
    if (held) PyBuffer_Release(&view);
    if (rc != MD_OK) return raise_status(rc, &err);
    return stats_dict(&st);
}

typedef md_status (*three_fd_fn)(int, int, int, const md_options *, md_stats *, md_error *);

static PyObject *three_fd(three_fd_fn fn, PyObject *args, PyObject *kw, char **kwlist) {
    int a, b, c, threads = 1, durable = 0;
    PyObject *prog = NULL;
    Py_buffer view;
    md_options opt = {0};
    md_stats st = {0};
    md_error err = {0};
    md_status rc;
    /* only patch takes `durable` (its kwlist has the extra name) */
    if (!PyArg_ParseTupleAndKeywords(args, kw, fn == md_patch ? "iii|iOp" : "iii|iO", kwlist, &a, &b,
                                     &c, &threads, &prog, &durable))
        return NULL;
    if (check_threads(threads) != 0) return NULL;
    int held = get_progress(prog, &view, &opt.progress);
    if (held < 0) return NULL;
    opt.threads = (uint32_t)threads;
    opt.flags = durable ? MD_DURABLE : 0;
    Py_BEGIN_ALLOW_THREADS
    rc = fn(a, b, c, &opt, &st, &err);
    Py_END_ALLOW_THREADS
    if (held) PyBuffer_Release(&view);
    if (rc != MD_OK) return raise_status(rc, &err);
    return stats_dict(&st);
}

static PyObject *py_delta(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sig_fd", "new_fd", "delta_fd", "threads", "progress", NULL};
    (void)self;
    return three_fd(md_delta, args, kw, kwlist);
}

static PyObject *py_patch(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"old_fd", "delta_fd", "out_fd", "threads", "progress", "durable", NULL};
    (void)self;
    return three_fd(md_patch, args, kw, kwlist);
}

static PyObject *py_default_block_len(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long size = PyLong_AsUnsignedLongLong(arg);
    if (size == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLong(md_default_block_len(size));
}

static PyMethodDef methods[] = {
    {"signature", (PyCFunction)(void (*)(void))py_signature, METH_VARARGS | METH_KEYWORDS,
     "signature(old_fd, sig_fd, threads=1, block_len=0, progress=None) -> dict"},
    {"delta", (PyCFunction)(void (*)(void))py_delta, METH_VARARGS | METH_KEYWORDS,
     "delta(sig_fd, new_fd, delta_fd, threads=1, progress=None) -> dict"},
    {"patch", (PyCFunction)(void (*)(void))py_patch, METH_VARARGS | METH_KEYWORDS,
     "patch(old_fd, delta_fd, out_fd, threads=1, progress=None, durable=False) -> dict"},
    {"default_block_len", py_default_block_len, METH_O, "default_block_len(size) -> int"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native._delta",
                                    "Binding of the native rolling-hash delta engine.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__delta(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    EngineError = PyErr_NewException("native._delta.EngineError", NULL, NULL);
    if (!EngineError || PyModule_AddObjectRef(m, "EngineError", EngineError) < 0) {
        Py_XDECREF(EngineError);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "E_IO", MD_E_IO);
    PyModule_AddIntConstant(m, "E_CORRUPT_SIGNATURE", MD_E_CORRUPT_SIGNATURE);
    PyModule_AddIntConstant(m, "E_CORRUPT_DELTA", MD_E_CORRUPT_DELTA);
    PyModule_AddIntConstant(m, "E_TRUNCATED_DELTA", MD_E_TRUNCATED_DELTA);
    PyModule_AddIntConstant(m, "E_WRONG_BASIS", MD_E_WRONG_BASIS);
    PyModule_AddIntConstant(m, "E_INVALID", MD_E_INVALID);
    PyModule_AddIntConstant(m, "E_NOMEM", MD_E_NOMEM);
    PyModule_AddIntConstant(m, "MIN_BLOCK_LEN", MD_MIN_BLOCK_LEN);
    PyModule_AddIntConstant(m, "MAX_BLOCK_LEN", MD_MAX_BLOCK_LEN);
    return m;
}
