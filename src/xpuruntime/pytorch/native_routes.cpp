// The matrix-product aten overrides (mm, bmm, addmm) in C++, with the decisions already learned.
//
// A call whose signature the Python route has already seen under the current process policy, and that
// it ran with PyTorch's own kernel, runs that kernel here without entering Python; every other call goes
// to the Python route (the op xpuruntime_native::route_<name>, implemented in native_routes.py), which
// tells this table what it decided. Python clears the table (a new epoch) whenever a decision could
// change: the process policy, the registry, the dispatch observers, the installed overrides. Decisions are
// kept per policy: the process one, or the scoped policy open on the calling thread. Every
// `report_every` native calls, a Python callback hears of them (autotune's hand-back counts quiet calls).

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

enum RouteOp : int64_t { kMm = 0, kBmm = 1, kAddmm = 2 };
constexpr size_t kMaxDecisions = 4096;

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& key) const noexcept {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t word : key) {
      hash ^= static_cast<uint64_t>(word);
      hash *= 1099511628211ull;
    }
    return static_cast<size_t>(hash);
  }
};

// What the Python route's plan key sees of a tensor: dtype, device, shape, strides, 16-byte alignment
// (plus the conjugate and negative views, which aten resolves before this key).
void add_tensor(Key& key, const at::Tensor& t) {
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(static_cast<int64_t>(t.device().type()) * 4096 + t.device().index());
  key.push_back(t.dim() * 4 + (t.is_conj() ? 2 : 0) + (t.is_neg() ? 1 : 0));
  for (int64_t size : t.sizes()) key.push_back(size);
  for (int64_t stride : t.strides()) key.push_back(stride);
  key.push_back((reinterpret_cast<uintptr_t>(t.const_data_ptr()) & 15) == 0);
}

// False for a scalar the key cannot hold exactly (complex): such calls are never learned.
bool add_scalar(Key& key, const at::Scalar& s) {
  if (s.isComplex()) return false;
  double value = s.toDouble();
  int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  key.push_back(s.isFloatingPoint() ? 1 : 2);
  key.push_back(bits);
  return true;
}

struct Decisions {
  std::shared_mutex mutex;
  std::unordered_map<Key, bool, KeyHash> native;  // signature -> ran PyTorch's own kernel?
  int64_t epoch = 0;
  std::atomic<bool> enabled{false};
  std::atomic<int64_t> native_calls{0};
  std::atomic<int64_t> routed_calls{0};

  // 1: PyTorch's kernel, 0: the Python route, -1: unknown (then *epoch is the epoch to learn in)
  int find(const Key& key, int64_t* epoch_out) {
    std::shared_lock<std::shared_mutex> lock(mutex);
    auto it = native.find(key);
    *epoch_out = epoch;
    return it == native.end() ? -1 : (it->second ? 1 : 0);
  }

  void learn(Key&& key, int64_t seen_epoch, bool runs_native) {
    std::unique_lock<std::shared_mutex> lock(mutex);
    if (seen_epoch != epoch) return;  // decided under a policy that has changed since
    if (native.size() >= kMaxDecisions) native.clear();
    native[std::move(key)] = runs_native;
  }

  int64_t reset(bool enable) {
    std::unique_lock<std::shared_mutex> lock(mutex);
    native.clear();
    enabled.store(enable);
    return ++epoch;
  }
};

Decisions& decisions() {
  static Decisions table;
  return table;
}

// Who hears of native calls, and how often (0: nobody); set by `report_native_calls`.
struct Reporter {
  PyObject* callback = nullptr;  // read and written with the GIL held
  std::atomic<int64_t> every{0};
};
Reporter reporter;

// callback(calls), with the GIL; an error in it is reported as unraisable, never raised into the aten call
void report(int64_t calls) {
  PyGILState_STATE gil = PyGILState_Ensure();
  if (reporter.callback != nullptr) {
    PyObject* callback = Py_NewRef(reporter.callback);
    PyObject* result = PyObject_CallFunction(callback, "L", static_cast<long long>(calls));
    if (result == nullptr) PyErr_WriteUnraisable(callback);
    Py_XDECREF(result);
    Py_DECREF(callback);
  }
  PyGILState_Release(gil);
}

void count_native_call() {
  const int64_t calls = decisions().native_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t every = reporter.every.load(std::memory_order_relaxed);
  if (every > 0 && calls % every == 0) report(every);
}

// The scoped policies open on this thread, innermost last, as tokens from Python: a token keys the
// decisions learned under that policy (0: the process policy).
thread_local std::vector<int64_t> scope_tokens;

int64_t current_token() { return scope_tokens.empty() ? 0 : scope_tokens.back(); }

// The epoch a Python-routed call may learn in, or -1; sets *native when the call can skip Python.
int64_t lookup(const Key& key, bool* native) {
  *native = false;
  Decisions& table = decisions();
  if (!table.enabled.load(std::memory_order_relaxed)) return -1;
  int64_t epoch = -1;
  int found = table.find(key, &epoch);
  if (found == 1) {
    count_native_call();
    *native = true;
  }
  return found == -1 ? epoch : -1;
}

