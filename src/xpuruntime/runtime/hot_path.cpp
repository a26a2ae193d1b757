// The dispatcher's hot path in C: the plan-cache key and, for a call without out=, the whole plan-cache hit.
//
// `plan_key` builds the very tuples `arguments.python_plan_key` and `arrays.python_cuda_tensor_key` build in
// Python, for ~1 us less per call with CUDA tensors (each tensor attribute read through PyTorch's Python
// bindings costs ~0.15 us). Argument kinds other than NumPy arrays, CUDA tensors and Python scalars go to
// the Python `signature`, exactly as the Python key does.
//
// `plan_hit` is `Dispatcher.run` on a hit (key, lookup, hit count, stream, output, ArgPack, launch) without
// the interpreter between the steps; anything else (a miss, an argument only Python can key, a plan that
// lends a workspace or syncs) is handed back to Python as NOT_HIT before anything has run.
//
// This file also defines the Python module of xpuruntime's one C++ extension (runtime/extension.py); the
// PyTorch front end's aten routes (pytorch/native_routes.cpp) are compiled into the same library.

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>
#include <structmember.h>

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

// What the hit path needs from the dispatcher, set once by `use_dispatcher`.
struct DispatcherSide {
  PyObject* not_hit = nullptr;          // dispatch.NOT_HIT
  PyTypeObject* argpack = nullptr;      // abi.ArgPack
  Py_ssize_t argpack_slots[6] = {};     // offsets of inputs, out, attrs, config, workspace, stream
  PyObject* launch_error = nullptr;     // dispatch._launch_error(plan, exc) -> LaunchError
  PyObject* returned_output = nullptr;  // dispatch._returned_output(plan, returned): raises for None
  PyObject* hits = nullptr;             // interned attribute names
  PyObject* last_used = nullptr;
  PyObject* hit_path = nullptr;
};
DispatcherSide dispatcher;

// An ArgPack without running its Python __init__: its six __slots__ written where the class keeps them.
PyObject* make_argpack(PyObject* const values[6]) {
  PyObject* pack = dispatcher.argpack->tp_alloc(dispatcher.argpack, 0);
  if (pack == nullptr) return nullptr;
  for (int i = 0; i < 6; ++i) {
    *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(pack) + dispatcher.argpack_slots[i]) = Py_NewRef(values[i]);
  }
  return pack;
}

// PlanCache.get's bookkeeping: one more hit, which is also the plan's LRU time.
bool count_hit(PyObject* cache, PyObject* plan) {
  PyObject* hits = PyObject_GetAttr(cache, dispatcher.hits);
  const long long count = hits == nullptr ? -1 : PyLong_AsLongLong(hits);
  Py_XDECREF(hits);
  if (count == -1 && PyErr_Occurred()) return false;
  PyObject* next = PyLong_FromLongLong(count + 1);
  const bool ok = next != nullptr && PyObject_SetAttr(cache, dispatcher.hits, next) == 0 &&
                  PyObject_SetAttr(plan, dispatcher.last_used, next) == 0;
  Py_XDECREF(next);
  return ok;
}

// The launch failed: raise dispatch._launch_error(plan, exc) from exc, as Dispatcher.run does.
void raise_launch_error(PyObject* plan) {
  PyObject *type, *exc, *traceback;
  PyErr_Fetch(&type, &exc, &traceback);
  PyErr_NormalizeException(&type, &exc, &traceback);
  if (traceback != nullptr) PyException_SetTraceback(exc, traceback);
  PyObject* error = PyObject_CallFunctionObjArgs(dispatcher.launch_error, plan, exc, nullptr);
  if (error != nullptr) {
    PyException_SetContext(error, Py_NewRef(exc));
    PyException_SetCause(error, Py_NewRef(exc));  // also sets __suppress_context__, as `from exc` does
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error)), error);
    Py_DECREF(error);
  }
  Py_XDECREF(type);
  Py_XDECREF(exc);
  Py_XDECREF(traceback);
}

