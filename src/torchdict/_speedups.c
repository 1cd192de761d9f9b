/* Optional C helpers for the hottest paths of torchdict.
 *
 * torchdict works without this module: every helper here has a pure-Python twin with
 * the same results and error types, used when the extension was not built or when
 * TORCHDICT_PURE_PYTHON=1 (_accel.py picks one or the other; tests/test_speedups.py holds
 * each pair to the same answers). What C buys is the Python call overhead: asking torch
 * for a tensor's first size from Python costs a call and an argument tuple per tensor, and
 * a Python-level __getitem__ costs about as much as the dict lookup it wraps.
 *
 *   tensor_len(t)               the first size of a tensor (0 for a 0-dim one)
 *   leaves_fit(source, n)       every key of a dict a str, every value a tensor of first size n
 *   lengths_fit(values, n)      every item of a list or tuple a tensor of first size n
 *   make_getitem(...)           TensorDict's td["key"] / td["a", "b"]     (twin: its Python __getitem__)
 *   collect_tree(td, ...)       the leaves and levels of a plain tree      (_apply_tree.py_collect_tree)
 *   zip_dict(keys, values, ..)  dict(zip(keys, values[start:start + n])) (_accel.py_zip_dict)
 *   make_field_indexer(...)     a tensorclass's data[i] / data[a:b]        (_tensorclass_indexing, generated)
 *   make_field_init(...)        a tensorclass's Cls(*tensors, batch_size=[n]) (_tensorclass_fields.make_init)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

/* torch._C.TensorBase, whose mapping length slot is torch's own C length; set by setup(). */
static PyTypeObject *tensor_base = NULL;
static lenfunc tensor_length = NULL;
static PyObject *empty_tuple = NULL;

/* For the C __getitem__: TensorDict, the member descriptor of TensorDict._tensordict,
 * the two non-tensor wrapper classes and the Python fallback (the general __getitem__). */
static PyTypeObject *owner_type = NULL;
static PyObject *storage_member = NULL;
static PyTypeObject *non_tensor_data = NULL;
static PyTypeObject *non_tensor_stack = NULL;
static PyObject *general_getitem = NULL;
static PyObject *data_name = NULL;

static int
check_args(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s expected %zd arguments, got %zd", name, expected, nargs);
        return -1;
    }
    return 0;
}

static int
check_ready(void)
{
    if (tensor_length == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "torchdict._speedups.setup() was not called");
        return -1;
    }
    return 0;
}

/* The first size of `value`, -2 when `value` is not a tensor (no error set), -1 on an
 * error raised by torch (a __torch_function__ override, say). */
static Py_ssize_t
first_size(PyObject *value)
{
    if (!PyObject_TypeCheck(value, tensor_base)) {
        return -2;
    }
    /* torch may run Python code here (a subclass's __torch_function__): keep `value`
     * alive even if that code drops the container's reference to it. */
    Py_INCREF(value);
    Py_ssize_t size = tensor_length(value);
    Py_DECREF(value);
    return size;
}

static PyObject *
tensor_len(PyObject *Py_UNUSED(module), PyObject *value)
{
    if (check_ready() < 0) {
        return NULL;
    }
    Py_ssize_t size = first_size(value);
    if (size == -2) {
        PyErr_Format(PyExc_TypeError, "expected a torch.Tensor, got %.200s", Py_TYPE(value)->tp_name);
        return NULL;
    }
    if (size < 0) {
        return NULL;
    }
    return PyLong_FromSsize_t(size);
}

static int
parse_size(PyObject *arg, Py_ssize_t *out)
{
    /* An int too large for any size reads as -1: no tensor fits (TypeError for a non-int). */
    *out = PyLong_AsSsize_t(arg);
    if (*out == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return -1;
        }
        PyErr_Clear();
    }
    return 0;
}

/* 1 when size fits, 0 when not (or not a tensor), -1 on an error other than TypeError. A
 * TypeError from torch (the C length of a tensor subclass that refuses it) reads as "does
 * not fit", as the Python twin's `except TypeError` does. */
