"""The policy inside torch.compile on a CUDA device (issue 29 items 1, 2 and 5): our kernels in the compiled
forward and backward graphs, logged; CUDA graphs (`mode="reduce-overhead"` and CUDAGraphWrapper) capture
steps that contain them, and replays give the eager results."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch

pytestmark = pytest.mark.gpu


def _available(op: str, name: str) -> bool:
    spec = xrt.default_registry().kernels.get(op, {}).get(name)
    return spec is not None and xrt.default_registry().backends[spec.backend].unavailable_reason is None


def _policy() -> dict[str, str]:
    """The issue's policy where its kernels are here, with our Triton norms."""
    policy = {"attention": "flash_v2", "layer_norm": "triton", "rms_norm": "triton"}
    if _available("matmul", "cublasLt"):
        policy["matmul"] = "cublasLt"
    return {op: k for op, k in policy.items() if _available(op, k)}


class Block(torch.nn.Module):
    def __init__(self, d: int = 1024, heads: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.ln, self.qkv, self.out = torch.nn.LayerNorm(d), torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(y)
        return x + self.mlp(F.rms_norm(x, (d,)))


def _model_and_input(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """4096 tokens of width 1024: every product (forward and backward) is big enough for cuBLASLt's own
    condition (>= 8 µs of estimated GPU time, its host cost; the smallest here, 4096x1024x1024, is ~12 µs)."""
    torch.manual_seed(seed)
    return Block().cuda(), torch.randn(4, 1024, 1024, device="cuda")


def _step(fn, model, x) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = fn(x).float().square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture(autouse=True)
def _clean():
    torch._dynamo.reset()
    yield
    xtorch.clear_kernel_policy()
    xrt.disable_dispatch_logging()


def test_compiled_step_runs_the_policys_kernels_forward_and_backward():
    policy = _policy()
    if "attention" not in policy:
        pytest.skip("flash_v2 is not available here")
    model, x = _model_and_input()
    loss_ref, grads_ref = _step(torch.compile(model), model, x)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    xtorch.set_kernel_policy(**policy)
    compiled = torch.compile(model)
    xrt.enable_dispatch_logging()
    loss, grads = _step(compiled, model, x)
    ran = collections.Counter((r.op_name, r.selected_kernel, r.origin) for r in xrt.get_dispatch_logs())
    # flash attention runs as our op when the graph runs; the norms' Triton kernels were traced into the graph
    # (custom_ops.inline: chosen while compiling, launched by inductor's code, so never dispatched at run time)
    for op in ("attention_forward", "attention_backward"):
        assert ran[(op, policy["attention"], "graph")] >= 1, (op, dict(ran))
    for op in ("layer_norm", "layer_norm_backward", "rms_norm"):
        assert ran[(op, "triton", "compile")] >= 1 and not ran[(op, "triton", "graph")], (op, dict(ran))
    if "matmul" in policy:  # forward: addmm as linear; backward: mm as matmul; nothing else ran a product
        assert ran[("linear", "cublasLt", "graph")] >= 1 and ran[("matmul", "cublasLt", "graph")] >= 1, dict(ran)
        others = {(op, k) for op, k, origin in ran if op in ("matmul", "linear") and k != "cublasLt"}
        assert not others, dict(ran)
    # our passes pickle into the FX graph cache's key (a pass that cannot be pickled bypasses the cache)
    assert not torch._dynamo.utils.counters["inductor"]["fxgraph_cache_bypass"], dict(
        torch._dynamo.utils.counters["inductor"]
    )
    torch.testing.assert_close(loss, loss_ref, rtol=2e-2, atol=2e-3)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("with_policy", [False, True])
def test_reduce_overhead_captures_a_step_with_our_kernels(with_policy):
    """torch.compile(mode="reduce-overhead"): inductor's CUDA graphs take the graphs with our ops (no skip:
    no host sync or CPU tensor in them), and replays give the results of the uncaptured compiled step."""
    policy = _policy()
    model, x = _model_and_input(1)
    if with_policy:
        xtorch.set_kernel_policy(**policy)
    reference = [_step(torch.compile(model), model, x) for _ in range(2)][-1]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    captured = torch.compile(model, mode="reduce-overhead")
    for _ in range(4):  # warm-up, recording, replays
        loss, grads = _step(captured, model, x)
    assert not torch._dynamo.utils.counters["inductor"]["cudagraph_skips"], dict(
        torch._dynamo.utils.counters["inductor"]
    )
    torch.testing.assert_close(loss, reference[0], rtol=1e-3, atol=1e-4)
    for g, r in zip(grads, reference[1]):
        torch.testing.assert_close(g, r, rtol=1e-2, atol=1e-3)


def test_cuda_graph_wrapper_captures_a_compiled_step_with_our_kernels():
    policy = _policy()
    model, x = _model_and_input(2)
    xtorch.set_kernel_policy(**policy)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every replay computes the same step

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(x).float().square().mean()
        loss.backward()
        opt.step()
        return loss.detach()

    eager = step().clone()
    graph = xtorch.CUDAGraphWrapper(warmup_iters=3)
    graph.capture(step)
    for _ in range(3):
        torch.testing.assert_close(graph.replay(), eager, rtol=1e-3, atol=1e-4)
