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
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:I}", "input_bytes",
                         (unsigned long long)s->input_bytes, "output_bytes",
                         (unsigned long long)s->output_bytes, "copy_bytes",
                         (unsigned long long)s->copy_bytes, "literal_bytes",
                         (unsigned long long)s->literal_bytes, "numeric_bytes",
                         (unsigned long long)s->numeric_bytes, "block_len", s->block_len,
                         "strong_len", s->strong_len, "threads", s->threads);
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
    if (threads < 1 || threads > (int)MD_MAX_WORKERS) {
        PyErr_Format(PyExc_ValueError, "threads must be between 1 and %u", MD_MAX_WORKERS);
        return -1;
    }
    return 0;
}

/* An optional writable buffer of at least 4 aligned bytes: set nonzero to cancel. */
static int get_cancel(PyObject *obj, Py_buffer *view, volatile int **out) {
    *out = NULL;
    if (obj == NULL || obj == Py_None) return 0;
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) != 0) return -1;
    if (view->len < (Py_ssize_t)sizeof(int) || ((uintptr_t)view->buf % sizeof(int)) != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "cancel must be a writable, aligned buffer of 4 bytes");
        return -1;
    }
    *out = (volatile int *)view->buf;
    return 1;
}

typedef md_status (*three_fd_fn)(int, int, int, const md_options *, md_stats *, md_error *);

/* The options every operation takes, as keywords after its descriptors. */
static PyObject *run(three_fd_fn fn, int a, int b, int c, md_options *opt, PyObject *prog, PyObject *cancel) {
    Py_buffer pview, cview;
    md_stats st = {0};
    md_error err = {0};
    md_status rc;
    if (check_threads((int)opt->threads) != 0) return NULL;
    int held = get_progress(prog, &pview, &opt->progress);
    if (held < 0) return NULL;
    int cheld = get_cancel(cancel, &cview, &opt->cancel);
    if (cheld < 0) {
        if (held) PyBuffer_Release(&pview);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rc = fn(a, b, c, opt, &st, &err);
    Py_END_ALLOW_THREADS
    if (held) PyBuffer_Release(&pview);
    if (cheld) PyBuffer_Release(&cview);
    if (rc != MD_OK) return raise_status(rc, &err);
    return stats_dict(&st);
}

static md_status signature_fn(int a, int b, int c, const md_options *o, md_stats *s, md_error *e) {
    (void)c;
    return md_signature(a, b, o, s, e);
}

static PyObject *py_signature(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"old_fd", "sig_fd", "threads", "block_len", "progress", "portable", "cancel", NULL};
    int a, b, threads = 1, portable = 0;
    unsigned int block_len = 0;
    PyObject *prog = NULL, *cancel = NULL;
    md_options opt = {0};
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ii|iIOpO", kwlist, &a, &b, &threads, &block_len, &prog,
                                     &portable, &cancel))
        return NULL;
    opt.threads = (uint32_t)threads;
    opt.block_len = block_len;
    opt.flags = portable ? MD_PORTABLE : 0;
    return run(signature_fn, a, b, -1, &opt, prog, cancel);
}

static PyObject *py_delta(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sig_fd", "new_fd", "delta_fd", "threads", "progress", "portable", "cancel", NULL};
    int a, b, c, threads = 1, portable = 0;
    PyObject *prog = NULL, *cancel = NULL;
    md_options opt = {0};
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iii|iOpO", kwlist, &a, &b, &c, &threads, &prog, &portable,
                                     &cancel))
        return NULL;
    opt.threads = (uint32_t)threads;
    opt.flags = portable ? MD_PORTABLE : 0;
    return run(md_delta, a, b, c, &opt, prog, cancel);
}

static PyObject *py_delta_basis(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"old_fd", "new_fd", "delta_fd", "threads", "progress", "portable", "cancel",
                             "elem_width", NULL};
    int a, b, c, threads = 1, portable = 0;
    unsigned int width = 0;
    PyObject *prog = NULL, *cancel = NULL;
    md_options opt = {0};
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iii|iOpOI", kwlist, &a, &b, &c, &threads, &prog, &portable,
                                     &cancel, &width))
        return NULL;
    opt.threads = (uint32_t)threads;
    opt.flags = portable ? MD_PORTABLE : 0;
    opt.elem_width = width;
    return run(md_delta_basis, a, b, c, &opt, prog, cancel);
}

static PyObject *py_patch(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"old_fd", "delta_fd", "out_fd", "threads", "progress", "portable", "cancel",
                             "durable", "max_output", NULL};
    int a, b, c, threads = 1, portable = 0, durable = 0;
    unsigned long long max_output = 0;
    PyObject *prog = NULL, *cancel = NULL;
    md_options opt = {0};
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iii|iOpOpK", kwlist, &a, &b, &c, &threads, &prog, &portable,
                                     &cancel, &durable, &max_output))
        return NULL;
    opt.threads = (uint32_t)threads;
    opt.flags = (portable ? MD_PORTABLE : 0) | (durable ? MD_DURABLE : 0);
    opt.max_output = max_output;
    return run(md_patch, a, b, c, &opt, prog, cancel);
}

static PyObject *py_default_block_len(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long size = PyLong_AsUnsignedLongLong(arg);
    if (size == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLong(md_default_block_len(size));
}

static PyMethodDef methods[] = {
    {"signature", (PyCFunction)(void (*)(void))py_signature, METH_VARARGS | METH_KEYWORDS,
     "signature(old_fd, sig_fd, threads=1, block_len=0, progress=None, portable=False, cancel=None) -> dict"},
    {"delta", (PyCFunction)(void (*)(void))py_delta, METH_VARARGS | METH_KEYWORDS,
     "delta(sig_fd, new_fd, delta_fd, threads=1, progress=None, portable=False, cancel=None) -> dict"},
    {"delta_basis", (PyCFunction)(void (*)(void))py_delta_basis, METH_VARARGS | METH_KEYWORDS,
     "delta_basis(old_fd, new_fd, delta_fd, threads=1, progress=None, portable=False, cancel=None, "
     "elem_width=0) -> dict"},
    {"patch", (PyCFunction)(void (*)(void))py_patch, METH_VARARGS | METH_KEYWORDS,
     "patch(old_fd, delta_fd, out_fd, threads=1, progress=None, portable=False, cancel=None, "
     "durable=False, max_output=0) -> dict"},
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
    PyModule_AddIntConstant(m, "E_LIMIT", MD_E_LIMIT);
    PyModule_AddIntConstant(m, "E_CANCELLED", MD_E_CANCELLED);
    PyModule_AddIntConstant(m, "MAX_WORKERS", MD_MAX_WORKERS);
    PyModule_AddIntConstant(m, "MIN_BLOCK_LEN", MD_MIN_BLOCK_LEN);
    PyModule_AddIntConstant(m, "MAX_BLOCK_LEN", MD_MAX_BLOCK_LEN);
    return m;
}
