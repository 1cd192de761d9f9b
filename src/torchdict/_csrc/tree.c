/* TensorDict's td["key"] / td["a", "b"] in C (install_getitem), and the walk of apply(fn)
 * over a plain tree of TensorDicts (collect_tree, zip_dict). See module.c for the whole. */
#include "speedups.h"

/* Set by install_getitem: TensorDict, the member descriptor of its _tensordict slot, the two
 * non-tensor wrapper classes and the Python fallback (the general __getitem__). */
static PyTypeObject *owner_type = NULL;
PyObject *td_storage_member = NULL;
static PyTypeObject *non_tensor_data = NULL;
static PyTypeObject *non_tensor_stack = NULL;
static PyObject *general_getitem = NULL;
static PyObject *data_name = NULL;

/* The entry of the TensorDict `node` at the exact str `key`, as a new reference; NULL
 * with no error set when the key is missing. */
static PyObject *
lookup(PyObject *node, PyObject *key)
{
    PyObject *storage = Py_TYPE(td_storage_member)->tp_descr_get(td_storage_member, node, (PyObject *)Py_TYPE(node));
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
 * A tensor or a TensorDict is returned as it is, a non-tensor wrapper (a NonTensorData subclass
 * too) as its .data.
 * Anything else (an int, a slice, a missing key, a str subclass, a TensorDict subclass on
 * the way) goes to the general Python __getitem__, which also words every error. */
PyObject *
td_fast_getitem(PyObject *self, PyObject *key)
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
        /* A subclass of NonTensorData (MetaData) reads as its .data too; a tensor or a nested
         * TensorDict is told apart first by one pointer comparison. */
        if (kind == non_tensor_data || kind == non_tensor_stack
                || (kind != td_plain_tensor && kind != owner_type && PyType_IsSubtype(kind, non_tensor_data))) {
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

PyObject *
td_install_getitem(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (owner class, its _tensordict member descriptor, NonTensorData, NonTensorStack, the
     * general __getitem__): td[index] on an owner instance runs td_fast_getitem from the
     * type's mp_subscript slot. The class keeps its Python __getitem__ (what Dynamo traces and
     * inspect shows); assigning __getitem__ on the class afterwards gives the slot back. */
    if (td_check_args("install_getitem", nargs, 5) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyType_Check(args[2]) || !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "install_getitem expects classes");
        return NULL;
    }
    PyTypeObject *owner = (PyTypeObject *)args[0];
    if (!(owner->tp_flags & Py_TPFLAGS_HEAPTYPE) || owner->tp_as_mapping == NULL) {
        PyErr_SetString(PyExc_TypeError, "install_getitem expects a class defined in Python");
        return NULL;
    }
    if (Py_TYPE(args[1])->tp_descr_get == NULL || !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "install_getitem expects a descriptor and a callable");
        return NULL;
    }
    if (data_name == NULL && (data_name = PyUnicode_InternFromString("data")) == NULL) {
        return NULL;
    }
    Py_XSETREF(owner_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(td_storage_member, Py_NewRef(args[1]));
    Py_XSETREF(non_tensor_data, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(non_tensor_stack, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(general_getitem, Py_NewRef(args[4]));
    owner->tp_as_mapping->mp_subscript = td_fast_getitem;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ apply(fn) on a plain tree
 * collect_tree: the first pass of _apply_tree.plain_tree_storage, whose Python twin is
 * _apply_tree.py_collect_tree. It walks a tree of TensorDicts of the root's exact class and
 * batch size whose entries are all plain torch.Tensors or such sub-TensorDicts, depth first,
 * and returns (leaves, levels): every tensor in the order the per-level path calls fn on
 * them, and one (td, keys, start, count, subs, ordered, path) tuple per level (see the twin).
 * Anything else in the tree gives None. */
static int
collect_level(PyObject *node, PyTypeObject *owner, PyObject *batch_member, PyObject *batch_size,
              PyObject *path, PyObject *leaves, PyObject *levels)
{
    /* 1 when collected, 0 when the tree is not plain, -1 on an error. */
    if (Py_EnterRecursiveCall(" while collecting the leaves of a TensorDict")) {
        return -1;
    }
    int status = -1;
    PyObject *storage = Py_TYPE(td_storage_member)->tp_descr_get(td_storage_member, node, (PyObject *)Py_TYPE(node));
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
        if (Py_TYPE(value) == td_plain_tensor) {
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
            if (Py_TYPE(value) == td_plain_tensor && PyList_Append(keys, key) < 0) {
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

PyObject *
td_collect_tree(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (root TensorDict, its batch size, the _batch_size member descriptor) */
    if (td_check_args("collect_tree", nargs, 3) < 0 || td_check_ready() < 0) {
        return NULL;
    }
    if (td_storage_member == NULL || td_plain_tensor == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "collect_tree needs install_getitem() first");
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
        status = collect_level(args[0], Py_TYPE(args[0]), args[2], args[1], td_empty_tuple, leaves, levels);
    }
    PyObject *result = status > 0 ? PyTuple_Pack(2, leaves, levels) : NULL;
    Py_XDECREF(leaves);
    Py_XDECREF(levels);
    if (status == 0) {
        Py_RETURN_NONE;
    }
    return result;
}

PyObject *
td_zip_dict(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* zip_dict(keys, values, start, count): {keys[i]: values[start + i]} for the first count
     * keys of keys (a dict or a list); values a list. dict(zip(keys, values[start:start + count]))
     * without the pairs. */
    Py_ssize_t start, count;
    if (td_check_args("zip_dict", nargs, 4) < 0) {
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
