/* torchdict._speedups: optional C helpers for the hottest paths of torchdict.
 *
 * torchdict works without this module: every helper here has a pure-Python twin with
 * the same results and error types, used when the extension was not built or when
 * TORCHDICT_PURE_PYTHON=1 (_accel.py picks one or the other; tests/test_speedups.py holds
 * each pair to the same answers). What C buys is the Python call overhead: asking torch
 * for a tensor's first size from Python costs a call and an argument tuple per tensor, and
 * a Python-level __getitem__ costs about as much as the dict lookup it wraps.
 *
 *   module.c       setup(), and the batch checks (twins in _accel.py):
 *                    tensor_len(t)            the first size of a tensor (0 for a 0-dim one)
 *                    leaves_fit(source, n)    every key of a dict a str, every value a tensor of first size n
 *                    lengths_fit(values, n)   every item of a list or tuple a tensor of first size n
 *                    shape_fits(t, batch)     t a tensor whose shape starts with batch (any number of dims)
 *                    leaves_fit_batch(source, batch)  leaves_fit for a batch of any number of dims
 *                  set_unbatched(cls): the tensor class none of those checks fits (UnbatchedTensor)
 *                  descriptor_setter(descr): descr.__set__ as a builtin function (for torch.compile)
 *   tree.c         install_getitem: TensorDict's td["key"] / td["a", "b"] (twin: its Python __getitem__);
 *                  collect_tree, zip_dict: apply(fn) on a plain tree (_apply_tree.py_collect_tree,
 *                  _accel.py_zip_dict)
 *   tensorclass.c  make_field_indexer: data[i] / data[a:b] (twin: tensorclass._indexing's generated
 *                  code); make_field_init: Cls(*tensors, batch_size=[n]) (tensorclass._fields.make_init);
 *                  front_getitem / front_init / fronted: those two run from the class's type slots
 *
 * The C methods run from type slots (mp_subscript, tp_init) while the class __dict__ keeps the
 * Python functions: torch.compile's Dynamo reads the class __dict__ and traces Python, never C.
 */
#include "speedups.h"

PyTypeObject *td_tensor_base = NULL;
lenfunc td_tensor_length = NULL;
PyTypeObject *td_plain_tensor = NULL;
PyObject *td_empty_tuple = NULL;
static PyObject *str_shape = NULL;  /* "shape", interned */

int
td_check_args(const char *name, Py_ssize_t nargs, Py_ssize_t expected)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s expected %zd arguments, got %zd", name, expected, nargs);
        return -1;
    }
    return 0;
}

int
td_check_ready(void)
{
    if (td_tensor_length == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "torchdict._speedups.setup() was not called");
        return -1;
    }
    return 0;
}

/* The first size of `value`, -2 when `value` is not a tensor (no error set), -1 on an
 * error raised by torch (a __torch_function__ override, say). */
Py_ssize_t
td_first_size(PyObject *value)
{
    if (!PyObject_TypeCheck(value, td_tensor_base)) {
        return -2;
    }
    /* torch may run Python code here (a subclass's __torch_function__): keep `value`
     * alive even if that code drops the container's reference to it. */
    Py_INCREF(value);
    Py_ssize_t size = td_tensor_length(value);
    Py_DECREF(value);
    return size;
}

