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

// What the key needs from Python, set by `use_python` (references kept for the process's life).
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
  if (py.ndarray == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "plan_key: call use_python first");
    return nullptr;
  }
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

// The layout of `Plan.hit_path` (plan.py builds it) and the order of ArgPack's slots in `argpack_slots`.
enum HitPath { kCurrentStream, kDevice, kAllocate, kAttrs, kConfig, kLaunch, kHitPathSize };
enum ArgPackSlot { kInputs, kOut, kPackAttrs, kPackConfig, kWorkspace, kStream, kArgPackSize };

// What the hit path needs from the dispatcher, set once by `use_dispatcher`.
struct DispatcherSide {
  PyObject* not_hit = nullptr;          // dispatch.NOT_HIT
  PyObject* not_an_array = nullptr;     // arrays.NotAnArray: like TypeError, a key error Python converts
  PyTypeObject* argpack = nullptr;      // abi.ArgPack
  Py_ssize_t argpack_slots[kArgPackSize] = {};  // where its slots are, in ArgPackSlot order
  PyObject* launch_error = nullptr;     // dispatch._launch_error(plan, exc) -> LaunchError
  PyObject* returned_output = nullptr;  // dispatch._returned_output(plan, returned): raises for None
  PyObject* hits = nullptr;             // interned attribute names
  PyObject* last_used = nullptr;
  PyObject* hit_path = nullptr;
};
DispatcherSide dispatcher;

// An ArgPack without running its Python __init__: its slots written where the class keeps them
// (`use_dispatcher` checked that these six are all it has).
PyObject* make_argpack(PyObject* const values[kArgPackSize]) {
  PyObject* pack = dispatcher.argpack->tp_alloc(dispatcher.argpack, 0);
  if (pack == nullptr) return nullptr;
  for (int i = 0; i < kArgPackSize; ++i) {
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

// The launch raised an Exception: raise dispatch._launch_error(plan, exc) from exc, as Dispatcher.run's
// `except Exception as exc:` does. The caller's frame joins exc's traceback (Python's path has it there),
// and exc is the handled exception meanwhile, so that whatever is raised here gets it as __context__.
void raise_launch_error(PyObject* plan) {
  PyFrameObject* frame = PyEval_GetFrame();  // Dispatcher.run
  if (frame != nullptr) PyTraceBack_Here(frame);
  PyObject *type, *exc, *traceback;
  PyErr_Fetch(&type, &exc, &traceback);
  PyErr_NormalizeException(&type, &exc, &traceback);
  if (traceback != nullptr) PyException_SetTraceback(exc, traceback);
  PyObject* handled = PyErr_GetHandledException();
  PyErr_SetHandledException(exc);
  PyObject* error = PyObject_CallFunctionObjArgs(dispatcher.launch_error, plan, exc, nullptr);
  if (error != nullptr) {
    PyException_SetCause(error, Py_NewRef(exc));  // also sets __suppress_context__, as `from exc` does
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error)), error);  // __context__: exc
    Py_DECREF(error);
  }
  PyErr_SetHandledException(handled);
  Py_XDECREF(handled);
  Py_XDECREF(type);
  Py_XDECREF(exc);
  Py_XDECREF(traceback);
}

// Runs a plan's hit_path on `inputs`: stream, output, ArgPack, launch; returns the output.
PyObject* run_hit_path(PyObject* plan, PyObject* hit_path, PyObject* inputs) {
  PyObject* const* step = &PyTuple_GET_ITEM(hit_path, 0);
  PyObject *current_stream = step[kCurrentStream], *allocate = step[kAllocate];
  PyObject* stream =
      current_stream == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(current_stream, step[kDevice]);
  if (stream == nullptr) return nullptr;
  // None for a returns_output kernel (its return value is the output), as Python's path does
  PyObject* out = allocate == Py_None ? Py_NewRef(Py_None) : PyObject_CallOneArg(allocate, stream);
  PyObject* returned = nullptr;
  if (out != nullptr) {
    PyObject* const values[kArgPackSize] = {inputs, out, step[kAttrs], step[kConfig], Py_None, stream};
    PyObject* pack = make_argpack(values);
    if (pack != nullptr) {
      returned = PyObject_CallOneArg(step[kLaunch], pack);
      if (returned == nullptr && PyErr_ExceptionMatches(PyExc_Exception)) raise_launch_error(plan);
      Py_DECREF(pack);
    }
  }
  Py_DECREF(stream);
  if (returned == nullptr) {
    Py_XDECREF(out);
    return nullptr;
  }
  if (out != Py_None) {
    Py_DECREF(returned);
    return out;
  }
  Py_DECREF(out);
  if (returned != Py_None) return returned;
  Py_DECREF(returned);
  return PyObject_CallFunctionObjArgs(dispatcher.returned_output, plan, Py_None, nullptr);  // raises
}

