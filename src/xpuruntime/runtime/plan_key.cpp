// The dispatcher's plan-cache key in C: `arguments.python_plan_key` and `arrays.python_cuda_tensor_key`
// build the very same tuples in Python for ~1 us more per call with CUDA tensors (each tensor attribute
// read through PyTorch's Python bindings costs ~0.15 us). Argument kinds other than NumPy arrays, CUDA
// tensors and Python scalars go to the Python `signature`, exactly as the Python key does.
//
// This file also defines the Python module of xpuruntime's one C++ extension (runtime/extension.py); the
// PyTorch front end's aten routes (pytorch/native_routes.cpp) are compiled into the same library.

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstdint>

namespace {

// What the key needs from Python, set once by `use_python` (references kept for the process's life).
struct PythonSide {
  PyObject* ndarray = nullptr;          // numpy.ndarray
  PyObject* signature = nullptr;        // arrays.signature: every other argument kind
  PyObject* attr_types = nullptr;       // arguments.attr_types: attributes holding a tuple
  PyObject* python_plan_key = nullptr;  // calls whose inputs or attributes are not tuples
  PyObject* dtype = nullptr;            // interned attribute names
  PyObject* shape = nullptr;
  PyObject* strides = nullptr;
};
PythonSide py;

// A tuple of ints, or a torch.Size (a tuple subclass, allocated as PyTorch allocates it: its own
// constructor is not exported).
PyObject* int_tuple(c10::IntArrayRef values, bool size = false) {
  const auto n = static_cast<Py_ssize_t>(values.size());
  PyObject* tuple = size ? THPSizeType.tp_alloc(&THPSizeType, n) : PyTuple_New(n);
  for (size_t i = 0; tuple != nullptr && i < values.size(); ++i) {
    PyObject* value = PyLong_FromLongLong(values[i]);
    if (value == nullptr) Py_CLEAR(tuple);
    else PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), value);
  }
  return tuple;
}

// (dtype, shape, True or the strides, device index, 16-byte aligned?); may throw a c10::Error.
PyObject* tensor_key(const at::Tensor& t) {
  // everything that may throw first, while no Python object is held
  const bool aligned = (reinterpret_cast<std::uintptr_t>(t.data_ptr()) & 15) == 0;
  const bool contiguous = t.is_contiguous();
  const c10::IntArrayRef strides = t.strides();
  const c10::IntArrayRef sizes = t.sizes();
  const long device = t.get_device();
  PyObject* items[5] = {reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())), int_tuple(sizes, true),
                        contiguous ? Py_True : int_tuple(strides), PyLong_FromLong(device),
                        aligned ? Py_True : Py_False};
  Py_INCREF(items[0]);
  if (contiguous) Py_INCREF(Py_True);
  Py_INCREF(items[4]);
  PyObject* key = (items[1] && items[2] && items[3]) ? PyTuple_New(5) : nullptr;
  if (key == nullptr) {
    for (PyObject* item : items) Py_XDECREF(item);
    return nullptr;
  }
  for (int i = 0; i < 5; ++i) PyTuple_SET_ITEM(key, i, items[i]);  // the tuple takes the references
  return key;
}

PyObject* cuda_tensor_key(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  if (!THPVariable_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "cuda_tensor_key: expected a tensor, got %s", Py_TYPE(arg)->tp_name);
    return nullptr;
  }
  return tensor_key(THPVariable_Unpack(arg));
  END_HANDLE_TH_ERRORS
}

PyObject* array_key(PyObject* x) {
  PyObject* items[3] = {PyObject_GetAttr(x, py.dtype), PyObject_GetAttr(x, py.shape), PyObject_GetAttr(x, py.strides)};
  PyObject* key = (items[0] && items[1] && items[2]) ? PyTuple_New(3) : nullptr;
  if (key == nullptr) {
    for (PyObject* item : items) Py_XDECREF(item);
    return nullptr;
  }
  for (int i = 0; i < 3; ++i) PyTuple_SET_ITEM(key, i, items[i]);
  return key;
}