PyObject *
td_tensor_len(PyObject *Py_UNUSED(module), PyObject *value)
{
    if (td_check_ready() < 0) {
        return NULL;
    }
    Py_ssize_t size = td_first_size(value);
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

/* Set by set_unbatched(): UnbatchedTensor (or NULL), a tensor with no batch dims. No batch check
 * "fits" one, so a write of it goes to the Python path, which gives it the batch size it is
 * stored under. A plain torch.Tensor is told apart by one pointer comparison. */
static PyTypeObject *unbatched_type = NULL;

static int
is_unbatched(PyObject *value)
{
    PyTypeObject *kind = Py_TYPE(value);
    return kind != td_plain_tensor && unbatched_type != NULL && PyType_IsSubtype(kind, unbatched_type);
}

/* 1 when size fits, 0 when not (or not a tensor, or an UnbatchedTensor), -1 on an error other
 * than TypeError. A TypeError from torch (the C length of a tensor subclass that refuses it)
 * reads as "does not fit", as the Python twin's `except TypeError` does. */
int
td_fits(PyObject *value, Py_ssize_t first)
{
    if (is_unbatched(value)) {
        return 0;
    }
    Py_ssize_t size = td_first_size(value);
    if (size == -1) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    return size == first;
}

PyObject *
td_leaves_fit(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t first, pos = 0;
    PyObject *key, *value;
    if (td_check_args("leaves_fit", nargs, 2) < 0 || td_check_ready() < 0) {
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
        int ok = td_fits(value, first);
        if (ok <= 0) {
            return ok < 0 ? NULL : Py_NewRef(Py_False);
        }
    }
    Py_RETURN_TRUE;
}

PyObject *
td_lengths_fit(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t first;
    if (td_check_args("lengths_fit", nargs, 2) < 0 || td_check_ready() < 0) {
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
        int ok = td_fits(PySequence_Fast_GET_ITEM(values, i), first);
        if (ok <= 0) {
            return ok < 0 ? NULL : Py_NewRef(Py_False);
        }
    }
    Py_RETURN_TRUE;
}

/* 1 when `value` is a tensor whose shape starts with `batch` (a tuple of ints: a torch.Size), 0
 * when not (or not a tensor), -1 on an error. The first size comes from torch's C length (no
 * Python object); only a batch of two or more dims reads `shape`. */
static int
td_shape_fits(PyObject *value, PyObject *batch)
{
    if (is_unbatched(value)) {
        return 0;
    }
    Py_ssize_t n_batch = PyTuple_GET_SIZE(batch);
    Py_ssize_t first = td_first_size(value);
    if (first == -2) {
        return 0;
    }
    if (first == -1) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    if (n_batch == 0) {
        return 1;
    }
    Py_ssize_t wanted = PyLong_AsSsize_t(PyTuple_GET_ITEM(batch, 0));
    if (wanted == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (first != wanted) {
        return 0;
    }
    /* A 0-dim tensor's C length is 0: a batch starting with 0 needs the shape too. */
    if (n_batch == 1 && first > 0) {
        return 1;
    }
    Py_INCREF(value);  /* torch may run Python code (a subclass's __torch_function__) */
    PyObject *shape = PyObject_GetAttr(value, str_shape);
    Py_DECREF(value);
    if (shape == NULL) {
        return -1;
    }
    int result = 0;
    if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) >= n_batch) {
        result = 1;
        for (Py_ssize_t i = 1; i < n_batch && result == 1; i++) {
            result = PyObject_RichCompareBool(PyTuple_GET_ITEM(shape, i), PyTuple_GET_ITEM(batch, i), Py_EQ);
        }
    }
    Py_DECREF(shape);
    return result;
}

static int
check_batch(const char *name, PyObject *batch)
{
    if (!PyTuple_Check(batch)) {
        PyErr_Format(PyExc_TypeError, "%s expects the batch size as a torch.Size or a tuple", name);
        return -1;
    }
    return 0;
}

static PyObject *
td_shape_fits_py(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (td_check_args("shape_fits", nargs, 2) < 0 || td_check_ready() < 0 || check_batch("shape_fits", args[1]) < 0) {
        return NULL;
    }
    int ok = td_shape_fits(args[0], args[1]);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyObject *
td_leaves_fit_batch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    if (td_check_args("leaves_fit_batch", nargs, 2) < 0 || td_check_ready() < 0
            || check_batch("leaves_fit_batch", args[1]) < 0) {
        return NULL;
    }
    if (!PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "leaves_fit_batch expects a dict");
        return NULL;
    }
    PyObject *source = args[0];
    if (PyDict_GET_SIZE(source) == 0) {
        Py_RETURN_FALSE;
    }
    while (PyDict_Next(source, &pos, &key, &value)) {  /* keys first: no Python code runs */
        if (!PyUnicode_Check(key)) {
            Py_RETURN_FALSE;
        }
    }
    pos = 0;
    while (PyDict_Next(source, &pos, &key, &value)) {
        int ok = td_shape_fits(value, args[1]);
        if (ok <= 0) {
            return ok < 0 ? NULL : Py_NewRef(Py_False);
        }
    }
    Py_RETURN_TRUE;
}

/* descriptor_setter(descr): a builtin function (instance, value) -> None running descr.__set__
 * (descr bound as its self). What a method-wrapper like descr.__set__ does, as fast, but as a
 * builtin function: torch.compile can be given a traceable twin for a function, not for a
 * method-wrapper (see _compile.py). */