// Runs a plan's hit_path (current_stream, device, allocate, attrs, config, launch) on `inputs`.
PyObject* launch(PyObject* plan, PyObject* hit_path, PyObject* inputs) {
  PyObject* const* step = &PyTuple_GET_ITEM(hit_path, 0);
  PyObject *current_stream = step[0], *device = step[1], *allocate = step[2], *launch = step[5];
  PyObject* stream = current_stream == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(current_stream, device);
  if (stream == nullptr) return nullptr;
  PyObject* out = allocate == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(allocate, stream);
  PyObject* returned = nullptr;
  if (out != nullptr) {
    PyObject* const values[6] = {inputs, out, step[3], step[4], Py_None, stream};
    PyObject* pack = make_argpack(values);
    if (pack != nullptr) {
      returned = PyObject_CallOneArg(launch, pack);
      if (returned == nullptr) raise_launch_error(plan);
      Py_DECREF(pack);
    }
  }
  Py_DECREF(stream);
  if (returned == nullptr || allocate == Py_None) {  // a returns_output kernel: its return value is the output
    Py_XDECREF(out);
    if (returned == Py_None) {
      Py_DECREF(returned);
      return PyObject_CallFunctionObjArgs(dispatcher.returned_output, plan, Py_None, nullptr);  // raises
    }
    return returned;
  }
  Py_DECREF(returned);
  return out;
}

// plan_hit(cache, entries, op, fingerprint, attrs, inputs) -> the output, or NOT_HIT (nothing has run)
PyObject* plan_hit(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyDict_CheckExact(args[1]) || !PyTuple_CheckExact(args[5])) {
    PyErr_SetString(PyExc_TypeError, "plan_hit: expected (cache, entries dict, op, fingerprint, attrs, inputs tuple)");
    return nullptr;
  }
  PyObject* const key_args[5] = {args[2], args[3], args[4], args[5], Py_None};
  PyObject* key = plan_key(nullptr, key_args, 5);
  PyObject* plan = key == nullptr ? nullptr : PyDict_GetItemWithError(args[1], key);
  Py_XINCREF(plan);  // the dict's reference may go while the kernel runs (another thread may evict it)
  Py_XDECREF(key);
  if (plan == nullptr) {  // a miss, or a key error that Python's path raises or converts
    PyErr_Clear();
    return Py_NewRef(dispatcher.not_hit);
  }
  PyObject* hit_path = PyObject_GetAttr(plan, dispatcher.hit_path);
  PyObject* result = nullptr;
  if (hit_path == Py_None) result = Py_NewRef(dispatcher.not_hit);
  else if (hit_path != nullptr && count_hit(args[0], plan)) result = launch(plan, hit_path, args[5]);
  Py_XDECREF(hit_path);
  Py_DECREF(plan);
  return result;
}

// Offsets of a __slots__ class's members, in the order given.
bool slot_offsets(PyTypeObject* type, std::initializer_list<const char*> names, Py_ssize_t* offsets) {
  for (const char* name : names) {
    PyObject* member = PyDict_GetItemString(type->tp_dict, name);
    if (member == nullptr || !PyObject_TypeCheck(member, &PyMemberDescr_Type)) {
      PyErr_Format(PyExc_TypeError, "use_dispatcher: %s.%s is not a __slots__ member", type->tp_name, name);
      return false;
    }
    *offsets++ = reinterpret_cast<PyMemberDescrObject*>(member)->d_member->offset;
  }
  return true;
}

PyObject* use_dispatcher(PyObject* /*module*/, PyObject* args) {
  PyObject *not_hit, *argpack, *launch_error, *returned_output;
  if (!PyArg_ParseTuple(args, "OO!OO", &not_hit, &PyType_Type, &argpack, &launch_error, &returned_output)) return nullptr;
  auto* type = reinterpret_cast<PyTypeObject*>(argpack);
  if (!slot_offsets(type, {"inputs", "out", "attrs", "config", "workspace", "stream"}, dispatcher.argpack_slots)) return nullptr;
  for (PyObject* ref : {not_hit, argpack, launch_error, returned_output}) Py_INCREF(ref);
  dispatcher.not_hit = not_hit;
  dispatcher.argpack = type;
  dispatcher.launch_error = launch_error;
  dispatcher.returned_output = returned_output;
  dispatcher.hits = PyUnicode_InternFromString("hits");
  dispatcher.last_used = PyUnicode_InternFromString("last_used");
  dispatcher.hit_path = PyUnicode_InternFromString("hit_path");
  Py_RETURN_NONE;
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
    {"plan_hit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(plan_hit)), METH_FASTCALL,
     "Dispatcher.run's plan-cache hit for a call without out=: the output, or NOT_HIT"},
    {"use_dispatcher", use_dispatcher, METH_VARARGS,
     "use_dispatcher(NOT_HIT, ArgPack, launch_error, returned_output): what the hit path needs"},
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (PyMethodDef& def : methods) {
    m.attr(def.ml_name) = pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&def, nullptr));
  }
}
