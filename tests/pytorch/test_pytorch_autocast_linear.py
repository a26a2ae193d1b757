"""autocast_linear: nn.Linear under autocast as one C++ autograd node (`fused_cast`) whose backward writes
each gradient in its input's dtype straight from the GEMM; and the Autocast-key override that routes it."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_cpu_routing import CALLS, routed_registry

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import native as native_routes
from xpuruntime.registry import Backend, kernel

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:torch"),
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler: the native routes cannot build"
    ),
]


@pytest.fixture(scope="module")
def ops():
    assert native_routes.load() is not None, native_routes.status()
    return torch.ops.xpuruntime_native


def _grads(y: torch.Tensor, dy: torch.Tensor, *inputs: torch.Tensor) -> list[torch.Tensor | None]:
    for t in inputs:
        t.grad = None
    y.backward(dy)
    return [t.grad for t in inputs]


def _case(seed: int, shape: tuple[int, ...], n: int, bias: bool, transposed: bool):
    g = torch.Generator().manual_seed(seed)
    k = shape[-1]
    x = torch.randn(*shape[:-1], k, generator=g)
    if transposed:  # a non-contiguous x: the transpose of a contiguous tensor
        x = torch.randn(k, *shape[:-1], generator=g).movedim(0, -1)
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g) if bias else None
    dy = torch.randn(*shape[:-1], n, generator=g)
    return [t if t is None else t.requires_grad_() for t in (x, w, b)], dy


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16), lead=st.lists(st.integers(1, 7), min_size=1, max_size=3), k=st.integers(1, 40),
    n=st.integers(1, 33), bias=st.booleans(), transposed=st.booleans(),
)  # fmt: skip
def test_fused_cast_matches_float64_forward_and_backward(ops, seed, lead, k, n, bias, transposed):
    (x, w, b), dy = _case(seed, (*lead, k), n, bias, transposed)
    y = ops.fused_cast_linear(x, w, b, torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.shape == (*lead, n)
    got = _grads(y, dy.bfloat16(), *(t for t in (x, w, b) if t is not None))
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    y64 = torch.nn.functional.linear(x64, w64, b64)
    want = _grads(y64, dy.bfloat16().double(), *(t for t in (x64, w64, b64) if t is not None))
    scale = max(1.0, k**0.5)
    np.testing.assert_allclose(y.double().detach(), y64.detach(), rtol=3e-2, atol=3e-2 * scale)
    for g, ref, t in zip(got, want, (x, w, b)):
        assert g.dtype == t.dtype == torch.float32  # each gradient in its input's dtype, no cast node
        np.testing.assert_allclose(g.double(), ref, rtol=3e-2, atol=3e-2 * max(scale, lead[0] ** 0.5 * 2))


def test_fused_cast_gradcheck_in_float64(ops):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(4, 5, dtype=torch.float64, generator=g).requires_grad_()
    b = torch.randn(4, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda *t: ops.fused_cast_linear(*t, torch.float64), (x, w, b))
    assert torch.autograd.gradcheck(lambda *t: ops.fused_cast_linear(*t, None, torch.float64), (x, w))


def test_fused_cast_only_computes_the_gradients_asked_for(ops):
    x = torch.randn(6, 8)  # no grad: a frozen input
    w = torch.randn(3, 8, requires_grad=True)
    b = torch.randn(3)  # a frozen bias
    ops.fused_cast_linear(x, w, b, torch.bfloat16).float().sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32 and x.grad is None and b.grad is None
    np.testing.assert_allclose(w.grad, torch.ones(6, 3).t() @ x.bfloat16().float(), rtol=1e-2, atol=1e-2)


def test_fused_cast_names_bad_arguments(ops):
    with pytest.raises((RuntimeError, ValueError), match=r"fused_cast_linear: 'weight' must be 2-d"):
        ops.fused_cast_linear(torch.randn(2, 3), torch.randn(3), None, torch.bfloat16)
    with pytest.raises(
        (RuntimeError, ValueError), match=r"fused_cast_linear: .x. must end in in_features 3, has shape \(2, 4\)"
    ):
        ops.fused_cast_linear(torch.randn(2, 4), torch.randn(5, 3), None, torch.bfloat16)


def _fused_cast_stand_in(args) -> None:
    """A CPU stand-in for the torch backend's fused_cast kernel (CPU tensors reach kernels as NumPy views):
    the Python route's first call runs it; what the route learns from its plan is the real C++ node."""
    CALLS["fused_cast"] += 1
    x, w, b = (None if t is None else np.asarray(t, np.float32) for t in args.inputs)
    args.out[...] = x @ w.T + (0 if b is None else b)