static int
fits(PyObject *value, Py_ssize_t first)
{
    Py_ssize_t size = first_size(value);
    if (size == -1) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    return size == first;
}

static PyObject *
leaves_fit(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t first, pos = 0;
    PyObject *key, *value;
    if (check_args("leaves_fit", nargs, 2) < 0 || check_ready() < 0) {
        return NULL;
    }
    if (!PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "leaves_fit expects a dict");
        return NULL;
    }
    if (parse_size(args[1], &first) < 0) {
        return NULL;
    }
    PyObject *source = args[0];
    if (first <= 0 || PyDict_GET_SIZE(source) == 0) {
        Py_RETURN_FALSE;
    }
    /* Keys first (no Python code runs), then values: torch may run Python code, and
     * PyDict_Next stays memory-safe if that code changes the dict. */
    while (PyDict_Next(source, &pos, &key, &value)) {
        if (!PyUnicode_Check(key)) {
            Py_RETURN_FALSE;
        }
    }
    pos = 0;
    while (PyDict_Next(source, &pos, &key, &value)) {
        int ok = fits(value, first);
        if (ok <= 0) {
            return ok < 0 ? NULL : Py_NewRef(Py_False);
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *
lengths_fit(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t first;
    if (check_args("lengths_fit", nargs, 2) < 0 || check_ready() < 0) {
        return NULL;
    }
    PyObject *values = args[0];
    if (!PyList_Check(values) && !PyTuple_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "lengths_fit expects a list or a tuple");
        return NULL;
    }
    if (parse_size(args[1], &first) < 0) {
        return NULL;
    }
    if (first <= 0 || PySequence_Fast_GET_SIZE(values) == 0) {
        Py_RETURN_FALSE;
    }
    /* The size and item are read afresh at each step: Python code run by torch may
     * change a list while we walk it. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(values); i++) {
        int ok = fits(PySequence_Fast_GET_ITEM(values, i), first);
        if (ok <= 0) {
            return ok < 0 ? NULL : Py_NewRef(Py_False);
        }
    }
    Py_RETURN_TRUE;
}

/* The entry of the TensorDict `node` at the exact str `key`, as a new reference; NULL
 * with no error set when the key is missing. */
static PyObject *
lookup(PyObject *node, PyObject *key)
{
    PyObject *storage = Py_TYPE(storage_member)->tp_descr_get(storage_member, node, (PyObject *)Py_TYPE(node));
    if (storage == NULL) {
        return NULL;
    }
    PyObject *value = NULL;
    if (PyDict_CheckExact(storage)) {
        value = Py_XNewRef(PyDict_GetItemWithError(storage, key));
    }
    Py_DECREF(storage);
    return value;
}

/* TensorDict.__getitem__ for its hottest calls: td["key"] (an exact str found in the
 * storage dict) and td["a", "b"] (a tuple of exact str walking through plain TensorDicts).
 * A tensor or a TensorDict is returned as it is, a non-tensor wrapper as its .data.
 * Anything else (an int, a slice, a missing key, a str subclass, a TensorDict subclass on
 * the way) goes to the general Python __getitem__, which also words every error. */
static PyObject *
fast_getitem(PyObject *self, PyObject *key)
{
    PyObject *value = NULL;
    if (PyUnicode_CheckExact(key)) {
        value = lookup(self, key);
    }
    else if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) > 0 && Py_TYPE(self) == owner_type) {
        value = Py_NewRef(self);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(key); i++) {
            PyObject *part = PyTuple_GET_ITEM(key, i);
            if (!PyUnicode_CheckExact(part) || Py_TYPE(value) != owner_type) {
                Py_CLEAR(value);
                break;
            }
            Py_SETREF(value, lookup(value, part));
            if (value == NULL) {
                break;
            }
        }
    }
    if (value != NULL) {
        PyTypeObject *kind = Py_TYPE(value);
        if (kind == non_tensor_data || kind == non_tensor_stack) {
            Py_SETREF(value, PyObject_GetAttr(value, data_name));
        }
        return value;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *args[2] = {self, key};
    return PyObject_Vectorcall(general_getitem, args, 2, NULL);
}

