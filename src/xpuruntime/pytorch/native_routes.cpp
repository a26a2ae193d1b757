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
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/python_variable.h>
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

// "(2, 3)": a shape for error messages (streaming IntArrayRef into TORCH_CHECK crashed with PyTorch 2.11).
std::string shape_text(const at::Tensor& t) {
  std::string text = "(";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + (t.dim() == 1 ? ",)" : ")");
}

// -- dW and db from one cuBLASLt GEMM ----------------------------------------------------------------
//
// With fp32 master weight and bias, the weight gradient dW = dy^T x (fp32 from the accumulator) and the
// bias gradient db = column sums of dy come out of one cuBLASLt matmul whose BGRADB epilogue reduces dy
// as the GEMM reads it: one kernel instead of a GEMM and a reduction over dy. Python plans each problem
// once (`bias_grad_planner`: nvmath-python, backends/cublaslt/linear.py) and hands over the raw cuBLASLt
// objects; this file only launches them, through function pointers into the cuBLASLt that nvmath
// loaded (no CUDA headers: the extension builds on CPU-only machines too).

using LtMatmul = int (*)(void* handle, void* desc, const void* alpha, const void* a, void* a_layout, const void* b,
                         void* b_layout, const void* beta, const void* c, void* c_layout, void* d, void* d_layout,
                         const void* algo, void* workspace, size_t workspace_bytes, void* stream);
using LtSetAttribute = int (*)(void* desc, int attribute, const void* value, size_t bytes);

// One planned matmul D = A B (+ BGRADB), D written in place of C: A = x^T (column-major view of the
// row-major (N, in) rows), B = dy, D = dW^T; the epilogue's output is the descriptor's bias pointer.
struct BiasGradGemm {
  LtMatmul matmul;
  LtSetAttribute set_attribute;
  int bias_pointer_attribute;
  void *handle, *desc, *a_layout, *b_layout, *c_layout, *d_layout;
  const void *alpha, *beta, *algo;
  int64_t workspace_bytes;
  std::mutex mutex;  // the descriptor's bias pointer is set per launch
  std::atomic<bool> failed{false};  // cuBLASLt refused a launch: the unfused backward serves from then on
};
constexpr int kBiasGradPlanInts = 13;
// dW and db are fresh allocations, as at planning: the caching allocator aligns them to 512 bytes
constexpr int64_t kOutputAlignment = 256;

// What Python planned per (device, dtype, N, in, out, alignment of rows, of dy): a plan, or none (nullptr:
// cuBLASLt cannot).
struct BiasGradPlans {
  std::mutex mutex;
  PyObject* planner = nullptr;  // planner(rows, dy) -> tuple of ints, None (never) or False (not now)
  int64_t generation = 0;       // of the planner: an answer from a replaced planner is not kept
  std::unordered_map<Key, std::shared_ptr<BiasGradGemm>, KeyHash> plans;
  std::atomic<int64_t> launches{0};
};
BiasGradPlans bias_grad_plans;
constexpr size_t kMaxBiasGradPlans = 256;

// The alignment class of a pointer, as cuBLASLt's heuristic is told it: the largest power of two dividing
// it, at most 256 bytes (common.pointer_alignment in Python).
int64_t alignment_class(const void* ptr) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
  return address % 256 == 0 ? 256 : static_cast<int64_t>(address & (~address + 1));
}

// The plan in a planner's tuple of integers (see _plan_bias_grad), or nullptr if it is not one.
std::shared_ptr<BiasGradGemm> plan_from(PyObject* result) {
  if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != kBiasGradPlanInts) return nullptr;
  int64_t v[kBiasGradPlanInts];
  for (Py_ssize_t i = 0; i < kBiasGradPlanInts; ++i) {
    v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(result, i));
    if (v[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return nullptr;
    }
  }
  auto ptr = [&](int i) { return reinterpret_cast<void*>(static_cast<uintptr_t>(v[i])); };
  auto gemm = std::make_shared<BiasGradGemm>();
  gemm->matmul = reinterpret_cast<LtMatmul>(ptr(0));
  gemm->set_attribute = reinterpret_cast<LtSetAttribute>(ptr(1));
  gemm->bias_pointer_attribute = static_cast<int>(v[2]);
  gemm->handle = ptr(3);
  gemm->desc = ptr(4);
  gemm->alpha = ptr(5);
  gemm->a_layout = ptr(6);
  gemm->b_layout = ptr(7);
  gemm->beta = ptr(8);
  gemm->c_layout = ptr(9);
  gemm->d_layout = ptr(10);
  gemm->algo = ptr(11);
  gemm->workspace_bytes = v[12];
  return gemm;
}