@pytest.fixture
def cpu_routing():
    assert native_routes.load() is not None, native_routes.status()
    for registry in routed_registry():
        registry.register_backend(
            Backend("torch", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype))
        )
        registry.register_kernel(
            kernel("autocast_linear", "fused_cast", backend="torch", dtypes={"float32"})(_fused_cast_stand_in)
        )
        yield registry


def _linear_under_autocast(lin: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.float16):  # NumPy has float16, not bfloat16
        return lin(x)


def test_the_override_is_installed_only_while_the_policy_names_the_op(cpu_routing):
    assert "autocast_linear" not in xtorch.installed_overrides()
    xtorch.set_kernel_policy(xrt.KernelPolicy({"autocast_linear": "fused_cast"}, validate=cpu_routing))
    assert xtorch.installed_overrides()["autocast_linear"] == ["linear@AutocastCPU"]
    dump = torch._C._dispatch_dump("aten::linear")
    assert any(
        line.startswith("AutocastCPU: registered at") and "native_routes.cpp" in line for line in dump.splitlines()
    )
    xtorch.clear_kernel_policy()
    assert xtorch.installed_overrides() == {}
    dump = torch._C._dispatch_dump("aten::linear")
    assert not any("native_routes.cpp" in line for line in dump.splitlines())


def test_a_signature_routed_to_fused_cast_runs_the_cpp_node_from_then_on(cpu_routing):
    lin = torch.nn.Linear(16, 12)
    x = torch.randn(3, 5, 16, requires_grad=True)
    dy = torch.randn(3, 5, 12).half()
    expected = _linear_under_autocast(lin, x)  # no policy: autocast's own casts and graph
    want = _grads(expected, dy, x, lin.weight, lin.bias)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"autocast_linear": "fused_cast"}, validate=cpu_routing))
    first = _linear_under_autocast(lin, x)  # a new signature: the Python route, through the dispatcher
    assert CALLS["fused_cast"] == 1
    np.testing.assert_allclose(first.float().detach(), expected.float().detach(), rtol=1e-2, atol=1e-2)
    before = native_routes.stats()
    y = _linear_under_autocast(lin, x)
    assert CALLS["fused_cast"] == 1  # learned from the first call's plan: the C++ node, no Python
    assert native_routes.stats()["native_calls"] == before["native_calls"] + 1
    assert native_routes.stats()["routed_calls"] == before["routed_calls"]
    assert "FusedCastLinear" in y.grad_fn.name()  # one node: no cast, view or addmm nodes
    assert y.dtype == torch.float16 and torch.equal(y, expected)
    got = _grads(y, dy, x, lin.weight, lin.bias)
    for g, ref in zip(got, want):
        assert g.dtype == torch.float32
        np.testing.assert_allclose(g, ref, rtol=1e-2, atol=1e-2)
    with torch.no_grad():  # no graph without grad mode
        assert _linear_under_autocast(lin, x).grad_fn is None
    with torch.inference_mode():
        assert torch.equal(_linear_under_autocast(lin, x.detach()), expected)


def test_a_signature_learned_as_pytorch_runs_autocast_itself(cpu_routing):
    xtorch.set_kernel_policy(xrt.KernelPolicy({"autocast_linear": "fused_cast"}, validate=cpu_routing))
    lin, x = torch.nn.Linear(8, 4, bias=False), torch.randn(6, 8).half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stand-in takes no float16 x: PyTorch's kernel, with a warning
        first = _linear_under_autocast(lin, x)
    before = native_routes.stats()
    again = _linear_under_autocast(lin, x)
    assert native_routes.stats()["native_calls"] == before["native_calls"] + 1  # learned: no Python any more
    assert torch.equal(first, again) and again.dtype == torch.float16
    torch.testing.assert_close(again.float(), x.half().float() @ lin.weight.half().float().t(), rtol=1e-2, atol=1e-2)


def test_outside_autocast_linear_is_untouched(cpu_routing):
    xtorch.set_kernel_policy(xrt.KernelPolicy({"autocast_linear": "fused_cast"}, validate=cpu_routing))
    lin, x = torch.nn.Linear(8, 4), torch.randn(6, 8)
    before = native_routes.stats()
    y = lin(x)
    assert y.dtype == torch.float32 and native_routes.stats() == before
    torch.testing.assert_close(y, x @ lin.weight.t() + lin.bias)


