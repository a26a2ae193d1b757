// The matrix-product aten overrides (mm, bmm, addmm) and nn.Linear's autocast override in C++, with the
// decisions already learned.
//
// A call whose signature the Python route has already seen under the current process policy, and that
// it ran with PyTorch's own kernel (or, for linear, with the `fused_cast` kernel below), runs that kernel
// here without entering Python; every other call goes to the Python route (the op
// xpuruntime_native::route_<name>, implemented in native_routes.py), which tells this table what it decided. Python clears the table (a new epoch) whenever a decision could
// change: the process policy, the registry, the dispatch observers, the installed overrides. Decisions are
// kept per policy: the process one, or the scoped policy open on the calling thread. Every
// `report_every` native calls, a Python callback hears of them (autotune's hand-back counts quiet calls).

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/_unsafe_view.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

enum RouteOp : int64_t { kMm = 0, kBmm = 1, kAddmm = 2, kLinear = 3 };
// What a learned signature runs: the Python route, PyTorch's own kernel, or the fused_cast linear.
enum Action : int8_t { kPython = 0, kPyTorch = 1, kFusedCast = 2 };
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
  std::unordered_map<Key, Action, KeyHash> native;  // signature -> what it runs
  int64_t epoch = 0;
  std::atomic<bool> enabled{false};
  std::atomic<int64_t> native_calls{0};
  std::atomic<int64_t> routed_calls{0};

  // The learned Action, or -1: unknown (then *epoch is the epoch to learn in)
  int find(const Key& key, int64_t* epoch_out) {
    std::shared_lock<std::shared_mutex> lock(mutex);
    auto it = native.find(key);
    *epoch_out = epoch;
    return it == native.end() ? -1 : it->second;
  }

  void learn(Key&& key, int64_t seen_epoch, Action action) {
    std::unique_lock<std::shared_mutex> lock(mutex);
    if (seen_epoch != epoch) return;  // decided under a policy that has changed since
    if (native.size() >= kMaxDecisions) native.clear();
    native[std::move(key)] = action;
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

// The epoch a Python-routed call may learn in, or -1; sets *action to what the call runs (kPython: the
// Python route).
int64_t lookup_action(const Key& key, Action* action) {
  *action = kPython;
  Decisions& table = decisions();
  if (!table.enabled.load(std::memory_order_relaxed)) return -1;
  int64_t epoch = -1;
  int found = table.find(key, &epoch);
  if (found > 0) {
    count_native_call();
    *action = static_cast<Action>(found);
  }
  return found == -1 ? epoch : -1;
}

// lookup_action for the matrix products, whose only native action is PyTorch's kernel.
int64_t lookup(const Key& key, bool* native) {
  Action action = kPython;
  int64_t epoch = lookup_action(key, &action);
  *native = action == kPyTorch;
  return epoch;
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

// -- nn.Linear under autocast ----------------------------------------------------------------------

at::Tensor product(const at::Tensor& a, const at::Tensor& b, at::ScalarType out_dtype) {
  if (a.scalar_type() == out_dtype) return at::mm(a, b);
  const bool half = a.scalar_type() == at::kHalf || a.scalar_type() == at::kBFloat16;
  if (a.is_cuda() && half && out_dtype == at::kFloat) return at::mm(a, b, out_dtype);  // fp32 from the accumulator
  return at::mm(a, b).to(out_dtype);  // the pairs CUDA's mm(out_dtype) does not take, and CPU
}

// The `fused_cast` kernel of autocast_linear: y = x W^T + b computed in `dtype` (bf16 / fp16) from the
// fp32 master weight and bias, as autocast does, but as one autograd node whose backward writes each
// gradient in its input's dtype straight from the GEMM (no cast kernels) and sums the bias gradient in
// that dtype: per layer, three backward kernels where autocast's graph runs five or six.
struct FusedCastLinear : public torch::autograd::Function<FusedCastLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::ScalarType dtype) {
    const bool has_bias = bias.has_value() && bias->defined();
    at::Tensor rows = x.to(dtype).reshape({-1, x.size(-1)});
    at::Tensor w = weight.to(dtype);
    at::Tensor y = has_bias ? at::addmm(bias->to(dtype), rows, w.t()) : at::mm(rows, w.t());
    ctx->save_for_backward({rows, w});
    ctx->saved_data["x_shape"] = x.sizes().vec();
    ctx->saved_data["dtypes"] = std::vector<int64_t>{static_cast<int64_t>(x.scalar_type()),
                                                     static_cast<int64_t>(weight.scalar_type()),
                                                     has_bias ? static_cast<int64_t>(bias->scalar_type()) : -1};
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = weight.size(0);
    return at::_unsafe_view(y, shape);  // as at::linear does: the output may be modified in place
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (at::GradMode::is_enabled()) {  // the casts were made without grad: their gradients would be wrong
      throw std::runtime_error(
          "autocast_linear: the fused_cast kernel has no double backward (create_graph=True); use "
          "autocast_linear='torch' for gradients of gradients");
    }
    auto saved = ctx->get_saved_variables();
    const at::Tensor& rows = saved[0];
    const at::Tensor& w = saved[1];
    std::vector<int64_t> dtypes = ctx->saved_data["dtypes"].toIntVector();
    at::Tensor dy = grads[0].reshape({-1, w.size(0)});
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      dx = product(dy, w, static_cast<at::ScalarType>(dtypes[0])).view(ctx->saved_data["x_shape"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) dw = product(dy.t(), rows, static_cast<at::ScalarType>(dtypes[1]));
    if (dtypes[2] >= 0 && ctx->needs_input_grad(2)) {
      db = dy.sum(0, false, static_cast<at::ScalarType>(dtypes[2]));
    }
    return {dx, dw, db, at::Tensor()};
  }
};

// "(2, 3)": a shape for error messages (streaming IntArrayRef into TORCH_CHECK crashed with PyTorch 2.11).
std::string shape_text(const at::Tensor& t) {
  std::string text = "(";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + (t.dim() == 1 ? ",)" : ")");
}

at::Tensor fused_cast_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             at::ScalarType dtype) {
  if (weight.dim() != 2) {
    throw std::invalid_argument("fused_cast_linear: 'weight' must be 2-d (out_features, in_features), has shape " +
                                shape_text(weight));
  }
  if (x.dim() < 1 || x.size(-1) != weight.size(1)) {
    throw std::invalid_argument("fused_cast_linear: 'x' must end in in_features " + std::to_string(weight.size(1)) +
                                ", has shape " + shape_text(x));
  }
  return FusedCastLinear::apply(x, weight, bias, dtype);
}