static PyMethodDef getitem_def = {
    "__getitem__", (PyCFunction)fast_getitem, METH_O,
    "td[index]: an entry for a key (str or tuple of str), a new TensorDict for a batch index."
};

static PyObject *
make_getitem(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (owner class, its _tensordict member descriptor, NonTensorData, NonTensorStack,
     *  the general __getitem__) -> a method descriptor of the owner class. */
    if (check_args("make_getitem", nargs, 5) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_Check(args[2]) || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "make_getitem expects classes");
        return NULL;
    }
    if (Py_TYPE(args[1])->tp_descr_get == NULL || !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "make_getitem expects a descriptor and a callable");
        return NULL;
    }
    if (data_name == NULL && (data_name = PyUnicode_InternFromString("data")) == NULL) {
        return NULL;
    }
    Py_XSETREF(owner_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(storage_member, Py_NewRef(args[1]));
    Py_XSETREF(non_tensor_data, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(non_tensor_stack, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(general_getitem, Py_NewRef(args[4]));
    return PyDescr_NewMethod((PyTypeObject *)args[0], &getitem_def);
}

/* ------------------------------------------------------------------ apply(fn) on a plain tree
 * collect_tree: the first pass of _apply_tree.plain_tree_storage, whose Python twin is
 * _apply_tree.py_collect_tree. It walks a tree of TensorDicts of the root's exact class and
 * batch size whose entries are all plain torch.Tensors or such sub-TensorDicts, depth first,
 * and returns (leaves, levels): every tensor in the order the per-level path calls fn on
 * them, and one (td, keys, start, count, subs, ordered, path) tuple per level (see the twin).
 * Anything else in the tree gives None. */
static PyTypeObject *plain_tensor_type = NULL;  /* torch.Tensor, set by setup() */

static int
collect_level(PyObject *node, PyTypeObject *owner, PyObject *batch_member, PyObject *batch_size,
              PyObject *path, PyObject *leaves, PyObject *levels)
{
    /* 1 when collected, 0 when the tree is not plain, -1 on an error. */
    if (Py_EnterRecursiveCall(" while collecting the leaves of a TensorDict")) {
        return -1;
    }
    int status = -1;
    PyObject *storage = Py_TYPE(storage_member)->tp_descr_get(storage_member, node, (PyObject *)Py_TYPE(node));
    PyObject *subs = NULL, *keys = NULL, *level = NULL;
    if (storage == NULL) {
        goto done;
    }
    if (!PyDict_CheckExact(storage)) {
        status = 0;
        goto done;
    }
    Py_ssize_t start = PyList_GET_SIZE(leaves), count = 0, pos = 0;
    int ordered = 1;
    PyObject *key, *value;
    if ((subs = PyList_New(0)) == NULL) {
        goto done;
    }
    while (PyDict_Next(storage, &pos, &key, &value)) {
        if (Py_TYPE(value) == plain_tensor_type) {
            if (PyList_Append(leaves, value) < 0) {
                goto done;
            }
            count++;
            ordered &= PyList_GET_SIZE(subs) == 0;
        }
        else if (Py_TYPE(value) == owner) {
            PyObject *pair = PyTuple_Pack(2, key, value);
            if (pair == NULL || PyList_Append(subs, pair) < 0) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
        }
        else {
            status = 0;  /* a non-tensor, a tensor subclass, another collection */
            goto done;
        }
    }
    if (ordered) {
        keys = Py_NewRef(storage);  /* the tensors' keys come first: zip stops after them */
    }
    else {
        if ((keys = PyList_New(0)) == NULL) {
            goto done;
        }
        pos = 0;
        while (PyDict_Next(storage, &pos, &key, &value)) {
            if (Py_TYPE(value) == plain_tensor_type && PyList_Append(keys, key) < 0) {
                goto done;
            }
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(subs); i++) {
        PyObject *sub = PyTuple_GET_ITEM(PyList_GET_ITEM(subs, i), 1);
        PyObject *sub_batch = Py_TYPE(batch_member)->tp_descr_get(batch_member, sub, (PyObject *)Py_TYPE(sub));
        if (sub_batch == NULL) {
            goto done;
        }
        int same = PyObject_RichCompareBool(sub_batch, batch_size, Py_EQ);
        Py_DECREF(sub_batch);
        if (same <= 0) {
            status = same;  /* a longer batch: the per-level path handles it */
            goto done;
        }
    }
    level = Py_BuildValue("(OOnnOOO)", node, keys, start, count, subs, ordered ? Py_True : Py_False, path);
    if (level == NULL || PyList_Append(levels, level) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(subs); i++) {
        PyObject *pair = PyList_GET_ITEM(subs, i);
        PyObject *key_tuple = PyTuple_Pack(1, PyTuple_GET_ITEM(pair, 0));
        PyObject *sub_path = key_tuple == NULL ? NULL : PySequence_Concat(path, key_tuple);
        Py_XDECREF(key_tuple);
        if (sub_path == NULL) {
            goto done;
        }
        int inner = collect_level(PyTuple_GET_ITEM(pair, 1), owner, batch_member, batch_size, sub_path, leaves, levels);
        Py_DECREF(sub_path);
        if (inner <= 0) {
            status = inner;
            goto done;
        }
    }
    status = 1;
done:
    Py_XDECREF(level);
    Py_XDECREF(keys);
    Py_XDECREF(subs);
    Py_XDECREF(storage);
    Py_LeaveRecursiveCall();
    return status;
}

static PyObject *
collect_tree(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (root TensorDict, its batch size, the _batch_size member descriptor) */
    if (check_args("collect_tree", nargs, 3) < 0 || check_ready() < 0) {
        return NULL;
    }
    if (storage_member == NULL || plain_tensor_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "collect_tree needs make_getitem() first");
        return NULL;
    }
    PyTypeObject *batch_type = Py_TYPE(args[2]);
    if (batch_type->tp_descr_get == NULL) {
        PyErr_SetString(PyExc_TypeError, "collect_tree expects the _batch_size descriptor");
        return NULL;
    }
    PyObject *leaves = PyList_New(0), *levels = PyList_New(0);
    int status = -1;
    if (leaves != NULL && levels != NULL) {
        status = collect_level(args[0], Py_TYPE(args[0]), args[2], args[1], empty_tuple, leaves, levels);
    }
    PyObject *result = status > 0 ? PyTuple_Pack(2, leaves, levels) : NULL;
    Py_XDECREF(leaves);
    Py_XDECREF(levels);
    if (status == 0) {
        Py_RETURN_NONE;
    }
    return result;
}

static PyObject *
zip_dict(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* zip_dict(keys, values, start, count): {keys[i]: values[start + i]} for the first count
     * keys of keys (a dict or a list); values a list. dict(zip(keys, values[start:start + count]))
     * without the pairs. */
    Py_ssize_t start, count;
    if (check_args("zip_dict", nargs, 4) < 0) {
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    if (!(PyDict_CheckExact(keys) || PyList_CheckExact(keys)) || !PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "zip_dict expects a dict or list of keys and a list of values");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[2]);
    count = start == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (start < 0 || count < 0 || start + count > PyList_GET_SIZE(values)) {
        PyErr_SetString(PyExc_ValueError, "zip_dict: start and count out of range");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t i = 0, pos = 0;
    PyObject *key, *ignored;
    while (i < count) {
        if (PyDict_CheckExact(keys)) {
            if (!PyDict_Next(keys, &pos, &key, &ignored)) {
                break;
            }
        }
        else {
            if (i >= PyList_GET_SIZE(keys)) {
                break;
            }
            key = PyList_GET_ITEM(keys, i);
        }
        if (PyDict_SetItem(out, key, PyList_GET_ITEM(values, start + i)) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        i++;
    }
    return out;
}

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
        Py_ssize_t rows = tensor_length(first);
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
    PyObject *result = PyBaseObject_Type.tp_new(Py_TYPE(self), empty_tuple, NULL);
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
indexer_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
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
    .tp_descr_get = indexer_get,
    .tp_traverse = (traverseproc)indexer_traverse,
    .tp_clear = (inquiry)indexer_clear,
    .tp_dealloc = (destructor)indexer_dealloc,
};

static int
check_names(PyObject *names)
{
    if (!PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) == 0 || PyTuple_GET_SIZE(names) > MAX_FAST_FIELDS) {
        PyErr_Format(PyExc_TypeError, "expected a tuple of 1 to %d field names", MAX_FAST_FIELDS);
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

static PyObject *
make_field_indexer(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (field names, the state member descriptor, the general __getitem__, the batch size
     *  of an int-indexed result, torch.Tensor) -> a FieldIndexer */
    if (check_args("make_field_indexer", nargs, 5) < 0 || check_ready() < 0) {
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
        int ok = fits(args[i], (Py_ssize_t)first);
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
    .tp_descr_get = indexer_get,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_traverse = (traverseproc)init_traverse,
    .tp_clear = (inquiry)init_clear,
    .tp_dealloc = (destructor)init_dealloc,
};

static PyObject *
make_field_init(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (field names, the state member descriptor, the Python __init__) -> a FieldInit */
    if (check_args("make_field_init", nargs, 3) < 0 || check_ready() < 0) {
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

static PyObject *
setup(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (torch._C.TensorBase, torch.Tensor) */
    if (check_args("setup", nargs, 2) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup expects torch._C.TensorBase and torch.Tensor");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    if (type->tp_as_mapping == NULL || type->tp_as_mapping->mp_length == NULL) {
        PyErr_SetString(PyExc_TypeError, "this class has no C length");
        return NULL;
    }
    Py_XSETREF(tensor_base, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(plain_tensor_type, (PyTypeObject *)Py_NewRef(args[1]));
    tensor_length = type->tp_as_mapping->mp_length;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(torch._C.TensorBase, torch.Tensor): read torch's C length slot."},
    {"collect_tree", (PyCFunction)(void (*)(void))collect_tree, METH_FASTCALL,
     "collect_tree(td, batch_size, batch_member): (leaves, levels) of a plain tree, or None."},
    {"zip_dict", (PyCFunction)(void (*)(void))zip_dict, METH_FASTCALL,
     "zip_dict(keys, values, start, count): dict(zip(keys, values[start:start + count]))."},
    {"tensor_len", (PyCFunction)tensor_len, METH_O, "The first size of a tensor (0 for a 0-dim one)."},
    {"leaves_fit", (PyCFunction)(void (*)(void))leaves_fit, METH_FASTCALL,
     "leaves_fit(source, n): every key a str, every value a tensor of first size n."},
    {"lengths_fit", (PyCFunction)(void (*)(void))lengths_fit, METH_FASTCALL,
     "lengths_fit(values, n): every item of a list or tuple a tensor of first size n."},
    {"make_field_indexer", (PyCFunction)(void (*)(void))make_field_indexer, METH_FASTCALL,
     "make_field_indexer(names, state, general, no_batch, Tensor): a tensorclass's data[i] in C."},
    {"make_field_init", (PyCFunction)(void (*)(void))make_field_init, METH_FASTCALL,
     "make_field_init(names, state, general): a tensorclass's Cls(*tensors, batch_size=[n]) in C."},
    {"make_getitem", (PyCFunction)(void (*)(void))make_getitem, METH_FASTCALL,
     "make_getitem(cls, member, NonTensorData, NonTensorStack, general): a C __getitem__."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "torchdict._speedups", "Optional C helpers for torchdict's hottest checks.",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&FieldIndexerType) < 0 || PyType_Ready(&FieldInitType) < 0) {
        return NULL;
    }
    if (empty_tuple == NULL && (empty_tuple = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "FieldIndexer", (PyObject *)&FieldIndexerType) < 0
            || PyModule_AddObjectRef(module, "FieldInit", (PyObject *)&FieldInitType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
