/* A tensorclass's data[i] / data[a:b] (FieldIndexer) and Cls(*tensors, batch_size=[n])
 * (FieldInit) in C, each in front of the Python code generated per class. See module.c. */
#include "speedups.h"

/* ------------------------------------------------------------------ tensorclass data[i]
 * FieldIndexer: the __getitem__ of one tensorclass for data[i] and data[a:b], the hot read
 * of a dataset of tensorclasses. It does what the Python code generated per class in
 * _tensorclass_indexing.py does, without a Python frame: read each field from the instance
 * dict, index it, fill a new instance's dict, set its (batch, device) state. It only takes
 * an int or a slice on a one-dim batch with every field present and a plain torch.Tensor;
 * anything else, and an index the first field refuses (IndexError, ValueError), goes to the
 * general __getitem__, which words the error. It is a method descriptor (called unbound
 * with the instance first), so data[i] reaches it straight from the type's slot. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *names;      /* the field names, a tuple of str */
    PyObject *state;      /* the member descriptor of the instance's (batch, device) state */
    PyObject *general;    /* the general __getitem__ */
    PyObject *no_batch;   /* the batch size of an int-indexed result */
    PyTypeObject *plain;  /* torch.Tensor */
} FieldIndexer;

static PyObject *
indexer_general(FieldIndexer *ix, PyObject *const *args)
{
    return PyObject_Vectorcall(ix->general, args, 2, NULL);
}

static PyObject *
indexer_fast(FieldIndexer *ix, PyObject *self, PyObject *index, PyObject *state, PyObject *source,
             PyObject **fields, Py_ssize_t n, int *handled)
{
    /* Returns the new instance, or NULL with *handled == 0 (take the general path) or
     * *handled == 1 (an error is set). `fields` holds n new references, released by the caller. */
    *handled = 0;
    if (PyDict_GET_SIZE(source) != n) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyDict_GetItemWithError(source, PyTuple_GET_ITEM(ix->names, i));
        if (value == NULL) {
            *handled = PyErr_Occurred() != NULL;
            return NULL;
        }
        if (Py_TYPE(value) != ix->plain) {
            return NULL;
        }
        fields[i] = Py_NewRef(value);
    }
    PyObject *first = PyObject_GetItem(fields[0], index);
    if (first == NULL) {
        if (PyErr_ExceptionMatches(PyExc_IndexError) || PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
        }
        else {
            *handled = 1;
        }
        return NULL;
    }
    Py_SETREF(fields[0], first);
    *handled = 1;
    PyObject *batch;
    if (PyLong_CheckExact(index)) {
        batch = Py_NewRef(ix->no_batch);
    }
    else {
        /* The rows a slice kept: the first size of the indexed field. */
        Py_ssize_t rows = td_tensor_length(first);
        if (rows < 0) {
            return NULL;
        }
        batch = Py_BuildValue("(n)", rows);
        if (batch == NULL) {
            return NULL;
        }
    }
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *indexed = PyObject_GetItem(fields[i], index);
        if (indexed == NULL) {
            Py_DECREF(batch);
            return NULL;
        }
        Py_SETREF(fields[i], indexed);
    }
    PyObject *result = PyBaseObject_Type.tp_new(Py_TYPE(self), td_empty_tuple, NULL);
    PyObject *out = result == NULL ? NULL : PyObject_GenericGetDict(result, NULL);
    PyObject *new_state = out == NULL ? NULL : PyTuple_Pack(2, batch, PyTuple_GET_ITEM(state, 1));
    Py_DECREF(batch);
    if (new_state == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(result);
        return NULL;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        failed = PyDict_SetItem(out, PyTuple_GET_ITEM(ix->names, i), fields[i]) < 0;
    }
    Py_DECREF(out);
    if (!failed) {
        failed = Py_TYPE(ix->state)->tp_descr_set(ix->state, result, new_state) < 0;
    }
    Py_DECREF(new_state);
    if (failed) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

#define MAX_FAST_FIELDS 64

static PyObject *
indexer_vectorcall(FieldIndexer *ix, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "__getitem__ takes an instance and one index");
        return NULL;
    }
    PyObject *self = args[0], *index = args[1];
    Py_ssize_t n = PyTuple_GET_SIZE(ix->names);
    if (!(PyLong_CheckExact(index) || PySlice_Check(index)) || n > MAX_FAST_FIELDS) {
        return indexer_general(ix, args);
    }
    PyObject *state = Py_TYPE(ix->state)->tp_descr_get(ix->state, self, (PyObject *)Py_TYPE(self));
    if (state == NULL) {
        return NULL;
    }
    /* (batch size, device) until a TensorDict is needed; one batch dim */
    if (!PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) != 2
            || !PyTuple_Check(PyTuple_GET_ITEM(state, 0)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(state, 0)) != 1) {
        Py_DECREF(state);
        return indexer_general(ix, args);
    }
    PyObject *source = PyObject_GenericGetDict(self, NULL);
    if (source == NULL) {
        Py_DECREF(state);
        return NULL;
    }
    PyObject *fields[MAX_FAST_FIELDS] = {NULL};
    int handled;
    PyObject *result = indexer_fast(ix, self, index, state, source, fields, n, &handled);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(fields[i]);
    }
    Py_DECREF(source);
    Py_DECREF(state);
    if (result != NULL || handled) {
        return result;
    }
    return indexer_general(ix, args);
}