def test_the_schema_checks_the_compute_dtype():
    spec = xrt.TensorSpec((4, 8), "float32", device="cuda")
    w = xrt.TensorSpec((3, 8), "float32", device="cuda")
    with pytest.raises(xrt.ArgumentError, match=r"autocast_linear.*'dtype'.*'float16' or 'bfloat16'"):
        xrt.explain("autocast_linear", spec, w, dtype="float32", show=False)
    report = xrt.explain("autocast_linear", spec, w, dtype="bfloat16", show=False)
    assert {c.kernel.name for c in report.candidates} >= {"torch", "fused_cast"}


# -- on the GPU: the real fused_cast kernel through the dispatcher ---------------------------------------


def _gpt_block_linears(seed: int = 0):
    torch.manual_seed(seed)
    layers = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.GELU(), torch.nn.Linear(3072, 768)).cuda()
    x = torch.randn(4, 256, 768, device="cuda", requires_grad=True)
    return layers, x


def _step_grads(layers, x, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with xtorch.autocast(dtype=dtype):
        y = layers(x)
    params = [x, *layers.parameters()]
    return y, list(torch.autograd.grad(y.float().square().mean(), params))


@pytest.mark.gpu
def test_fused_cast_on_cuda_matches_autocast_logs_and_learns():
    layers, x = _gpt_block_linears()
    ref, ref_grads = _step_grads(layers, x)
    x64 = x.detach().double().requires_grad_()
    layers64 = torch.nn.Sequential(*(m.double() if hasattr(m, "weight") else m for m in _gpt_block_linears()[0]))
    exact_grads = torch.autograd.grad(layers64(x64).square().mean(), [x64, *layers64.parameters()])
    xtorch.set_kernel_policy(autocast_linear="fused_cast")
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    try:
        out, grads = _step_grads(layers, x)  # logged: every call through the Python route
    finally:
        xrt.disable_dispatch_logging()
    records = [r for r in xrt.get_dispatch_logs() if r.op_name == "autocast_linear"]
    assert len(records) == 2 and {(r.selected_kernel, r.reason) for r in records} == {("fused_cast", "policy")}
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # the same casts and the same GEMM as autocast
    for g, r, e in zip(grads, ref_grads, exact_grads):
        assert g.dtype == torch.float32
        err, ref_err = (g.double() - e).norm() / e.norm(), (r.double() - e).norm() / e.norm()
        assert err <= ref_err * 1.05 + 1e-6, (err, ref_err)  # no less exact than autocast's bf16 gradients
    _step_grads(layers, x)  # nothing is learned while logging: this call learns, through Python
    before = native_routes.stats()
    again, again_grads = _step_grads(layers, x)  # learned: the C++ node, no Python
    after = native_routes.stats()
    assert after["native_calls"] - before["native_calls"] == 2 and after["routed_calls"] == before["routed_calls"]
    assert "FusedCastLinear" in again.grad_fn.name()
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    for g, r in zip(again_grads, grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


@pytest.mark.gpu
def test_fused_cast_is_captured_in_a_cuda_graph_and_replays_like_eager():
    layers, x = _gpt_block_linears(1)
    xtorch.set_kernel_policy(autocast_linear="fused_cast")
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    static_x = x.detach().clone()

    def step() -> torch.Tensor:
        opt.zero_grad()
        with xtorch.autocast(dtype=torch.bfloat16, cache_enabled=False):
            loss = layers(static_x).float().square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    eager_layers = [p.detach().clone() for p in layers.parameters()]
    graph = xtorch.CUDAGraphWrapper(warmup_iters=2)
    native_routes.fuse_bias_grad(True)  # forgets the C++ plans: the warm-up asks again, not the capture
    before = native_routes.stats()["fused_bias_grads"]
    loss = graph.capture(step)
    assert native_routes.stats()["fused_bias_grads"] - before == 3 * 2  # warm-up twice, the capture: 2 linears
    captured_start = [p.detach().clone() for p in layers.parameters()]
    graph.replay()
    torch.cuda.synchronize()
    replayed = [p.detach().clone() for p in layers.parameters()]
    with torch.no_grad():
        for p, v in zip(layers.parameters(), captured_start):
            p.copy_(v)
    eager_loss = step()
    for p, r in zip(layers.parameters(), replayed):
        torch.testing.assert_close(p, r, rtol=0, atol=0)
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=0)
    assert any(not torch.equal(a, b) for a, b in zip(eager_layers, replayed))


def test_float64_stays_float64_as_under_autocast(cpu_routing):
    """Autocast leaves float64 tensors uncast; so does the override (the fused node never sees them)."""
    xtorch.set_kernel_policy(xrt.KernelPolicy({"autocast_linear": "fused_cast"}, validate=cpu_routing))
    lin, x = torch.nn.Linear(8, 4).double(), torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    for _ in range(2):  # the Python route, then whatever the native one learned
        y = _linear_under_autocast(lin, x)
        assert y.dtype == torch.float64 and "FusedCastLinear" not in y.grad_fn.name()
        torch.testing.assert_close(y, x @ lin.weight.t() + lin.bias, rtol=1e-12, atol=1e-12)
    assert CALLS["fused_cast"] == 0


def _learned_fused(cpu_routing, lin: torch.nn.Module, x: torch.Tensor) -> None:
    xtorch.set_kernel_policy(xrt.KernelPolicy({"autocast_linear": "fused_cast"}, validate=cpu_routing))
    _linear_under_autocast(lin, x)  # the Python route learns: the C++ node from now on


def test_the_output_may_be_modified_in_place(cpu_routing):
    """Found in review: a view made inside the node refused in-place ops (nn.ReLU(inplace=True), out += x)."""
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    _learned_fused(cpu_routing, lin, x)
    y = _linear_under_autocast(torch.nn.Sequential(lin, torch.nn.ReLU(inplace=True)), x)
    assert "FusedCastLinear" in y.grad_fn.next_functions[0][0].name()
    y.float().sum().backward()
    assert (y >= 0).all() and x.grad is not None and lin.weight.grad.dtype == torch.float32


def test_double_backward_raises_instead_of_a_wrong_gradient(ops):
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(4, 8, requires_grad=True)
    y = ops.fused_cast_linear(x, w, None, torch.bfloat16)
    with pytest.raises(RuntimeError, match="fused_cast kernel has no double backward"):
        torch.autograd.grad(y.float().square().sum(), w, create_graph=True)


def test_nested_and_forward_ad_inputs_take_autocasts_own_path(cpu_routing):
    lin = torch.nn.Linear(8, 4)
    _learned_fused(cpu_routing, lin, torch.randn(3, 8))
    nested = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    out = _linear_under_autocast(lin, nested)
    assert out.is_nested and out.dtype == torch.float16
    import torch.autograd.forward_ad as fwAD

    x, tangent = torch.randn(3, 8), torch.randn(3, 8)
    with fwAD.dual_level():
        y = _linear_under_autocast(lin, fwAD.make_dual(x, tangent))
        jvp = fwAD.unpack_dual(y).tangent
    torch.testing.assert_close(
        jvp.float(), tangent.half().float() @ lin.weight.half().float().t(), rtol=1e-2, atol=1e-2
    )


@pytest.mark.gpu
def test_fused_cast_on_cuda_takes_inputs_of_another_half_dtype():
    """Found in review: CUDA's mm(out_dtype) takes only fp16/bf16 -> fp32, so an fp16 x under bf16
    autocast (a .half() submodule's output) needs the cast after the product."""
    lin = torch.nn.Linear(64, 32, device="cuda").half()
    x = torch.randn(16, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    xtorch.set_kernel_policy(autocast_linear="fused_cast")
    for _ in range(3):  # the Python route, then the learned C++ node
        with xtorch.autocast(dtype=torch.bfloat16):
            y = lin(x)
        grads = torch.autograd.grad(y.float().sum(), (x, lin.weight, lin.bias))
    assert "FusedCastLinear" in y.grad_fn.name() and y.dtype == torch.bfloat16
    assert [g.dtype for g in grads] == [torch.float16] * 3
    ones = torch.ones(16, 32, device="cuda")
    torch.testing.assert_close(grads[0].float(), ones @ lin.weight.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grads[2].float(), ones.sum(0), rtol=1e-3, atol=1e-3)


# -- dW and db from one cuBLASLt BGRADB GEMM ------------------------------------------------------------


class _SpyPlanner:
    """Stands in for native_routes' planner: records each question, answers `answer`."""

    def __init__(self, answer) -> None:
        self.answer, self.asked = answer, []

    def __call__(self, rows: torch.Tensor, dy: torch.Tensor):
        self.asked.append((tuple(rows.shape), tuple(dy.shape), rows.dtype))
        return self.answer


@pytest.fixture
def spy_planner(ops):
    from xpuruntime.runtime import extension

    def install(answer) -> _SpyPlanner:
        spy = _SpyPlanner(answer)
        extension.load().set_bias_grad_planner(spy)
        return spy

    yield install
    native_routes.fuse_bias_grad(True)


def test_the_planner_must_be_callable(ops):
    from xpuruntime.runtime import extension

    with pytest.raises(TypeError, match="planner must be callable or None"):
        extension.load().set_bias_grad_planner(3)


def test_cpu_backward_never_asks_for_a_cublaslt_plan(ops, spy_planner):
    spy = spy_planner(None)
    (x, w, b), dy = _case(3, (5, 12), 7, bias=True, transposed=False)
    before = native_routes.stats()["fused_bias_grads"]
    grads = _grads(ops.fused_cast_linear(x, w, b, torch.bfloat16), dy.bfloat16(), x, w, b)
    assert spy.asked == [] and native_routes.stats()["fused_bias_grads"] == before
    torch.testing.assert_close(grads[2], dy.sum(0), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bgradb_gives_the_weight_and_bias_gradients_of_the_unfused_backward(dtype):
    layers, x = _gpt_block_linears(2)
    xtorch.set_kernel_policy(autocast_linear="fused_cast")
    try:
        native_routes.fuse_bias_grad(False)
        _, unfused = _step_grads(layers, x, dtype)
        native_routes.fuse_bias_grad(True)  # C++ forgets its plans and asks again; Python hands back its own
        before = native_routes.stats()["fused_bias_grads"]
        for _ in range(2):
            _, fused = _step_grads(layers, x, dtype)
        assert native_routes.stats()["fused_bias_grads"] - before == 4  # two biased fp32 linears, two steps
    finally:
        native_routes.fuse_bias_grad(True)
    for g, r in zip(fused, unfused):
        assert g.dtype == r.dtype == torch.float32 and g.shape == r.shape
        assert ((g - r).norm() / r.norm()).item() < 1e-5  # fp32 sums of the same half products, another order
    bias_grads = [g for g, p in zip(fused[1:], layers.parameters()) if p.dim() == 1]
    assert len(bias_grads) == 2 and all(g.abs().sum() > 0 for g in bias_grads)


@pytest.mark.gpu
def test_bgradb_falls_back_for_a_less_aligned_or_strided_gradient():
    torch.manual_seed(4)
    lin = torch.nn.Linear(24, 40, device="cuda")
    base = torch.randn(65, 24, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(64, 40, device="cuda")
    xtorch.set_kernel_policy(autocast_linear="fused_cast")

    def grads(x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
        x = x.requires_grad_()
        with xtorch.autocast(dtype=torch.bfloat16):
            y = lin(x)
        return list(torch.autograd.grad(y, (x, lin.weight, lin.bias), dy))

    for _ in range(3):  # the Python route, then the learned C++ node: planned on a 512-byte aligned x
        grads(base[:64].detach().clone(), r.bfloat16())
    launches = native_routes.stats()["fused_bias_grads"]
    offset_x = base[1:].detach()  # 48 bytes into its storage: only 16-byte aligned, so a plan of its own
    transposed_dy = r.t().contiguous().bfloat16().t()  # strided: GEMM + sum
    cases = ((offset_x, r.bfloat16(), 1), (base[:64].clone(), transposed_dy, 0), (base[:64].clone(), r.bfloat16(), 1))
    for x, dy, fused in cases:
        got = grads(x, dy)
        assert native_routes.stats()["fused_bias_grads"] - launches == fused
        launches += fused
        dy64, x64, w64 = dy.double(), x.detach().double(), lin.weight.detach().bfloat16().double()
        for g, e in zip(got, (dy64 @ w64, dy64.t() @ x64, dy64.sum(0))):
            torch.testing.assert_close(g.double(), e, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_the_planner_is_asked_again_only_while_it_answers_not_now(spy_planner):
    lin = torch.nn.Linear(32, 48, device="cuda")
    x = torch.randn(8, 32, device="cuda", requires_grad=True)
    xtorch.set_kernel_policy(autocast_linear="fused_cast")

    def backward() -> None:
        with xtorch.autocast(dtype=torch.bfloat16):
            y = lin(x)
        y.float().square().sum().backward()

    later = spy_planner(False)  # "not now": e.g. a CUDA graph is being captured
    backward()
    backward()
    assert later.asked == [((8, 32), (8, 48), torch.bfloat16)] * 2
    never = spy_planner(None)  # cuBLASLt cannot: remembered
    for _ in range(3):
        backward()
    assert len(never.asked) == 1