// Ask the Python planner for this problem's plan (with the GIL); nullopt: ask again next time.
std::optional<std::shared_ptr<BiasGradGemm>> ask_planner(const at::Tensor& rows, const at::Tensor& dy) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* planner = bias_grad_plans.planner;
  PyObject* result = nullptr;
  if (planner != nullptr) {
    Py_INCREF(planner);
    PyObject* rows_py = THPVariable_Wrap(rows);
    PyObject* dy_py = THPVariable_Wrap(dy);
    if (rows_py != nullptr && dy_py != nullptr) result = PyObject_CallFunctionObjArgs(planner, rows_py, dy_py, nullptr);
    Py_XDECREF(rows_py);
    Py_XDECREF(dy_py);
    if (result == nullptr) PyErr_WriteUnraisable(planner);  // a failing planner means: no plan
    Py_DECREF(planner);
  }
  std::optional<std::shared_ptr<BiasGradGemm>> plan;  // nullopt for False: not now
  if (result != Py_False) plan = result == nullptr ? nullptr : plan_from(result);
  Py_XDECREF(result);
  PyGILState_Release(gil);
  return plan;
}

std::shared_ptr<BiasGradGemm> bias_grad_gemm(const at::Tensor& rows, const at::Tensor& dy) {
  Key key{dy.device().index(), static_cast<int64_t>(dy.scalar_type()), rows.size(0), rows.size(1), dy.size(1),
          alignment_class(rows.const_data_ptr()), alignment_class(dy.const_data_ptr())};
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(bias_grad_plans.mutex);
    if (bias_grad_plans.planner == nullptr) return nullptr;
    auto it = bias_grad_plans.plans.find(key);
    if (it != bias_grad_plans.plans.end()) return it->second;
    if (bias_grad_plans.plans.size() >= kMaxBiasGradPlans) return nullptr;
    generation = bias_grad_plans.generation;
  }
  auto plan = ask_planner(rows, dy);
  if (!plan.has_value()) return nullptr;
  std::lock_guard<std::mutex> lock(bias_grad_plans.mutex);
  if (bias_grad_plans.generation != generation) return nullptr;  // the planner was replaced meanwhile
  return bias_grad_plans.plans.emplace(std::move(key), *plan).first->second;
}

