"""Autograd through the routes (CPU routing): second-order gradients, torch.func transforms, PyTorch's
backward after a routed forward, and the thread a routing scope's backward runs on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pytorch_cpu_routing import CALLS, foreign_override, policy, routed_registry
from torch.nn.attention import SDPBackend, sdpa_kernel

import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import install
from xpuruntime.pytorch.custom_ops import norm as norm_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


@pytest.fixture
def cpu_routing():
    yield from routed_registry()


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
