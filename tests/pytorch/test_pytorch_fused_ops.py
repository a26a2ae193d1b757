"""The public fused ops `xtorch.ops.fused_attention` / `fused_layernorm` (the custom ops `xpuruntime::attention`
and `xpuruntime::layer_norm`): results and gradients against PyTorch, float64 precision, autocast,
torch.compile, and clear errors for bad arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pytorch_cpu_routing import CALLS, policy, routed_registry
from torch.nn.attention import SDPBackend, sdpa_kernel

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch.custom_ops import attention as attention_ops

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


@pytest.fixture
def cpu_routing():
    yield from routed_registry()


def _attention_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(2, 3, 5, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 3, 7, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 3, 7, 4, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_matches_sdpa_forward_and_backward(causal):
    q, k, v = _attention_inputs()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    out = xtorch.ops.fused_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_fused_attention_with_mask_goes_through_the_selector():
    q, k, v = _attention_inputs()
    mask = torch.rand(5, 7) > 0.3
    mask[:, 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(xtorch.ops.fused_attention(q, k, v, attn_mask=mask), ref, rtol=1e-5, atol=1e-5)
    xrt.enable_dispatch_logging()
    xtorch.ops.fused_attention(q, k, v, attn_mask=mask)
    training = "attention_forward" in xrt.default_registry().ops
    assert [r.op_name for r in xrt.get_dispatch_logs()] == ["attention_forward" if training else "attention"]


def test_fused_attention_rejects_dropout():
    q, k, v = _attention_inputs()
    with pytest.raises(xrt.ArgumentError, match="dropout_p"):
        xtorch.ops.fused_attention(q, k, v, dropout_p=0.1)


def test_fused_layernorm_matches_layer_norm():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 10, requires_grad=True)
    w, b = torch.randn(10, requires_grad=True), torch.randn(10, requires_grad=True)
    ref = F.layer_norm(x, (10,), w, b, 1e-5)
    dy = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (x, w, b), dy)
    out = xtorch.ops.fused_layernorm(x, 10, w, b)
    grads = torch.autograd.grad(out, (x, w, b), dy)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    x2 = torch.randn(5, 6, requires_grad=True)
    (g2,) = torch.autograd.grad(xtorch.ops.fused_layernorm(x2, [6]).sum(), (x2,))
    torch.testing.assert_close(g2, torch.autograd.grad(F.layer_norm(x2, (6,)).sum(), (x2,))[0], atol=1e-5, rtol=1e-4)


def test_custom_ops_compile_fullgraph():
    torch._dynamo.reset()

    def block(x, w, b, q, k, v):
        y = xtorch.ops.fused_layernorm(x, [x.shape[-1]], w, b)
        return y.sum() + xtorch.ops.fused_attention(q, k, v, is_causal=True).sum()

    q, k, v = _attention_inputs()
    x = torch.randn(4, 8, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = compiled(x, w, b, q, k, v)
    expected = block(x, w, b, q, k, v)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got, (x, q))
    ref = torch.autograd.grad(expected, (x, q))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_custom_ops_under_autocast_take_the_autocast_dtype():
    q, k, v = _attention_inputs()
    with xtorch.autocast(dtype=torch.bfloat16, device_type="cpu"):
        out = xtorch.ops.fused_attention(q, k, v)
        y = xtorch.ops.fused_layernorm(torch.randn(3, 8), 8)
    assert out.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32


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


# -- bad arguments get a clear error naming the argument (issue 26 item 13) ----------------------------------


@pytest.mark.parametrize(
    ("shapes", "argument"),
    [(((8,), (8,), (8,)), "query"), (((2, 5, 8), (7,), (7, 4)), "key"), (((2, 5, 8), (2, 7, 8), (2, 6, 4)), "value")],
)
def test_fused_attention_names_a_tensor_of_the_wrong_shape(shapes, argument):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(xrt.ShapeError, match=f"fused_attention: argument '{argument}'"):
        xtorch.ops.fused_attention(q, k, v)


def test_fused_attention_with_fewer_key_value_heads_asks_for_enable_gqa():
    q, k, v = torch.randn(2, 8, 5, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4)
    with pytest.raises(xrt.ShapeError, match="enable_gqa=True"):
        xtorch.ops.fused_attention(q, k, v)
    with pytest.raises(xrt.ShapeError, match="dividing the 8 of 'query'"):
        xtorch.ops.fused_attention(q, torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 4), enable_gqa=True)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_grouped_query_matches_sdpa_forward_and_backward(causal):
    torch.manual_seed(11)
    q = torch.randn(2, 8, 5, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 7, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    out = xtorch.ops.fused_attention(q, k, v, is_causal=causal, enable_gqa=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("normalized_shape", "kwargs", "error", "argument"),
    [
        (8.0, {}, xrt.ArgumentError, "normalized_shape"),
        ("16", {}, xrt.ArgumentError, "normalized_shape"),
        ([True], {}, xrt.ArgumentError, "normalized_shape"),
        ((4, 16), {}, xrt.ShapeError, "input"),
        (16, {"eps": 10**400}, xrt.ArgumentError, "eps"),
        (16, {"eps": -1.0}, xrt.ArgumentError, "eps"),
        (16, {"eps": "1e-5"}, xrt.ArgumentError, "eps"),
        (16, {"weight": torch.randn(8)}, xrt.ShapeError, "weight"),
    ],
)
def test_fused_layernorm_names_a_bad_argument(normalized_shape, kwargs, error, argument):
    with pytest.raises(error, match=f"fused_layernorm: argument '{argument}'"):
        xtorch.ops.fused_layernorm(torch.randn(3, 16), normalized_shape, **kwargs)


@pytest.mark.parametrize("warmup_iters", [-1, "3", True, 2.0, None])
def test_cuda_graph_wrapper_checks_its_warm_up_count(warmup_iters):
    with pytest.raises(xrt.ArgumentError, match="CUDAGraphWrapper: argument 'warmup_iters' expected an int >= 0"):
        xtorch.CUDAGraphWrapper(warmup_iters=warmup_iters)
    assert xtorch.CUDAGraphWrapper(warmup_iters=0).warmup_iters == 0