// plan_hit(cache, entries, op, fingerprint, attrs, inputs) -> the output, or NOT_HIT (nothing has run)
PyObject* plan_hit(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (dispatcher.not_hit == nullptr || py.ndarray == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "plan_hit: call use_python and use_dispatcher first");
    return nullptr;
  }
  if (nargs != 6 || !PyDict_CheckExact(args[1])) {
    PyErr_SetString(PyExc_TypeError, "plan_hit: expected (cache, entries dict, op, fingerprint, attrs, inputs)");
    return nullptr;
  }
  PyObject* const key_args[5] = {args[2], args[3], args[4], args[5], Py_None};
  PyObject* key = plan_key(nullptr, key_args, 5);
  // the GIL is held from the lookup to the INCREF: no other thread can drop the dict's reference between
  PyObject* plan = key == nullptr ? nullptr : PyDict_GetItemWithError(args[1], key);
  Py_XINCREF(plan);  // the dict's reference may go while the kernel runs (another thread may evict it)
  Py_XDECREF(key);
  if (plan == nullptr) {
    if (!PyErr_Occurred()) return Py_NewRef(dispatcher.not_hit);  // a miss
    // Python's path converts the arguments of a call its key refuses; every other error is the caller's
    if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(dispatcher.not_an_array)) return nullptr;
    PyErr_Clear();
    return Py_NewRef(dispatcher.not_hit);
  }
  PyObject* hit_path = PyObject_GetAttr(plan, dispatcher.hit_path);
  PyObject* result = nullptr;
  if (hit_path == Py_None) {
    result = Py_NewRef(dispatcher.not_hit);
  } else if (hit_path != nullptr && (!PyTuple_CheckExact(hit_path) || PyTuple_GET_SIZE(hit_path) != kHitPathSize)) {
    PyErr_SetString(PyExc_TypeError, "plan_hit: Plan.hit_path must be None or a tuple of 6");
  } else if (hit_path != nullptr && count_hit(args[0], plan)) {
    result = run_hit_path(plan, hit_path, args[5]);
  }
  Py_XDECREF(hit_path);
  Py_DECREF(plan);
  return result;
}

// Where a __slots__ class keeps its members, in the order named; false unless they are all it has.
bool slot_offsets(PyTypeObject* type, std::initializer_list<const char*> names, Py_ssize_t* offsets) {
  const auto slots = static_cast<Py_ssize_t>(names.size());
  if (type->tp_base != &PyBaseObject_Type || type->tp_dictoffset != 0 ||
      type->tp_basicsize != PyBaseObject_Type.tp_basicsize + slots * static_cast<Py_ssize_t>(sizeof(PyObject*))) {
    PyErr_Format(PyExc_TypeError, "use_dispatcher: %s must have exactly the __slots__ the C hit path fills", type->tp_name);
    return false;
  }
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
  PyObject *not_hit, *not_an_array, *argpack, *launch_error, *returned_output;
  if (!PyArg_ParseTuple(args, "OOO!OO", &not_hit, &not_an_array, &PyType_Type, &argpack, &launch_error,
                        &returned_output)) {
    return nullptr;
  }
  auto* type = reinterpret_cast<PyTypeObject*>(argpack);
  // in ArgPackSlot order
  if (!slot_offsets(type, {"inputs", "out", "attrs", "config", "workspace", "stream"}, dispatcher.argpack_slots)) {
    return nullptr;
  }
  Py_XSETREF(dispatcher.not_hit, Py_NewRef(not_hit));
  Py_XSETREF(dispatcher.not_an_array, Py_NewRef(not_an_array));
  Py_XSETREF(dispatcher.argpack, reinterpret_cast<PyTypeObject*>(Py_NewRef(argpack)));
  Py_XSETREF(dispatcher.launch_error, Py_NewRef(launch_error));
  Py_XSETREF(dispatcher.returned_output, Py_NewRef(returned_output));
  Py_XSETREF(dispatcher.hits, PyUnicode_InternFromString("hits"));
  Py_XSETREF(dispatcher.last_used, PyUnicode_InternFromString("last_used"));
  Py_XSETREF(dispatcher.hit_path, PyUnicode_InternFromString("hit_path"));
  Py_RETURN_NONE;
}

PyObject* use_python(PyObject* /*module*/, PyObject* args) {
  PyObject *ndarray, *signature, *attr_types, *python_plan_key;
  if (!PyArg_ParseTuple(args, "OOOO", &ndarray, &signature, &attr_types, &python_plan_key)) return nullptr;
  Py_XSETREF(py.ndarray, Py_NewRef(ndarray));
  Py_XSETREF(py.signature, Py_NewRef(signature));
  Py_XSETREF(py.attr_types, Py_NewRef(attr_types));
  Py_XSETREF(py.python_plan_key, Py_NewRef(python_plan_key));
  Py_XSETREF(py.dtype, PyUnicode_InternFromString("dtype"));
  Py_XSETREF(py.shape, PyUnicode_InternFromString("shape"));
  Py_XSETREF(py.strides, PyUnicode_InternFromString("strides"));
  Py_RETURN_NONE;
}

}  // namespace

PyObject* report_native_calls(PyObject* module, PyObject* args);  // pytorch/native_routes.cpp
PyObject* set_bias_grad_planner(PyObject* module, PyObject* planner);  // pytorch/native_routes.cpp

namespace {

PyMethodDef methods[] = {
    {"cuda_tensor_key", cuda_tensor_key, METH_O,
     "(dtype, shape, True or strides, device index, 16-byte aligned?) of a tensor"},
    {"plan_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(plan_key)), METH_FASTCALL,
     "the plan-cache key of a call, as arguments.python_plan_key builds it"},
    {"use_python", use_python, METH_VARARGS,
     "use_python(ndarray, signature, attr_types, python_plan_key): what the key needs from Python"},
    {"plan_hit", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(plan_hit)), METH_FASTCALL,
     "Dispatcher.run's plan-cache hit for a call without out=: the output, or NOT_HIT"},
    {"report_native_calls", report_native_calls, METH_VARARGS,
     "report_native_calls(callback or None, every): callback(every) after each `every` native aten calls"},
    {"set_bias_grad_planner", set_bias_grad_planner, METH_O,
     "set_bias_grad_planner(planner or None): who plans the fused_cast backward's BGRADB GEMMs"},
    {"use_dispatcher", use_dispatcher, METH_VARARGS,
     "use_dispatcher(NOT_HIT, NotAnArray, ArgPack, launch_error, returned_output): what the hit path needs"},
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (PyMethodDef& def : methods) {
    m.attr(def.ml_name) = pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&def, nullptr));
  }
}