template <typename Signature>
c10::TypedOperatorHandle<Signature> python_route(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// The key of a call: the route and the thread's policy token, then its tensors in argument order (the
// Python route's `learn` builds the same from the same arguments).
Key call_key(int64_t op, std::initializer_list<const at::Tensor*> tensors) {
  Key key;
  key.reserve(32);
  key.push_back(op);
  key.push_back(current_token());
  for (const at::Tensor* t : tensors) add_tensor(key, *t);
  return key;
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  bool native = false;
  int64_t epoch = lookup(call_key(kMm, {&a, &b}), &native);
  if (native) {
    at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
    return at::mm_out(out, a, b);
  }
  decisions().routed_calls.fetch_add(1, std::memory_order_relaxed);
  static auto route = python_route<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>(
      "xpuruntime_native::route_mm");
  return route.call(a, b, epoch);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  bool native = false;
  int64_t epoch = lookup(call_key(kBmm, {&a, &b}), &native);
  if (native) {
    at::Tensor out = at::empty({a.size(0), a.size(1), b.size(2)}, a.options());
    return at::bmm_out(out, a, b);
  }
  decisions().routed_calls.fetch_add(1, std::memory_order_relaxed);
  static auto route = python_route<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>(
      "xpuruntime_native::route_bmm");
  return route.call(a, b, epoch);
}

at::Tensor addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                 const at::Scalar& alpha) {
  Key key = call_key(kAddmm, {&bias, &a, &b});
  bool native = false;
  int64_t epoch = -1;
  if (add_scalar(key, beta) && add_scalar(key, alpha)) epoch = lookup(key, &native);
  if (native) {
    at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
    return at::addmm_out(out, bias, a, b, beta, alpha);
  }
  decisions().routed_calls.fetch_add(1, std::memory_order_relaxed);
  static auto route = python_route<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                              const at::Scalar&, const at::Scalar&, int64_t)>(
      "xpuruntime_native::route_addmm");
  return route.call(bias, a, b, beta, alpha, epoch);
}

// -- control, called from Python -------------------------------------------------------------------

std::unordered_map<int64_t, std::unique_ptr<torch::Library>>& libraries() {
  static std::unordered_map<int64_t, std::unique_ptr<torch::Library>> installed;
  return installed;
}

// Override aten::<name> at `dispatch_key` with the native route of that name; returns a handle for
// `uninstall`. (Silently: PyTorch warns about overriding a registered kernel, which is what this is for.)
int64_t install(const std::string& name, const std::string& dispatch_key) {
  struct Silent : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  } silent;
  c10::WarningUtils::WarningHandlerGuard quiet(&silent);
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                  c10::parseDispatchKey(dispatch_key), __FILE__, __LINE__);
  if (name == "mm") {
    library->impl("mm", TORCH_FN(mm));
  } else if (name == "bmm") {
    library->impl("bmm", TORCH_FN(bmm));
  } else if (name == "addmm") {
    library->impl("addmm", TORCH_FN(addmm));
  } else {
    TORCH_CHECK(false, "xpuruntime native routes: no route for aten::", name);
  }
  static int64_t next_handle = 0;
  libraries()[++next_handle] = std::move(library);
  return next_handle;
}

void uninstall(int64_t handle) { libraries().erase(handle); }

// `token`: the policy the Python route followed; a call whose thread holds another (an asyncio task that
// inherited a scope's context) teaches nothing.
void learn(int64_t op, const std::vector<at::Tensor>& tensors, const std::vector<at::Scalar>& scalars,
           int64_t epoch, int64_t token, bool runs_native) {
  if (token != current_token()) return;
  Key key{op, token};
  for (const at::Tensor& t : tensors) add_tensor(key, t);
  for (const at::Scalar& s : scalars) {
    if (!add_scalar(key, s)) return;
  }
  decisions().learn(std::move(key), epoch, runs_native);
}

int64_t reset(bool enabled) { return decisions().reset(enabled); }

void enter_scope(int64_t token) { scope_tokens.push_back(token); }

void exit_scope() {
  if (!scope_tokens.empty()) scope_tokens.pop_back();
}

std::vector<int64_t> stats() {
  Decisions& table = decisions();
  std::shared_lock<std::shared_mutex> lock(table.mutex);
  return {table.native_calls.load(), table.routed_calls.load(), static_cast<int64_t>(table.native.size()),
          table.epoch, table.enabled.load() ? 1 : 0};
}

}  // namespace

// report_native_calls(callback or None, every): callback(every) after each `every` native calls. A Python
// function of the extension's module (runtime/hot_path.cpp lists it), since an aten op cannot take a callable.
PyObject* report_native_calls(PyObject* /*module*/, PyObject* args) {
  PyObject* callback;
  long long every;
  if (!PyArg_ParseTuple(args, "OL", &callback, &every)) return nullptr;
  if (callback != Py_None && !PyCallable_Check(callback)) {
    PyErr_SetString(PyExc_TypeError, "report_native_calls: callback must be callable or None");
    return nullptr;
  }
  reporter.every.store(0);  // nobody is told while the callback changes
  Py_XSETREF(reporter.callback, callback == Py_None ? nullptr : Py_NewRef(callback));
  reporter.every.store(reporter.callback == nullptr ? 0 : std::max<long long>(every, 1));
  Py_RETURN_NONE;
}

TORCH_LIBRARY(xpuruntime_native, m) {
  // implemented in Python (native_routes.py): epoch >= 0 asks the route to report what it decided
  m.def("route_mm(Tensor a, Tensor b, int epoch) -> Tensor");
  m.def("route_bmm(Tensor a, Tensor b, int epoch) -> Tensor");
  m.def("route_addmm(Tensor bias, Tensor a, Tensor b, Scalar beta, Scalar alpha, int epoch) -> Tensor");
  m.def("install(str name, str dispatch_key) -> int", &install);
  m.def("uninstall(int handle) -> ()", &uninstall);
  m.def("learn(int op, Tensor[] tensors, Scalar[] scalars, int epoch, int token, bool native) -> ()", &learn);
  m.def("reset(bool enabled) -> int", &reset);
  m.def("enter_scope(int token) -> ()", &enter_scope);
  m.def("exit_scope() -> ()", &exit_scope);
  m.def("stats() -> int[]", &stats);
}