static PyObject *
method_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static int
indexer_traverse(FieldIndexer *ix, visitproc visit, void *arg)
{
    Py_VISIT(ix->names);
    Py_VISIT(ix->state);
    Py_VISIT(ix->general);
    Py_VISIT(ix->no_batch);
    Py_VISIT(ix->plain);
    return 0;
}

static int
indexer_clear(FieldIndexer *ix)
{
    Py_CLEAR(ix->names);
    Py_CLEAR(ix->state);
    Py_CLEAR(ix->general);
    Py_CLEAR(ix->no_batch);
    Py_CLEAR(ix->plain);
    return 0;
}

static void
indexer_dealloc(FieldIndexer *ix)
{
    PyObject_GC_UnTrack(ix);
    indexer_clear(ix);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static PyTypeObject FieldIndexerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchdict._speedups.FieldIndexer",
    .tp_basicsize = sizeof(FieldIndexer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "data[index] for one tensorclass: an int or a slice over its plain tensor fields, in C.",
    .tp_vectorcall_offset = offsetof(FieldIndexer, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = method_get,
    .tp_traverse = (traverseproc)indexer_traverse,
    .tp_clear = (inquiry)indexer_clear,
    .tp_dealloc = (destructor)indexer_dealloc,
};

static int
check_names(PyObject *names)
{
    /* No upper bound: a FieldIndexer hands a class of more than MAX_FAST_FIELDS fields to the
     * general path at each call, and a FieldInit needs no per-field buffer. */
    if (!PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) == 0) {
        PyErr_SetString(PyExc_TypeError, "expected a non-empty tuple of field names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "field names must be str");
            return -1;
        }
    }
    return 0;
}

PyObject *
td_make_field_indexer(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (field names, the state member descriptor, the general __getitem__, the batch size
     *  of an int-indexed result, torch.Tensor) -> a FieldIndexer */
    if (td_check_args("make_field_indexer", nargs, 5) < 0 || td_check_ready() < 0) {
        return NULL;
    }
    PyObject *names = args[0];
    if (check_names(names) < 0) {
        return NULL;
    }
    PyTypeObject *descr_type = Py_TYPE(args[1]);
    if (descr_type->tp_descr_get == NULL || descr_type->tp_descr_set == NULL || !PyCallable_Check(args[2])
            || !PyType_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "make_field_indexer expects a data descriptor, a callable and a class");
        return NULL;
    }
    FieldIndexer *ix = PyObject_GC_New(FieldIndexer, &FieldIndexerType);
    if (ix == NULL) {
        return NULL;
    }
    ix->vectorcall = (vectorcallfunc)indexer_vectorcall;
    ix->names = Py_NewRef(names);
    ix->state = Py_NewRef(args[1]);
    ix->general = Py_NewRef(args[2]);
    ix->no_batch = Py_NewRef(args[3]);
    ix->plain = (PyTypeObject *)Py_NewRef(args[4]);
    PyObject_GC_Track(ix);
    return (PyObject *)ix;
}

/* ------------------------------------------------------------------ tensorclass Cls(*tensors, batch_size=[n])
 * FieldInit: the __init__ of one tensorclass for its commonest call, every field given by
 * position as a tensor whose first size is n, and batch_size=[n] (a one-item list of an
 * int n > 0) the only keyword. It stores the tensors in the instance dict and sets the
 * (batch, device) state, as the first branch of the generated Python __init__ does
 * (_tensorclass_fields.make_init); every other call goes to that Python __init__. Only made
 * for classes whose fields are all positional, with no defaults, no __post_init__ and not
 * frozen. Instances take attributes (a __dict__), so that it can carry the same marks as
 * the Python function it fronts. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *names;    /* the field names, a tuple of str */
    PyObject *state;    /* the member descriptor of the instance's (batch, device) state */
    PyObject *general;  /* the generated Python __init__ */
} FieldInit;

static PyObject *batch_size_name = NULL;

static int
is_batch_size_keyword(PyObject *kwnames)
{
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) != 1) {
        return 0;
    }
    PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
    return name == batch_size_name || (PyUnicode_CheckExact(name) && PyUnicode_Compare(name, batch_size_name) == 0);
}