static PyObject *
descriptor_set(PyObject *descr, PyObject *const *args, Py_ssize_t nargs)
{
    if (td_check_args("descriptor setter", nargs, 2) < 0) {
        return NULL;
    }
    if (Py_TYPE(descr)->tp_descr_set(descr, args[0], args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef descriptor_set_def = {
    "descriptor_set", (PyCFunction)(void (*)(void))descriptor_set, METH_FASTCALL,
    "descriptor_set(instance, value): the bound descriptor's __set__."
};

static PyObject *
descriptor_setter(PyObject *Py_UNUSED(module), PyObject *descr)
{
    if (Py_TYPE(descr)->tp_descr_set == NULL) {
        PyErr_SetString(PyExc_TypeError, "descriptor_setter expects a data descriptor");
        return NULL;
    }
    return PyCFunction_NewEx(&descriptor_set_def, descr, NULL);
}

static PyObject *
set_unbatched(PyObject *Py_UNUSED(module), PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "set_unbatched expects a class");
        return NULL;
    }
    Py_XSETREF(unbatched_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyObject *
setup(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    /* (torch._C.TensorBase, torch.Tensor) */
    if (td_check_args("setup", nargs, 2) < 0) {
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
    Py_XSETREF(td_tensor_base, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(td_plain_tensor, (PyTypeObject *)Py_NewRef(args[1]));
    td_tensor_length = type->tp_as_mapping->mp_length;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(torch._C.TensorBase, torch.Tensor): read torch's C length slot."},
    {"set_unbatched", (PyCFunction)set_unbatched, METH_O,
     "set_unbatched(cls): the class of the tensors no batch check fits (UnbatchedTensor)."},
    {"collect_tree", (PyCFunction)(void (*)(void))td_collect_tree, METH_FASTCALL,
     "collect_tree(td, batch_size, batch_member): (leaves, levels) of a plain tree, or None."},
    {"zip_dict", (PyCFunction)(void (*)(void))td_zip_dict, METH_FASTCALL,
     "zip_dict(keys, values, start, count): dict(zip(keys, values[start:start + count]))."},
    {"tensor_len", (PyCFunction)td_tensor_len, METH_O, "The first size of a tensor (0 for a 0-dim one)."},
    {"descriptor_setter", (PyCFunction)descriptor_setter, METH_O,
     "descriptor_setter(descr): a builtin function (instance, value) running descr.__set__."},
    {"leaves_fit", (PyCFunction)(void (*)(void))td_leaves_fit, METH_FASTCALL,
     "leaves_fit(source, n): every key a str, every value a tensor of first size n."},
    {"lengths_fit", (PyCFunction)(void (*)(void))td_lengths_fit, METH_FASTCALL,
     "lengths_fit(values, n): every item of a list or tuple a tensor of first size n."},
    {"shape_fits", (PyCFunction)(void (*)(void))td_shape_fits_py, METH_FASTCALL,
     "shape_fits(t, batch): t is a tensor whose shape starts with batch."},
    {"leaves_fit_batch", (PyCFunction)(void (*)(void))td_leaves_fit_batch, METH_FASTCALL,
     "leaves_fit_batch(source, batch): every key a str, every value a tensor whose shape starts with batch."},
    {"make_field_indexer", (PyCFunction)(void (*)(void))td_make_field_indexer, METH_FASTCALL,
     "make_field_indexer(names, state, general, no_batch, Tensor): a tensorclass's data[i] in C."},
    {"make_field_init", (PyCFunction)(void (*)(void))td_make_field_init, METH_FASTCALL,
     "make_field_init(names, state, general): a tensorclass's Cls(*tensors, batch_size=[n]) in C."},
    {"install_getitem", (PyCFunction)(void (*)(void))td_install_getitem, METH_FASTCALL,
     "install_getitem(cls, member, NonTensorData, NonTensorStack, general): td[key] in C, from the type slot."},
    {"front_getitem", (PyCFunction)(void (*)(void))td_front_getitem, METH_FASTCALL,
     "front_getitem(cls, indexer): data[i] of a tensorclass runs its FieldIndexer from the type slot."},
    {"front_init", (PyCFunction)(void (*)(void))td_front_init, METH_FASTCALL,
     "front_init(cls, init): Cls(...) of a tensorclass runs its FieldInit from the type slot."},
    {"fronted", (PyCFunction)td_fronted, METH_O,
     "fronted(cls): the names of the slots of cls that run C helpers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "torchdict._speedups", "Optional C helpers for torchdict's hottest checks.",
    -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (td_empty_tuple == NULL && (td_empty_tuple = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    if (str_shape == NULL && (str_shape = PyUnicode_InternFromString("shape")) == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL) {
        return NULL;
    }
    if (td_add_tensorclass_types(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
