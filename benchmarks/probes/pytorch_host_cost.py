"""Host cost of a routed aten call: eager PyTorch against the same call routed through xpuruntime.

Runs on the CPU, without a GPU: CPU aten ops are routed (`overrides.route_devices(("cpu",))`, as
tests/pytorch_cpu_routing.py does) to a private dispatcher whose kernels run the very PyTorch CPU
kernel eager mode runs (same dtype, into the dispatcher's output), so `routed - eager` is what the
override, the dispatcher and the autograd Function add per call. Problems are tiny so that host time
dominates. Each figure is the best of several interleaved rounds (µs per iteration).

CPU tensors take the dispatcher's convert-and-retry path (a NumPy view per tensor, `torch.from_numpy`
of the result), which CUDA tensors never take; `run` alone shows that share.

    python benchmarks/probes/pytorch_host_cost.py [--rounds 7] [--calls 2000] [--profile CASE]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

import xpuruntime as xrt
from xpuruntime.dispatch import Dispatcher
from xpuruntime.pytorch import install as overrides
from xpuruntime.pytorch import router as routing
from xpuruntime.registry import OPS_PACKAGE, Backend, Registry, _declared, _submodules, kernel
from xpuruntime.schema import OpSchema

_DTYPES = {"float32"}


def _t(a: np.ndarray | None) -> torch.Tensor | None:
    return None if a is None else torch.from_numpy(a)


def _mm(args):
    a, b = args.inputs
    torch.mm(_t(a), _t(b), out=_t(args.out))


def _linear(args):
    x, w, b = map(_t, args.inputs)
    torch.addmm(b, x, w.t(), out=_t(args.out))


def _layer_norm(args):
    x, w, b = map(_t, args.inputs)
    _t(args.out).copy_(torch.native_layer_norm(x, args.attrs["normalized_shape"], w, b, args.attrs["eps"])[0])


def _layer_norm_backward(args):
    dy, x, w = map(_t, args.inputs)
    shape, eps = list(args.attrs["normalized_shape"]), args.attrs["eps"]
    _, mean, rstd = torch.native_layer_norm(x, shape, w, None, eps)
    grads = torch.ops.aten.native_layer_norm_backward(dy, x, shape, mean, rstd, w, w, [True, True, True])
    out = _t(args.out)
    out[:-2].view(x.shape).copy_(grads[0])
    out[-2].copy_(grads[1])
    out[-1].copy_(grads[2])


def _attention_forward(args):
    q, k, v, mask, lse = map(_t, args.inputs)
    at = args.attrs
    o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, at["is_causal"], attn_mask=mask, scale=at["scale"]
    )
    _t(args.out).copy_(o)
    lse.copy_(l)


def _attention(args):
    q, k, v, mask = map(_t, args.inputs)
    o, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, args.attrs["is_causal"], attn_mask=mask, scale=args.attrs["scale"]
    )
    _t(args.out).copy_(o)


def _attention_backward(args):
    dout, q, k, v, o, lse, mask = map(_t, args.inputs)
    at = args.attrs
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, o, lse, 0.0, at["is_causal"], attn_mask=mask, scale=at["scale"]
    )
    torch.cat([g.reshape(-1) for g in grads], out=_t(args.out))


def make_registry() -> Registry:
    """The built-in op schemas with one PyTorch-CPU kernel (named 'bench') per routed op."""
    registry = Registry()
    for schema in _declared(_submodules(__import__(OPS_PACKAGE, fromlist=["_"])), OpSchema):
        registry.register_op(schema)
    registry.register_backend(
        Backend("torchcpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype))
    )
    for op, fn in (("matmul", _mm), ("linear", _linear), ("layer_norm", _layer_norm),
                   ("layer_norm_backward", _layer_norm_backward), ("attention", _attention),
                   ("attention_forward", _attention_forward),
                   ("attention_backward", _attention_backward)):  # fmt: skip
        registry.register_kernel(kernel(op, "bench", backend="torchcpu", dtypes=_DTYPES)(fn))
    return registry


def cases() -> dict[str, tuple[str, Callable[[], object]]]:
    """case name -> (the op the policy names, one iteration)."""
    torch.manual_seed(0)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    lin = torch.nn.Linear(16, 16)
    x_lin, g_lin = torch.randn(4, 16, requires_grad=True), torch.randn(4, 16)
    ln_w, ln_b = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    x_ln, g_ln = torch.randn(4, 16, requires_grad=True), torch.randn(4, 16)
    x_bf, w_bf, b_bf = (t.bfloat16().detach().requires_grad_() for t in (x_ln, ln_w, ln_b))
    q, k, v = (torch.randn(1, 2, 8, 16, requires_grad=True) for _ in range(3))
    g_att = torch.randn(1, 2, 8, 16)

    def linear_step():
        lin(x_lin).backward(g_lin)

    def layer_norm_step():
        F.layer_norm(x_ln, (16,), ln_w, ln_b).backward(g_ln)

    def layer_norm_handed_back():  # NumPy has no bfloat16: the dispatcher hands both directions back
        F.layer_norm(x_bf, (16,), w_bf, b_bf).backward(g_ln.bfloat16())

    def sdpa_step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g_att)

    def layer_norm_forward():
        with torch.no_grad():
            F.layer_norm(x_ln, (16,), ln_w, ln_b)

    return {
        "mm 16x16": ("matmul", lambda: torch.mm(a, b)),
        "linear fwd+bwd (4x16 @ 16x16)": ("matmul", linear_step),
        "layer_norm fwd (no_grad)": ("layer_norm", layer_norm_forward),
        "layer_norm fwd+bwd (4x16)": ("layer_norm", layer_norm_step),
        "layer_norm fwd+bwd, bf16 handed back": ("layer_norm", layer_norm_handed_back),
        "sdpa fwd+bwd (1x2x8x16 causal)": ("attention", sdpa_step),
    }


def timed(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def measure(rounds: int, calls: int, only: str | None = None) -> list[tuple[str, float, float]]:
    """(case, eager µs, routed µs) per case, best of `rounds` interleaved rounds (routed: NaN if it raised)."""
    rows = []
    for name, (op, fn) in cases().items():
        if only and only not in name:
            continue
        policy = xrt.KernelPolicy({op: "bench"}, validate=routing.get_dispatcher().registry)
        best = [float("inf"), float("inf")]
        try:
            for _ in range(rounds):
                for i, p in enumerate((None, policy)):
                    xrt.set_kernel_policy(p)
                    timed(fn, calls // 10)  # warm-up (plans, caches)
                    best[i] = min(best[i], timed(fn, calls))
        except RuntimeError as exc:  # an older xpuruntime may fail a case (the bf16 backward did)
            print(f"{name}: {type(exc).__name__}: {exc}")
            best[1] = float("nan")
        xrt.clear_kernel_policy()
        rows.append((name, *best))
    return rows


def profile(case: str, calls: int, sort: str = "tottime") -> None:
    """cProfile of the routed case whose name contains `case` (sorted by own time, then cumulative)."""
    name, (op, fn) = next((n, c) for n, c in cases().items() if case in n)
    xrt.set_kernel_policy(xrt.KernelPolicy({op: "bench"}, validate=routing.get_dispatcher().registry))
    timed(fn, 100)
    profiler = cProfile.Profile()
    profiler.enable()
    timed(fn, calls)
    profiler.disable()
    xrt.clear_kernel_policy()
    print(f"== {name}, {calls} iterations")
    pstats.Stats(profiler).sort_stats(sort).print_stats(35)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--only", default=None, help="run the cases whose name contains this")
    p.add_argument("--profile", default=None, help="cProfile the routed case whose name contains this")
    args = p.parse_args()
    torch.set_num_threads(1)
    routing.use_dispatcher(Dispatcher(make_registry()))
    overrides.route_devices(("cpu",))
    try:
        if args.profile:
            profile(args.profile, args.calls)
            return
        print(f"torch {torch.__version__}, {args.rounds} rounds x {args.calls} calls, µs per iteration (best)")
        print(f"{'case':<38}{'eager':>9}{'routed':>9}{'added':>9}")
        for name, eager, routed in measure(args.rounds, args.calls, args.only):
            print(f"{name:<38}{eager:>9.1f}{routed:>9.1f}{routed - eager:>9.1f}")
    finally:
        overrides.route_devices(("cuda",))
        routing.use_dispatcher(None)


if __name__ == "__main__":
    main()