// A tensor the fused node may take: a plain strided tensor with storage (fake and other Python-subclass
// tensors, as in torch.compile's tracing, functorch wrappers and nested tensors take autocast's own
// path), without a forward-mode gradient (the node has no jvp), and not float64 (autocast leaves it uncast).
bool fusable(const at::Tensor& t) {
  constexpr c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched,
                                         c10::DispatchKey::FuncTorchGradWrapper});
  return !t.key_set().has_any(wrapped) && !t.is_nested() && t.layout() == at::kStrided && t.has_storage() &&
         t.scalar_type() != at::kDouble && !t._fw_grad(/*level=*/0).defined();
}

// No tracing mode or functorch transform is active on this thread.
bool untraced() {
  return c10::impl::TorchDispatchModeTLS::stack_len() == 0 &&
         !c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

// aten::linear at the Autocast key: a signature learned as fused_cast runs FusedCastLinear here, one learned
// as PyTorch's runs autocast's own linear (cast, then linear below autocast), the rest go to Python.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const c10::DeviceType device = x.device().type();
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      device == c10::DeviceType::CPU ? c10::DispatchKey::AutocastCPU : c10::DispatchKey::AutocastCUDA);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
  const bool has_bias = bias.has_value() && bias->defined();
  if (untraced() && fusable(x) && fusable(weight) && (!has_bias || fusable(*bias))) {
    Key key = has_bias ? call_key(kLinear, {&x, &weight, &*bias}) : call_key(kLinear, {&x, &weight});
    key.push_back(static_cast<int64_t>(dtype));
    Action action = kPython;
    int64_t epoch = lookup_action(key, &action);
    if (action == kFusedCast) return FusedCastLinear::apply(x, weight, bias, dtype);
    if (action == kPython) {
      decisions().routed_calls.fetch_add(1, std::memory_order_relaxed);
      static auto route = python_route<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                  const std::optional<at::Tensor>&, at::ScalarType, int64_t)>(
          "xpuruntime_native::route_linear");
      return route.call(x, weight, bias, dtype, epoch);
    }
  }
  return at::linear(at::autocast::cached_cast(dtype, x, device), at::autocast::cached_cast(dtype, weight, device),
                    at::autocast::cached_cast(dtype, bias, device));
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
  } else if (name == "linear") {
    library->impl("linear", TORCH_FN(linear));
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
// `dtype`: the autocast dtype of a linear call (its key's last word).
void learn(int64_t op, const std::vector<at::Tensor>& tensors, const std::vector<at::Scalar>& scalars,
           std::optional<at::ScalarType> dtype, int64_t epoch, int64_t token, int64_t action) {
  TORCH_CHECK(action >= kPython && action <= kFusedCast, "xpuruntime native routes: unknown action ", action);
  if (token != current_token()) return;
  Key key{op, token};
  for (const at::Tensor& t : tensors) add_tensor(key, t);
  for (const at::Scalar& s : scalars) {
    if (!add_scalar(key, s)) return;
  }
  if (dtype.has_value()) key.push_back(static_cast<int64_t>(*dtype));
  decisions().learn(std::move(key), epoch, static_cast<Action>(action));
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
  m.def("route_linear(Tensor x, Tensor weight, Tensor? bias, ScalarType dtype, int epoch) -> Tensor");
  m.def("fused_cast_linear(Tensor x, Tensor weight, Tensor? bias, ScalarType dtype) -> Tensor", &fused_cast_linear);
  m.def("install(str name, str dispatch_key) -> int", &install);
  m.def("uninstall(int handle) -> ()", &uninstall);
  m.def("learn(int op, Tensor[] tensors, Scalar[] scalars, ScalarType? dtype, int epoch, int token, int action) -> ()", &learn);
  m.def("reset(bool enabled) -> int", &reset);
  m.def("enter_scope(int token) -> ()", &enter_scope);
  m.def("exit_scope() -> ()", &exit_scope);
  m.def("stats() -> int[]", &stats);
}