// dW (fp32, (out, in)) and db (fp32, (out,)) from one BGRADB GEMM, if this problem has a plan and its
// tensors fit it (dense half-precision rows, CUDA); false: compute them the usual way. The plan key holds
// the alignment of rows and dy, so each alignment class gets its own plan.
bool fused_bias_grad(const at::Tensor& rows, const at::Tensor& dy, at::Tensor* dw, at::Tensor* db) {
  const bool half = dy.scalar_type() == at::kHalf || dy.scalar_type() == at::kBFloat16;
  if (!dy.is_cuda() || !half || rows.scalar_type() != dy.scalar_type() || !rows.is_contiguous() ||
      !dy.is_contiguous() || rows.size(0) == 0 || rows.size(1) == 0 || dy.size(1) == 0) {
    return false;
  }
  std::shared_ptr<BiasGradGemm> gemm = bias_grad_gemm(rows, dy);
  if (gemm == nullptr || gemm->failed.load(std::memory_order_relaxed)) return false;
  c10::DeviceGuard on_device(dy.device());
  at::Tensor weight_grad = at::empty({dy.size(1), rows.size(1)}, dy.options().dtype(at::kFloat));
  at::Tensor bias_grad = at::empty({dy.size(1)}, dy.options().dtype(at::kFloat));
  if (alignment_class(weight_grad.const_data_ptr()) < kOutputAlignment ||
      alignment_class(bias_grad.const_data_ptr()) < kOutputAlignment) {
    return false;
  }
  at::Tensor workspace;
  if (gemm->workspace_bytes > 0) workspace = at::empty({gemm->workspace_bytes}, dy.options().dtype(at::kByte));
  void* stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(dy.device()).native_handle();
  int status;
  {
    std::lock_guard<std::mutex> lock(gemm->mutex);
    void* bias_pointer = bias_grad.data_ptr();
    status = gemm->set_attribute(gemm->desc, gemm->bias_pointer_attribute, &bias_pointer, sizeof bias_pointer);
    if (status == 0) {
      void* d = weight_grad.data_ptr();
      status = gemm->matmul(gemm->handle, gemm->desc, gemm->alpha, rows.const_data_ptr(), gemm->a_layout,
                            dy.const_data_ptr(), gemm->b_layout, gemm->beta, d, gemm->c_layout, d, gemm->d_layout,
                            gemm->algo, workspace.defined() ? workspace.data_ptr() : nullptr,
                            static_cast<size_t>(std::max<int64_t>(gemm->workspace_bytes, 0)), stream);
    }
  }
  if (status != 0) {  // nothing was launched: compute the gradients the unfused way, now and from now on
    gemm->failed.store(true);
    TORCH_WARN("autocast_linear fused_cast backward: cuBLASLt refused the BGRADB GEMM (cublasStatus ", status,
               ") for dy of shape ", shape_text(dy), "; computing dW and db with a GEMM and a sum instead");
    return false;
  }
  bias_grad_plans.launches.fetch_add(1, std::memory_order_relaxed);
  *dw = weight_grad;
  *db = bias_grad;
  return true;
}

// The `fused_cast` kernel of autocast_linear: y = x W^T + b computed in `dtype` (bf16 / fp16) from the
// fp32 master weight and bias, as autocast does, but as one autograd node whose backward writes each
// gradient in its input's dtype straight from the GEMM (no cast kernels) and sums the bias gradient in
// that dtype: per layer, three backward kernels where autocast's graph runs five or six; two, where
// fp32 weight and bias gradients come from one BGRADB GEMM (above).
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
    const bool bias_grad = dtypes[2] >= 0 && ctx->needs_input_grad(2);
    const bool fused = bias_grad && ctx->needs_input_grad(1) && dtypes[1] == static_cast<int64_t>(at::kFloat) &&
                       dtypes[2] == static_cast<int64_t>(at::kFloat) && fused_bias_grad(rows, dy, &dw, &db);
    if (!fused && ctx->needs_input_grad(1)) dw = product(dy.t(), rows, static_cast<at::ScalarType>(dtypes[1]));
    if (!fused && bias_grad) db = dy.sum(0, false, static_cast<at::ScalarType>(dtypes[2]));
    return {dx, dw, db, at::Tensor()};
  }
};

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
          table.epoch, table.enabled.load() ? 1 : 0, bias_grad_plans.launches.load()};
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

// set_bias_grad_planner(planner or None): who plans fused_cast's BGRADB GEMMs (None: no fusion). A new
// planner forgets every plan; the cuBLASLt objects behind them stay alive in Python for the process.
PyObject* set_bias_grad_planner(PyObject* /*module*/, PyObject* planner) {
  if (planner != Py_None && !PyCallable_Check(planner)) {
    PyErr_SetString(PyExc_TypeError, "set_bias_grad_planner: planner must be callable or None");
    return nullptr;
  }
  PyObject* old;
  {
    std::lock_guard<std::mutex> lock(bias_grad_plans.mutex);
    bias_grad_plans.plans.clear();
    ++bias_grad_plans.generation;
    old = bias_grad_plans.planner;
    bias_grad_plans.planner = planner == Py_None ? nullptr : Py_NewRef(planner);
  }
  Py_XDECREF(old);
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
