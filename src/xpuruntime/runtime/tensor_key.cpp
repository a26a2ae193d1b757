// The dispatcher's plan-cache key of a CUDA tensor, in C: the same tuple `arrays.python_cuda_tensor_key`
// builds, (dtype, shape, True or the strides, device index, 16-byte aligned?), for a fifth of the host time
// (five attribute calls through PyTorch's Python bindings cost ~0.7 us per tensor).
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

PyObject* cuda_tensor_key(PyObject* /*module*/, PyObject* arg) {
  HANDLE_TH_ERRORS
  if (!THPVariable_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "cuda_tensor_key: expected a tensor, got %s", Py_TYPE(arg)->tp_name);
    return nullptr;
  }
  // everything that may throw first, while no Python object is held
  const at::Tensor& t = THPVariable_Unpack(arg);
  const bool aligned = (reinterpret_cast<std::uintptr_t>(t.data_ptr()) & 15) == 0;
  const bool contiguous = t.is_contiguous();
  const c10::IntArrayRef strides = t.strides();
  const long device = t.get_device();
  const c10::IntArrayRef sizes = t.sizes();
  PyObject* shape = int_tuple(sizes, true);
  if (shape == nullptr) return nullptr;
  PyObject* items[5] = {reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())), shape,
                        contiguous ? Py_True : int_tuple(strides), PyLong_FromLong(device),
                        aligned ? Py_True : Py_False};
  Py_INCREF(items[0]);
  if (contiguous) Py_INCREF(Py_True);
  Py_INCREF(items[4]);
  PyObject* key = (items[2] && items[3]) ? PyTuple_New(5) : nullptr;
  if (key == nullptr) {
    for (PyObject* item : items) Py_XDECREF(item);
    return nullptr;
  }
  for (int i = 0; i < 5; ++i) PyTuple_SET_ITEM(key, i, items[i]);  // the tuple takes the references
  return key;
  END_HANDLE_TH_ERRORS
}

PyMethodDef tensor_key_def = {"cuda_tensor_key", cuda_tensor_key, METH_O,
                              "(dtype, shape, True or strides, device index, 16-byte aligned?) of a tensor"};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("cuda_tensor_key") = pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&tensor_key_def, nullptr));
}
