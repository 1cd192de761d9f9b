/* Declarations shared by the C files of torchdict._speedups (see module.c). */
#ifndef TORCHDICT_SPEEDUPS_H
#define TORCHDICT_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

/* Set by setup() in module.c. */
extern PyTypeObject *td_tensor_base;   /* torch._C.TensorBase: its mapping length slot is torch's C length */
extern lenfunc td_tensor_length;       /* that slot */
extern PyTypeObject *td_plain_tensor;  /* torch.Tensor */
extern PyObject *td_empty_tuple;

/* Set by install_getitem() in tree.c: the member descriptor of TensorDict._tensordict. */
extern PyObject *td_storage_member;

/* module.c: argument checks and the first size of a tensor */
int td_check_args(const char *name, Py_ssize_t nargs, Py_ssize_t expected);
int td_check_ready(void);
Py_ssize_t td_first_size(PyObject *value);
int td_fits(PyObject *value, Py_ssize_t first);
PyObject *td_tensor_len(PyObject *module, PyObject *value);
PyObject *td_leaves_fit(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_lengths_fit(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* tree.c: TensorDict's td["key"], and the walk of apply(fn) over a plain tree */
PyObject *td_install_getitem(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_fast_getitem(PyObject *self, PyObject *key);
PyObject *td_collect_tree(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_zip_dict(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* tensorclass.c: a tensorclass's data[i] and Cls(*tensors, batch_size=[n]) */
PyObject *td_make_field_indexer(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_make_field_init(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_front_getitem(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_front_init(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *td_fronted(PyObject *module, PyObject *cls);
int td_add_tensorclass_types(PyObject *module);

#endif
