/* A tensorclass's data[i] / data[a:b] (FieldIndexer) and Cls(*tensors, batch_size=[n])
 * (FieldInit) in C, each in front of the Python code generated per class. See module.c. */
#include "speedups.h"

/* ------------------------------------------------------------------ tensorclass data[i]
 * FieldIndexer: the __getitem__ of one tensorclass for data[i] and data[a:b], the hot read
 * of a dataset of tensorclasses. It does what the Python code generated per class in
 * tensorclass/_indexing.py does, without a Python frame: read each field from the instance
 * dict, index it, fill a new instance's dict, set its (batch, device) state. It only takes
 * an int or a slice on a one-dim batch with every field present and a plain torch.Tensor;
 * anything else, and an index the first field refuses (IndexError, ValueError), goes to the
 * general __getitem__, which words the error. data[i] reaches it from the type's
 * mp_subscript slot (front_getitem, below); called directly it takes the instance first. */
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
 * (tensorclass._fields.make_init); every other call goes to that Python __init__. Only made
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

/* 1 when the call was taken here, 0 for the general path, -1 on an error. `fields` are the
 * n_given positional arguments after the instance; `batch` the batch_size keyword's value. */
static int
init_fast(FieldInit *ix, PyObject *self, PyObject *const *fields, Py_ssize_t n_given, PyObject *batch)
{
    Py_ssize_t n = PyTuple_GET_SIZE(ix->names);
    if (n_given != n) {
        return 0;
    }
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
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = td_fits(fields[i], (Py_ssize_t)first);
        if (ok <= 0) {
            Py_DECREF(b0);
            return ok;
        }
    }
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
        failed = PyDict_SetItem(out, PyTuple_GET_ITEM(ix->names, i), fields[i]) < 0;
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
    int taken = 0;
    if (nargs >= 1 && is_batch_size_keyword(kwnames)) {
        taken = init_fast(ix, args[0], args + 1, nargs - 1, args[nargs]);
    }
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

/* ------------------------------------------------------------------ the type slots
 * A FieldIndexer and a FieldInit do their work from the class's type slots (mp_subscript,
 * tp_init), not from its __dict__: the class keeps Python functions under __getitem__ and
 * __init__, which are what inspect and torch.compile read (Dynamo cannot look into C, and
 * traces those functions instead), while data[i] and Cls(...) reach the C code straight from
 * the slot. The helper object itself is kept in the class __dict__ (under a private name),
 * where the slot function finds the one of the instance's class. Assigning __getitem__ or
 * __init__ on the class afterwards gives the slot back to CPython (the Python function). */
static PyObject *getitem_attr = NULL;  /* "_torchdict_c_getitem" */
static PyObject *init_attr = NULL;     /* "_torchdict_c_init" */
static PyObject *getitem_name = NULL;  /* "__getitem__" */
static PyObject *init_name = NULL;     /* "__init__" */

/* The helper of kind `kind` that `type` (exactly) holds under `attr`, as a new reference;
 * NULL with or without an error set. */
static PyObject *
own_helper(PyTypeObject *type, PyObject *attr, PyTypeObject *kind)
{
    PyObject *dict = type->tp_dict;
    if (dict == NULL) {
        return NULL;
    }
    PyObject *helper = PyDict_GetItemWithError(dict, attr);
    if (helper == NULL || !Py_IS_TYPE(helper, kind)) {
        return NULL;
    }
    return Py_NewRef(helper);
}