/* 1 when the call was taken here, 0 for the general path, -1 on an error. */
static int
init_fast(FieldInit *ix, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t n = PyTuple_GET_SIZE(ix->names);
    if (nargs != n + 1 || !is_batch_size_keyword(kwnames)) {
        return 0;
    }
    PyObject *batch = args[nargs];
    if (!PyList_CheckExact(batch) || PyList_GET_SIZE(batch) != 1 || !PyLong_CheckExact(PyList_GET_ITEM(batch, 0))) {
        return 0;
    }
    PyObject *b0 = PyList_GET_ITEM(batch, 0);
    int overflow;
    long long first = PyLong_AsLongLongAndOverflow(b0, &overflow);
    if (overflow || first <= 0 || first > PY_SSIZE_T_MAX) {
        return 0;
    }
    Py_INCREF(b0);  /* the list may change while torch runs Python code */
    for (Py_ssize_t i = 1; i <= n; i++) {
        int ok = td_fits(args[i], (Py_ssize_t)first);
        if (ok <= 0) {
            Py_DECREF(b0);
            return ok;
        }
    }
    PyObject *self = args[0];
    PyObject *out = PyObject_GenericGetDict(self, NULL);
    PyObject *new_batch = out == NULL ? NULL : PyTuple_Pack(1, b0);
    PyObject *new_state = new_batch == NULL ? NULL : PyTuple_Pack(2, new_batch, Py_None);
    Py_DECREF(b0);
    Py_XDECREF(new_batch);
    if (new_state == NULL) {
        Py_XDECREF(out);
        return -1;
    }
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        failed = PyDict_SetItem(out, PyTuple_GET_ITEM(ix->names, i), args[i + 1]) < 0;
    }
    Py_DECREF(out);
    if (!failed) {
        failed = Py_TYPE(ix->state)->tp_descr_set(ix->state, self, new_state) < 0;
    }
    Py_DECREF(new_state);
    return failed ? -1 : 1;
}

static PyObject *
init_vectorcall(FieldInit *ix, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int taken = nargs >= 1 ? init_fast(ix, args, nargs, kwnames) : 0;
    if (taken < 0) {
        return NULL;
    }
    if (taken) {
        Py_RETURN_NONE;
    }
    return PyObject_Vectorcall(ix->general, args, nargsf, kwnames);
}

static int
init_traverse(FieldInit *ix, visitproc visit, void *arg)
{
    Py_VISIT(ix->dict);
    Py_VISIT(ix->names);
    Py_VISIT(ix->state);
    Py_VISIT(ix->general);
    return 0;
}

static int
init_clear(FieldInit *ix)
{
    Py_CLEAR(ix->dict);
    Py_CLEAR(ix->names);
    Py_CLEAR(ix->state);
    Py_CLEAR(ix->general);
    return 0;
}

static void
init_dealloc(FieldInit *ix)
{
    PyObject_GC_UnTrack(ix);
    init_clear(ix);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static PyTypeObject FieldInitType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "torchdict._speedups.FieldInit",
    .tp_basicsize = sizeof(FieldInit),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Cls(*tensors, batch_size=[n]) for one tensorclass, in C; other calls go to its Python __init__.",
    .tp_vectorcall_offset = offsetof(FieldInit, vectorcall),
    .tp_dictoffset = offsetof(FieldInit, dict),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = method_get,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_traverse = (traverseproc)init_traverse,
    .tp_clear = (inquiry)init_clear,
    .tp_dealloc = (destructor)init_dealloc,
};

PyObject *
td_make_field_init(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (field names, the state member descriptor, the Python __init__) -> a FieldInit */
    if (td_check_args("make_field_init", nargs, 3) < 0 || td_check_ready() < 0) {
        return NULL;
    }
    if (check_names(args[0]) < 0) {
        return NULL;
    }
    PyTypeObject *descr_type = Py_TYPE(args[1]);
    if (descr_type->tp_descr_get == NULL || descr_type->tp_descr_set == NULL || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "make_field_init expects a data descriptor and a callable");
        return NULL;
    }
    if (batch_size_name == NULL && (batch_size_name = PyUnicode_InternFromString("batch_size")) == NULL) {
        return NULL;
    }
    FieldInit *init = PyObject_GC_New(FieldInit, &FieldInitType);
    if (init == NULL) {
        return NULL;
    }
    init->vectorcall = (vectorcallfunc)init_vectorcall;
    init->dict = NULL;
    init->names = Py_NewRef(args[0]);
    init->state = Py_NewRef(args[1]);
    init->general = Py_NewRef(args[2]);
    PyObject_GC_Track(init);
    return (PyObject *)init;
}

int
td_add_tensorclass_types(PyObject *module)
{
    if (PyType_Ready(&FieldIndexerType) < 0 || PyType_Ready(&FieldInitType) < 0) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "FieldIndexer", (PyObject *)&FieldIndexerType) < 0
            || PyModule_AddObjectRef(module, "FieldInit", (PyObject *)&FieldInitType) < 0) {
        return -1;
    }
    return 0;
}
