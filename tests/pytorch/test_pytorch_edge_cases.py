"""PyTorch front-end edge cases: scope failures that left overrides behind, second-order gradients,
torch.func transforms, the PyTorch backward of norms in every dtype, and the custom ops' edges."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pytorch_cpu_routing import CALLS, foreign_override, policy, routed_registry
from torch.nn.attention import SDPBackend, sdpa_kernel

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import install
from xpuruntime.pytorch.custom_ops import attention as attention_ops
from xpuruntime.pytorch.custom_ops import norm as norm_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


@pytest.fixture
def cpu_routing():
    yield from routed_registry()


def test_a_scope_refused_for_a_foreign_override_leaves_nothing_behind(cpu_routing):
    with (
        foreign_override("bmm"),
        pytest.raises(install.OverrideConflictError, match="aten::bmm"),
        xtorch.kernel_policy(policy("matmul", registry=cpu_routing)),
    ):
        pytest.fail("the block must not run")
    assert not install.STATE.install.scoped
    xtorch.set_kernel_policy(policy("layer_norm", registry=cpu_routing))
    assert set(xtorch.installed_overrides()) == {"layer_norm"}  # not the refused scope's matmul too
    xtorch.clear_kernel_policy()
    assert xtorch.installed_overrides() == {}


def _second_order(fn, inputs: tuple) -> tuple:
    """Gradients of a gradient penalty (create_graph=True), plus a term that needs grads anyway."""
    out = fn(*inputs)
    (g,) = torch.autograd.grad((out * out.detach().sin()).sum(), inputs[0], create_graph=True)
    return torch.autograd.grad(g.square().sum() + sum(t.sum() for t in inputs), inputs)


_NORM_CASES = {
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (7,), w, b), True),
    "rms_norm": (lambda x, w: F.rms_norm(x, (7,), w, 1e-5), False),
}


@pytest.mark.parametrize("op", sorted(_NORM_CASES))
def test_second_order_gradients_through_routed_norms(cpu_routing, op):
    fn, has_bias = _NORM_CASES[op]
    torch.manual_seed(3)
    x = torch.randn(5, 3, 7, dtype=torch.float64).transpose(0, 1).requires_grad_()  # non-contiguous
    params = [torch.randn(7, dtype=torch.float64, requires_grad=True) for _ in range(2 if has_bias else 1)]
    ref = _second_order(fn, (x, *params))
    xtorch.set_kernel_policy(policy(op, registry=cpu_routing))
    got = _second_order(fn, (x, *params))
    assert CALLS[op] == 1
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)
    first = torch.autograd.grad(fn(x, *params).pow(3).sum(), x)[0]  # first order still routed
    assert CALLS[op] == 2 and (op != "layer_norm" or CALLS["layer_norm_backward"] == 1)
    xtorch.clear_kernel_policy()
    torch.testing.assert_close(first, torch.autograd.grad(fn(x, *params).pow(3).sum(), x)[0])


def test_second_order_gradients_through_routed_attention(cpu_routing):
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):  # PyTorch's own backward is differentiable only there
        ref = _second_order(fn, (q, k, v))
        xtorch.set_kernel_policy(policy("attention", registry=cpu_routing))
        got = _second_order(fn, (q, k, v))
    assert CALLS["attention_forward"] + CALLS["attention"] == 1
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "attention"])
def test_torch_func_transforms_keep_pytorchs_path(cpu_routing, op):
    torch.manual_seed(5)
    x, w = torch.randn(4, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    q = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    fns = {
        "layer_norm": (lambda t: F.layer_norm(t, (6,), w).pow(3).sum(), x),
        "rms_norm": (lambda t: F.rms_norm(t, (6,), w).pow(3).sum(), x),
        "attention": (lambda t: F.scaled_dot_product_attention(t, t, t).pow(3).sum(), q),
    }
    fn, inp = fns[op]
    ref = torch.func.grad(fn)(inp)
    xtorch.set_kernel_policy(policy(op, registry=cpu_routing))
    torch.testing.assert_close(torch.func.grad(fn)(inp), ref)
    fn(inp)  # outside a transform the policy still routes
    assert CALLS[op] + CALLS["attention_forward"] == 1


def test_layer_norm_backward_by_pytorch_after_a_routed_forward_keeps_float64(cpu_routing, monkeypatch):
    """A routed forward returns no stats; PyTorch's backward then needs them in the input's precision."""
    torch.manual_seed(6)
    x = (torch.randn(6, 9, dtype=torch.float64) * 1e-3 + 50).requires_grad_()
    w, b = torch.randn(9, dtype=torch.float64, requires_grad=True), torch.randn(9, dtype=torch.float64)
    dy = torch.randn(6, 9, dtype=torch.float64)
    ref = torch.autograd.grad(F.layer_norm(x, (9,), w, b), (x, w), dy)
    monkeypatch.setattr(norm_ops, "backward_route", lambda *a: None)  # no backward op registered
    xtorch.set_kernel_policy(policy("layer_norm", registry=cpu_routing))
    got = torch.autograd.grad(F.layer_norm(x, (9,), w, b), (x, w), dy)
    assert CALLS["layer_norm"] == 1
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_fused_layernorm_backward_in_pytorch_on_cpu(dtype):
    torch.manual_seed(7)
    x = torch.randn(5, 2, 11, dtype=dtype).transpose(0, 1).requires_grad_()
    w, b = (torch.randn(11, dtype=dtype, requires_grad=True) for _ in range(2))
    dy = torch.randn(2, 5, 11, dtype=dtype)
    ref = torch.autograd.grad(F.layer_norm(x, (11,), w, b), (x, w, b), dy)
    with xtorch.kernel_policy(xrt.KernelPolicy({"layer_norm": "torch"}, validate=False)):  # PyTorch's kernels
        got = torch.autograd.grad(xtorch.ops.fused_layernorm(x, 11, w, b), (x, w, b), dy)
    got_auto = torch.autograd.grad(xtorch.ops.fused_layernorm(x, 11, w, b), (x, w, b), dy)  # bf16: no CPU kernel
    for g, ga, r in zip(got, got_auto, ref):
        assert g.dtype == ga.dtype == dtype
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-9
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)
        torch.testing.assert_close(ga, r, rtol=tol, atol=tol)


def test_fused_attention_refuses_a_mask_that_requires_grad():
    torch.manual_seed(8)
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    bias = torch.randn(5, 5, requires_grad=True)  # a learned additive bias: its gradient would be lost
    with pytest.raises(xrt.ArgumentError, match="attn_mask"):
        xtorch.ops.fused_attention(q, k, v, attn_mask=bias)
    with torch.no_grad():
        out = xtorch.ops.fused_attention(q, k, v, attn_mask=bias)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    out = xtorch.ops.fused_attention(q, k, v, attn_mask=bias.detach())
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach()))


def test_custom_ops_under_autocast_leave_float64_alone_as_pytorch_does():
    torch.manual_seed(9)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.scaled_dot_product_attention(q, k, v)
        out = xtorch.ops.fused_attention(q, k, v)
        y = xtorch.ops.fused_layernorm(x, 6)
        mixed = xtorch.ops.fused_layernorm(x.float(), 6)
    assert ref.dtype == out.dtype == y.dtype == torch.float64 and mixed.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(y, F.layer_norm(x, (6,)), rtol=1e-9, atol=1e-9)


def test_a_routing_scope_runs_its_backward_on_this_thread(cpu_routing):
    """Autograd's device threads cannot see this thread's scope: inside one that routes, backward runs here."""
    assert torch._C._is_multithreading_enabled()
    with xtorch.kernel_policy(math_mode="fp32"):  # routes nothing: autograd left alone
        assert torch._C._is_multithreading_enabled()
        with xtorch.kernel_policy(policy("matmul", registry=cpu_routing)):
            assert not torch._C._is_multithreading_enabled()
            with xtorch.kernel_policy(math_mode="fp32"):  # layered over a routing scope: routes too
                assert not torch._C._is_multithreading_enabled()
            assert not torch._C._is_multithreading_enabled()
        assert torch._C._is_multithreading_enabled()
    assert torch._C._is_multithreading_enabled()


def test_a_refused_scope_leaves_autograd_threading_as_it_was(cpu_routing):
    with foreign_override("bmm"), xtorch.kernel_policy(policy("layer_norm", registry=cpu_routing)):
        with (
            pytest.raises(install.OverrideConflictError),
            xtorch.kernel_policy(policy("matmul", registry=cpu_routing)),
        ):
            pytest.fail("the block must not run")
        assert not torch._C._is_multithreading_enabled()  # the outer scope's setting, still in force
    assert torch._C._is_multithreading_enabled()


def _causal_reference(q, k, v):
    """float64 SDPA (PyTorch's math backend) and its logsumexp, with q, k, v as float64 leaves."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
    scores = (qd @ kd.transpose(-1, -2)) / q.shape[-1] ** 0.5
    lse = torch.logsumexp(scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")), -1)
    return out, lse.detach(), (qd, kd, vd)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_attention_keeps_a_float64_logsumexp_for_float64_inputs(cpu_routing, dtype):
    """The custom op's lse buffer (attention_forward) and its fake agree on the dtype: float64 for float64
    inputs, so a backward's P = exp(S - lse) keeps float64 precision."""
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=dtype) for _ in range(3))
    xtorch.set_kernel_policy(policy("attention", registry=cpu_routing))
    _, lse = torch.ops.xpuruntime.attention(q, k, v, None, True, None, False)
    assert CALLS["attention_forward"] == 1
    want = torch.float64 if dtype == torch.float64 else torch.float32
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.xpuruntime.attention(*(mode.from_tensor(t) for t in (q, k, v)), None, True, None, False)
    assert lse.dtype == fake[1].dtype == want
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(lse.double(), _causal_reference(q, k, v)[1], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_attention_fallback_math_is_float64_for_float64_inputs(dtype):
    """PyTorch's path of the custom op: its logsumexp and gradients in float64 for float64 inputs."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=dtype) for _ in range(3))
    dout = torch.randn(2, 3, 5, 4, dtype=dtype)
    out, lse, leaves = _causal_reference(q, k, v)
    want = torch.autograd.grad(out, leaves, dout.double())
    got_lse = attention_ops.logsumexp(q, k, None, True, None)
    got = attention_ops.math_grads(dout, q, k, v, out.detach().to(dtype), None, True, None)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert got_lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(got_lse.double(), lse, rtol=tol, atol=tol)
    for g, r in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), r, rtol=tol * 10, atol=tol * 10)