static PyObject *
getitem_slot(PyObject *self, PyObject *index)
{
    PyObject *args[2] = {self, index};
    PyObject *helper = own_helper(Py_TYPE(self), getitem_attr, &FieldIndexerType);
    if (helper != NULL) {
        PyObject *result = indexer_vectorcall((FieldIndexer *)helper, args, 2, NULL);
        Py_DECREF(helper);
        return result;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    /* The helper was taken away: the class's own __getitem__. */
    PyObject *method = PyObject_GetAttr((PyObject *)Py_TYPE(self), getitem_name);
    if (method == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(method, args, 2, NULL);
    Py_DECREF(method);
    return result;
}

static int
init_slot(PyObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *general;
    PyObject *helper = own_helper(Py_TYPE(self), init_attr, &FieldInitType);
    if (helper != NULL) {
        FieldInit *init = (FieldInit *)helper;
        if (kwds != NULL && PyDict_GET_SIZE(kwds) == 1) {
            PyObject *batch = PyDict_GetItemWithError(kwds, batch_size_name);
            if (batch != NULL) {
                Py_INCREF(batch);
                int taken = init_fast(init, self, PySequence_Fast_ITEMS(args), PyTuple_GET_SIZE(args), batch);
                Py_DECREF(batch);
                if (taken != 0) {
                    Py_DECREF(helper);
                    return taken < 0 ? -1 : 0;
                }
            }
            else if (PyErr_Occurred()) {
                Py_DECREF(helper);
                return -1;
            }
        }
        general = Py_NewRef(init->general);
        Py_DECREF(helper);
    }
    else if (PyErr_Occurred()) {
        return -1;
    }
    else if ((general = PyObject_GetAttr((PyObject *)Py_TYPE(self), init_name)) == NULL) {
        return -1;
    }
    /* general(self, *args, **kwds) */
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *full = PyTuple_New(n + 1);
    if (full == NULL) {
        Py_DECREF(general);
        return -1;
    }
    PyTuple_SET_ITEM(full, 0, Py_NewRef(self));
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(full, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    }
    PyObject *result = PyObject_Call(general, full, kwds);
    Py_DECREF(full);
    Py_DECREF(general);
    if (result == NULL) {
        return -1;
    }
    if (result != Py_None) {
        PyErr_Format(PyExc_TypeError, "__init__() should return None, not '%.200s'", Py_TYPE(result)->tp_name);
        Py_DECREF(result);
        return -1;
    }
    Py_DECREF(result);
    return 0;
}

static int
check_heap_type(PyObject *cls, const char *name)
{
    if (!PyType_Check(cls) || !(((PyTypeObject *)cls)->tp_flags & Py_TPFLAGS_HEAPTYPE)
            || ((PyTypeObject *)cls)->tp_as_mapping == NULL) {
        PyErr_Format(PyExc_TypeError, "%s expects a class defined in Python", name);
        return -1;
    }
    return 0;
}

PyObject *
td_front_getitem(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (cls, FieldIndexer): data[i] of cls instances runs the indexer from the type slot. */
    if (td_check_args("front_getitem", nargs, 2) < 0 || check_heap_type(args[0], "front_getitem") < 0) {
        return NULL;
    }
    if (!Py_IS_TYPE(args[1], &FieldIndexerType)) {
        PyErr_SetString(PyExc_TypeError, "front_getitem expects a FieldIndexer");
        return NULL;
    }
    if (PyObject_SetAttr(args[0], getitem_attr, args[1]) < 0) {
        return NULL;
    }
    ((PyTypeObject *)args[0])->tp_as_mapping->mp_subscript = getitem_slot;
    Py_RETURN_NONE;
}

PyObject *
td_front_init(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (cls, FieldInit): Cls(...) runs the FieldInit from the type slot. */
    if (td_check_args("front_init", nargs, 2) < 0 || check_heap_type(args[0], "front_init") < 0) {
        return NULL;
    }
    if (!Py_IS_TYPE(args[1], &FieldInitType)) {
        PyErr_SetString(PyExc_TypeError, "front_init expects a FieldInit");
        return NULL;
    }
    if (PyObject_SetAttr(args[0], init_attr, args[1]) < 0) {
        return NULL;
    }
    ((PyTypeObject *)args[0])->tp_init = init_slot;
    Py_RETURN_NONE;
}

PyObject *
td_fronted(PyObject *Py_UNUSED(module), PyObject *cls)
{
    /* The names of the slots of `cls` the C helpers run from: a tuple of "__getitem__" / "__init__". */
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "fronted expects a class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    binaryfunc subscript = type->tp_as_mapping == NULL ? NULL : type->tp_as_mapping->mp_subscript;
    int getitem = subscript == getitem_slot || subscript == td_fast_getitem;
    int init = type->tp_init == init_slot;
    if (getitem && init) {
        return PyTuple_Pack(2, getitem_name, init_name);
    }
    if (getitem || init) {
        return PyTuple_Pack(1, getitem ? getitem_name : init_name);
    }
    return PyTuple_New(0);
}

int
td_add_tensorclass_types(PyObject *module)
{
    if (PyType_Ready(&FieldIndexerType) < 0 || PyType_Ready(&FieldInitType) < 0) {
        return -1;
    }
    if ((getitem_attr = PyUnicode_InternFromString("_torchdict_c_getitem")) == NULL
            || (init_attr = PyUnicode_InternFromString("_torchdict_c_init")) == NULL
            || (getitem_name = PyUnicode_InternFromString("__getitem__")) == NULL
            || (init_name = PyUnicode_InternFromString("__init__")) == NULL
            || (batch_size_name == NULL && (batch_size_name = PyUnicode_InternFromString("batch_size")) == NULL)) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "FieldIndexer", (PyObject *)&FieldIndexerType) < 0
            || PyModule_AddObjectRef(module, "FieldInit", (PyObject *)&FieldInitType) < 0) {
        return -1;
    }
    return 0;
}
