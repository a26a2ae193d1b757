"""xpuruntime.pytorch on a CUDA device: the policy's kernels in forward and backward, fallbacks,
strict errors, CUDA graphs, the allocator pool and the profiler."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch

pytestmark = pytest.mark.gpu


def _kernels(op: str) -> set[str]:
    return {r.selected_kernel for r in xrt.get_dispatch_logs() if r.op_name == op}


def _skip_unless(op: str, kernel: str) -> None:
    spec = xrt.default_registry().kernels.get(op, {}).get(kernel)
    if spec is None:
        pytest.skip(f"kernel {op}/{kernel} is not registered here")
    reason = xrt.default_registry().backends[spec.backend].unavailable_reason
    if reason is not None:  # e.g. nvmath-python not installed on this GPU machine
        pytest.skip(f"kernel {op}/{kernel}: backend {spec.backend!r} unavailable: {reason}")


@pytest.fixture(autouse=True)
def _clean():
    xrt.enable_dispatch_logging()
    yield
    xtorch.clear_kernel_policy()


def test_linear_forward_and_backward_use_cublaslt():
    _skip_unless("matmul", "cublasLt")
    torch.manual_seed(0)
    lin = torch.nn.Linear(2048, 2048, device="cuda", dtype=torch.bfloat16)  # big enough for cuBLASLt's host cost
    x = torch.randn(8, 512, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ref = lin(x)
    ref_grads = torch.autograd.grad(ref.float().square().mean(), (x, lin.weight, lin.bias))
    xtorch.set_kernel_policy(matmul="cublasLt")
    out = lin(x)
    grads = torch.autograd.grad(out.float().square().mean(), (x, lin.weight, lin.bias))
    assert _kernels("matmul") == {"cublasLt"} and _kernels("linear") <= {"cublasLt"}
    products = [r for r in xrt.get_dispatch_logs() if r.op_name in ("matmul", "linear")]
    assert len(products) >= 3 and {r.reason for r in products} == {"policy"}  # forward, dx, dW
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.float(), r.float(), rtol=3e-2, atol=3e-2)


def test_a_scoped_policy_steers_the_backward_called_inside_it():
    """Backward matrix products follow a scope (autograd's device threads would see only the process policy)."""
    torch.manual_seed(0)
    a = torch.randn(64, 96, device="cuda", requires_grad=True)
    b = torch.randn(96, 80, device="cuda", requires_grad=True)
    with xtorch.kernel_policy(matmul="torch"):
        (a @ b).sum().backward()
    assert len([r for r in xrt.get_dispatch_logs() if r.op_name == "matmul"]) == 3  # forward, da, db
    torch.testing.assert_close(a.grad, torch.ones(64, 80, device="cuda") @ b.detach().T)
    assert torch._C._is_multithreading_enabled()


@pytest.mark.parametrize("batch", [(), (3,)], ids=["mm", "bmm"])
def test_torch_matmul_kernel_takes_operands_that_require_grad(batch):
    """The override of aten::mm/bmm runs below autograd with grad mode still on: the torch kernel must
    use aten ops that accept operands requiring grad there (matmul's out= form refuses them)."""
    torch.manual_seed(0)
    x = torch.randn(*batch, 33, 40, device="cuda", requires_grad=True)
    w = torch.randn(*batch, 40, 17, device="cuda", requires_grad=True)
    ref = x.double() @ w.double()
    ref_grads = torch.autograd.grad(ref.square().sum(), (x, w))
    xtorch.set_kernel_policy(matmul="torch")
    out = x @ w
    grads = torch.autograd.grad(out.square().sum(), (x, w))
    assert _kernels("matmul") == {"torch"}
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-3)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r.double(), rtol=1e-4, atol=1e-2)


def test_attention_forward_and_backward_use_flash_v2():
    _skip_unless("attention", "flash_v2")
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    xtorch.set_kernel_policy(attention="flash_v2")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert _kernels("attention_forward") == {"flash_v2"} and _kernels("attention_backward") == {"flash_v2"}
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=3e-2, atol=3e-2)