// One input's part of the key, as `python_plan_key` computes it; a C++ error becomes the Python exception
// here, so that the caller can release what it holds.
PyObject* input_key(PyObject* x) {
  HANDLE_TH_ERRORS
  PyTypeObject* type = Py_TYPE(x);
  if (reinterpret_cast<PyObject*>(type) == py.ndarray) return array_key(x);
  if (type == reinterpret_cast<PyTypeObject*>(THPVariableClass)) {  // exactly torch.Tensor
    const at::Tensor& t = THPVariable_Unpack(x);
    if (t.is_cuda()) return tensor_key(t);
  }
  if (type == &PyFloat_Type || type == &PyLong_Type || type == &PyBool_Type) {
    Py_INCREF(type);
    return reinterpret_cast<PyObject*>(type);
  }
  return PyObject_CallOneArg(py.signature, x);
  END_HANDLE_TH_ERRORS
}

PyObject* attribute_types(PyObject* attrs) {
  const Py_ssize_t n = PyTuple_GET_SIZE(attrs);
  PyObject* types = PyTuple_New(n);
  if (types == nullptr) return nullptr;
  bool nested = false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyTypeObject* type = Py_TYPE(PyTuple_GET_ITEM(attrs, i));
    nested = nested || type == &PyTuple_Type;
    Py_INCREF(type);
    PyTuple_SET_ITEM(types, i, reinterpret_cast<PyObject*>(type));
  }
  if (!nested) return types;
  Py_DECREF(types);
  return PyObject_CallOneArg(py.attr_types, attrs);
}

// plan_key(op, fingerprint, attrs, inputs, out) -> (op, fingerprint, attrs, attr types, *inputs' keys, out's key)
PyObject* plan_key(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "plan_key: expected (op, fingerprint, attrs, inputs, out)");
    return nullptr;
  }
  PyObject *attrs = args[2], *inputs = args[3], *out = args[4];
  if (!PyTuple_CheckExact(attrs) || !PyTuple_CheckExact(inputs)) return PyObject_Vectorcall(py.python_plan_key, args, 5, nullptr);
  const Py_ssize_t n = PyTuple_GET_SIZE(inputs);
  PyObject* key = PyTuple_New(n + 5);
  if (key == nullptr) return nullptr;
  for (int i = 0; i < 3; ++i) {
    Py_INCREF(args[i]);
    PyTuple_SET_ITEM(key, i, args[i]);
  }
  PyObject* part = attribute_types(attrs);
  for (Py_ssize_t i = 0; part != nullptr; ++i) {
    PyTuple_SET_ITEM(key, i + 3, part);
    if (i == n) break;
    part = input_key(PyTuple_GET_ITEM(inputs, i));
  }
  if (part != nullptr) {
    part = out == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(py.signature, out);
    if (part != nullptr) PyTuple_SET_ITEM(key, n + 4, part);
  }
  if (part == nullptr) {
    Py_DECREF(key);  // unset items are NULL, which the tuple's deallocation skips
    return nullptr;
  }
  return key;
  END_HANDLE_TH_ERRORS
}

PyObject* use_python(PyObject* /*module*/, PyObject* args) {
  PyObject *ndarray, *signature, *attr_types, *python_plan_key;
  if (!PyArg_ParseTuple(args, "OOOO", &ndarray, &signature, &attr_types, &python_plan_key)) return nullptr;
  for (PyObject* ref : {ndarray, signature, attr_types, python_plan_key}) Py_INCREF(ref);
  py.ndarray = ndarray;
  py.signature = signature;
  py.attr_types = attr_types;
  py.python_plan_key = python_plan_key;
  py.dtype = PyUnicode_InternFromString("dtype");
  py.shape = PyUnicode_InternFromString("shape");
  py.strides = PyUnicode_InternFromString("strides");
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"cuda_tensor_key", cuda_tensor_key, METH_O,
     "(dtype, shape, True or strides, device index, 16-byte aligned?) of a tensor"},
    {"plan_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(plan_key)), METH_FASTCALL,
     "the plan-cache key of a call, as arguments.python_plan_key builds it"},
    {"use_python", use_python, METH_VARARGS,
     "use_python(ndarray, signature, attr_types, python_plan_key): what the key needs from Python"},
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (PyMethodDef& def : methods) {
    m.attr(def.ml_name) = pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&def, nullptr));
  }
}