def test_flash_v2_float32_falls_back_once_and_strict_raises():
    _skip_unless("attention", "flash_v2")
    q, k, v = (torch.randn(1, 2, 64, 32, device="cuda") for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v)
    xtorch.set_kernel_policy(attention="flash_v2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [F.scaled_dot_product_attention(q, k, v) for _ in range(3)]
    fallbacks = [w for w in caught if issubclass(w.category, xrt.KernelFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    xtorch.set_kernel_policy(xrt.KernelPolicy(attention="flash_v2", strict=True))
    with pytest.raises(xrt.UnsupportedByPolicyError, match="flash_v2"):
        F.scaled_dot_product_attention(q, k, v)


def test_layer_norm_forward_and_backward_follow_the_policy():
    _skip_unless("layer_norm", "triton")
    x = torch.randn(64, 1024, device="cuda", requires_grad=True)
    w, b = torch.randn(1024, device="cuda", requires_grad=True), torch.randn(1024, device="cuda", requires_grad=True)
    ref = F.layer_norm(x, (1024,), w, b)
    ref_grads = torch.autograd.grad(ref.square().sum(), (x, w, b))
    xtorch.set_kernel_policy(layer_norm="triton")  # its backward op follows (same kernel name)
    out = F.layer_norm(x, (1024,), w, b)
    grads = torch.autograd.grad(out.square().sum(), (x, w, b))
    assert _kernels("layer_norm") == {"triton"} and _kernels("layer_norm_backward") == {"triton"}
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-3)


def test_inference_mode_and_autocast_with_a_policy():
    xtorch.set_kernel_policy(matmul="torch", layer_norm="torch")
    lin = torch.nn.Linear(256, 128, device="cuda")
    x = torch.randn(32, 256, device="cuda")
    with torch.inference_mode(), xtorch.autocast(dtype=torch.bfloat16):
        y = F.layer_norm(lin(x), (128,))
    assert y.dtype == torch.float32  # autocast runs layer_norm in fp32, as PyTorch does
    products = [r for r in xrt.get_dispatch_logs() if r.op_name in ("matmul", "linear")]
    assert {(r.selected_kernel, r.dtype) for r in products} == {("torch", "bfloat16")}  # nn.Linear: linear op
    torch.testing.assert_close(y, F.layer_norm(lin(x), (128,)), rtol=3e-2, atol=3e-2)


def _tiny_step(policy: dict | None, capture: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512), torch.nn.Linear(512, 256)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(64, 256, device="cuda")
    target = torch.randn(64, 256, device="cuda")
    if policy:
        xtorch.set_kernel_policy(**policy)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = []
    if capture:
        graph = xtorch.CUDAGraphWrapper(warmup_iters=3)
        graph.capture(step)
        for _ in range(5):
            losses.append(graph.replay().clone())
    else:
        for _ in range(3 + 5):
            losses.append(step())
        losses = losses[3:]
    xtorch.clear_kernel_policy()
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


def test_captured_training_step_matches_eager():
    policy = {"matmul": "torch", "layer_norm": "torch"}
    eager_losses, eager_params = _tiny_step(policy, capture=False)
    graph_losses, graph_params = _tiny_step(policy, capture=True)
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    for g, e in zip(graph_params, eager_params):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    assert "torch" in _kernels("matmul")


def test_autotune_tunes_a_graph_warmup_without_the_routing_cost():
    """Signatures first tuned in CUDAGraphWrapper's warm-up are judged for replay (no host cost)."""
    from xpuruntime.pytorch import router as routing
    from xpuruntime.pytorch import tuner as handback

    eager_losses, _ = _tiny_step(None, capture=False)
    handback.reset()
    routing.get_dispatcher().plans.invalidate()  # tune again, inside the warm-up
    graph_losses, _ = _tiny_step({"matmul": "autotune", "layer_norm": "autotune"}, capture=True)
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-3, atol=1e-4)
    found = [why for rows in handback.verdicts().values() for _, why in rows]
    assert found and all("CUDA graph" in why for why in found), found
    handback.reset()


def test_allocator_pool_routes_allocations_and_keeps_results():
    ref_losses, _ = _tiny_step(None, capture=False)
    xtorch.set_allocator()
    try:
        t = torch.empty(1000, device="cuda")
        assert t.data_ptr() % 256 == 0
        losses, _ = _tiny_step(None, capture=False)
        stats = xtorch.allocator_stats()
    finally:
        xtorch.reset_allocator()
    torch.testing.assert_close(losses, ref_losses)
    assert stats["enabled"] and stats["allocations_since_enabled"] > 0 and stats["reserved_bytes"] > 0
    assert xtorch.allocator_stats() == {"enabled": False}


def test_profile_on_cuda_marks_decisions(tmp_path):
    xtorch.set_kernel_policy(matmul="torch")
    a, b = torch.randn(128, 128, device="cuda"), torch.randn(128, 128, device="cuda")
    path = tmp_path / "trace.json"
    with xtorch.profile(export_chrome_trace=str(path)):
        a @ b
    text = path.read_text()
    assert "xrt::matmul -> torch (policy)" in text


def test_native_routes_run_pytorch_kernel_without_python_and_match_eager():
    """Under matmul=torch the native (C++) override learns each signature once, then runs aten's own GEMM
    without Python, forward and backward: results equal eager bit for bit. Logging observes every call, so
    the fast path is off while it is on."""
    from xpuruntime.pytorch import native as native_routes

    if native_routes.load() is None:
        pytest.skip(native_routes.status())
    xrt.disable_dispatch_logging()
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 80, bias=False, device="cuda")
    x = torch.randn(4, 33, 96, device="cuda").transpose(0, 1)[:, ::2]  # strided, odd sizes
    ref = lin(x)
    ref_grads = torch.autograd.grad(ref.square().sum(), (lin.weight,))
    xtorch.set_kernel_policy(matmul="torch")
    before = native_routes.stats()
    for _ in range(3):
        out = lin(x)
        grads = torch.autograd.grad(out.square().sum(), (lin.weight,))
        assert torch.equal(out, ref) and torch.equal(grads[0], ref_grads[0])
    after = native_routes.stats()
    assert after["enabled"] == 1 and after["native_calls"] - before["native_calls"] >= 4
    xrt.enable_dispatch_logging()
    assert native_routes.stats()["enabled"] == 0
    lin(x)
    assert _kernels("matmul") == {"torch"}
