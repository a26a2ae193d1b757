"""H100 probe for the fused transformer-training ops (issue 25 item 1): every new Triton kernel at full size
checked against the ops' float64 references, then timed beside the unfused PyTorch form and, when importable,
Liger-Kernel's kernel (liger_kernel.ops.*), forward and forward+backward, at the shapes of the issue's Llama-8L
step (8 x 1024 tokens, hidden 1024, intermediate 2816, vocab 32000, 16 / 4 heads of 64) and GPT-2 step (768,
3072, vocab 50257, 12 heads of 64).

Ours runs as the ops (xrt.ops.*) under a global policy naming the Triton kernels; its forward+backward is the
forward op then the backward op (what a custom autograd Function calls). PyTorch and Liger run through autograd
(.backward on the output). Timing: triton.testing.do_bench medians, the variants of a row interleaved over
--rounds rounds (median of the rounds). linear_cross_entropy also reports the peak memory above the inputs.

    python3 benchmarks/probes/fused_ops_h100.py [--rounds 3] [--only rms,glu,rope,lce,add] [--json fused.json] [--no-check]

Output: a "CHECK" line per kernel (max relative error against float64, PASS / FAIL) and a "FIG" line per row:
milliseconds of each variant and ours' speedup over each.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from triton.testing import do_bench

import xpuruntime as xrt
from xpuruntime.ops.add_norm import add_layer_norm_reference, add_rms_norm_reference
from xpuruntime.ops.add_norm_backward import add_layer_norm_backward_reference, add_rms_norm_backward_reference
from xpuruntime.ops.glu import geglu_reference, swiglu_reference
from xpuruntime.ops.glu_backward import geglu_backward_reference, swiglu_backward_reference
from xpuruntime.ops.linear_cross_entropy import gradients_reference
from xpuruntime.ops.linear_cross_entropy import reference as lce_reference
from xpuruntime.ops.norm import rms_norm_reference
from xpuruntime.ops.norm_backward import rms_norm_backward_reference
from xpuruntime.ops.rotary import reference as rope_reference
from xpuruntime.ops.rotary_backward import reference as rope_backward_reference

DEV, BF16 = "cuda", torch.bfloat16
MODELS = {  # tokens, hidden, intermediate, vocab, heads, kv heads, head dim
    "llama": dict(tokens=8192, hidden=1024, inter=2816, vocab=32000, heads=16, kv=4, dim=64, batch=8),
    "gpt2": dict(tokens=8192, hidden=768, inter=3072, vocab=50257, heads=12, kv=12, dim=64, batch=8),
}
FUSED_OPS = ("rms_norm", "rms_norm_backward", "add_rms_norm", "add_rms_norm_backward", "add_layer_norm",
             "add_layer_norm_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward", "rotary_embedding",
             "rotary_embedding_backward", "linear_cross_entropy", "linear_cross_entropy_backward")  # fmt: skip
RESULTS: dict[str, Any] = {"checks": {}, "rows": {}}


def liger(module: str, name: str) -> Any:
    """liger_kernel.ops.<module>.<name>, or None when Liger-Kernel (or that op) is not importable."""
    try:
        return getattr(__import__(f"liger_kernel.ops.{module}", fromlist=[name]), name)
    except Exception as exc:
        print(f"(no Liger {module}.{name}: {type(exc).__name__})")
        return None


def randn(*shape: int, dtype: torch.dtype = BF16, scale: float = 1.0, grad: bool = False) -> torch.Tensor:
    t = (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype)
    return t.requires_grad_() if grad else t


def f64(t: Any) -> Any:
    return None if t is None else t.detach().double().cpu().numpy()


def check(name: str, got: Any, ref: np.ndarray, tol: float) -> None:
    """Max |got - ref| / max |ref| (where ref is finite) against tol; NaN must match."""
    got = f64(got)
    ref = np.asarray(ref, np.float64)
    nan_ok = bool(np.array_equal(np.isnan(got), np.isnan(ref)))
    keep = ~np.isnan(ref)
    err = float(np.abs(got[keep] - ref[keep]).max(initial=0.0) / max(np.abs(ref[keep]).max(initial=0.0), 1e-30))
    ok = nan_ok and err <= tol
    RESULTS["checks"][name] = {"rel_err": err, "tol": tol, "nan_ok": nan_ok, "pass": ok}
    print(f"CHECK {name}: max rel err {err:.2e} (tol {tol:.0e}){'' if nan_ok else ' NaN MISMATCH'} "
          f"{'PASS' if ok else 'FAIL'}", flush=True)  # fmt: skip


def grads_of(fn: Callable[[], Any], leaves: list[torch.Tensor], dy: Any) -> Callable[[], Any]:
    """Forward + backward through autograd: fn() then backward of (its outputs) with dy."""

    def run() -> Any:
        out = fn()
        outs, dys = (out, dy) if isinstance(out, tuple) else ((out,), (dy,))
        return torch.autograd.grad(outs, leaves, dys)

    return run


def bench(row: str, variants: dict[str, Callable[[], Any]], rounds: int, note: str = "") -> None:
    """Interleaved do_bench medians; a FIG line with ours' speedup over each other variant."""
    variants = {k: v for k, v in variants.items() if v is not None}
    for name, fn in list(variants.items()):  # warm-up (compilation, plans); a variant that fails is left out
        try:
            fn()
        except Exception as exc:
            print(f"     {row}: {name} failed ({type(exc).__name__}: {str(exc)[:160]}); left out", flush=True)
            del variants[name]
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    ms = {k: statistics.median(v) for k, v in samples.items()}
    speedups = {f"vs_{k}": ms[k] / ms["ours"] for k in ms if k != "ours" and "ours" in ms}
    RESULTS["rows"][row] = {"ms": ms, **speedups, "note": note}
    parts = ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
    gains = ", ".join(f"{k} {v:.2f}x" for k, v in speedups.items())
    print(f"FIG {row}: {parts}; ours {gains} {note}".rstrip(), flush=True)


def peak_memory(fn: Callable[[], Any]) -> float:
    """GiB allocated above what was allocated before one call of fn (its transient peak)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    del result
    return (torch.cuda.max_memory_allocated() - base) / 2**30


# -- rows ---------------------------------------------------------------------------------------------


def llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rms_rows(m: dict, model: str, rounds: int, do_check: bool) -> None:
    for dtype, label in ((torch.float32, "fp32 (autocast residual stream)"), (BF16, "bf16")):
        _rms_row(m, model, rounds, do_check, dtype, label)


def _rms_row(m: dict, model: str, rounds: int, do_check: bool, dtype: torch.dtype, label: str) -> None:
    n, d = m["tokens"], m["hidden"]
    lig = liger("rms_norm", "LigerRMSNormFunction")
    x, w, dy = randn(n, d, dtype=dtype), randn(d, dtype=dtype), randn(n, d, dtype=dtype)
    ours = lambda: xrt.ops.rms_norm(x, d, w, 1e-6, casting="llama")  # noqa: E731
    if do_check:
        check(f"rms_norm llama {model} {label}", ours(), rms_norm_reference(f64(x), d, f64(w), 1e-6, 0.0, "llama"),
              2e-2 if dtype == BF16 else 1e-5)  # fmt: skip
        dx, dw = xrt.ops.rms_norm_backward(dy, x, d, w, 1e-6, casting="llama")
        ref = rms_norm_backward_reference(f64(dy), f64(x), d, f64(w), 1e-6, 0.0, "llama")
        check(f"rms_norm_backward llama {model} {label} dx", dx, ref[:-1], 2e-2 if dtype == BF16 else 1e-5)
        check(f"rms_norm_backward llama {model} {label} dw", dw, ref[-1], 3e-2 if dtype == BF16 else 1e-4)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    bench(f"rms_norm fwd {model} {n}x{d} {label}", {
        "ours": ours, "torch": lambda: llama_rms_norm(x, w, 1e-6),
        "liger": lig and (lambda: lig.apply(x, w, 1e-6, 0.0, "llama")),
    }, rounds)  # fmt: skip
    bench(f"rms_norm fwd+bwd {model} {n}x{d} {label}", {
        "ours": lambda: (ours(), xrt.ops.rms_norm_backward(dy, x, d, w, 1e-6, casting="llama")),
        "torch": grads_of(lambda: llama_rms_norm(xg, wg, 1e-6), [xg, wg], dy),
        "liger": lig and grads_of(lambda: lig.apply(xg, wg, 1e-6, 0.0, "llama"), [xg, wg], dy),
    }, rounds)  # fmt: skip


def add_norm_rows(m: dict, model: str, rounds: int, do_check: bool) -> None:
    """The decoder layer's residual add + norm under autocast: bf16 branch output, fp32 residual stream."""
    n, d = m["tokens"], m["hidden"]
    x, r = randn(n, d), randn(n, d, dtype=torch.float32)
    w, b = randn(d, dtype=torch.float32), randn(d, dtype=torch.float32)
    dy, dh = randn(n, d, dtype=torch.float32), randn(n, d, dtype=torch.float32)
    rms = model == "llama"
    if rms:
        ours = lambda: xrt.ops.add_rms_norm(x, r, w, 1e-6, casting="llama")  # noqa: E731
        ours_bwd = lambda h: xrt.ops.add_rms_norm_backward(dy, dh, h, w, 1e-6, casting="llama")  # noqa: E731
        unfused = lambda xx, rr, ww: (llama_rms_norm(xx + rr, ww, 1e-6), xx + rr)  # noqa: E731
    else:
        ours = lambda: xrt.ops.add_layer_norm(x, r, w, b, 1e-5)  # noqa: E731
        ours_bwd = lambda h: xrt.ops.add_layer_norm_backward(dy, dh, h, w, 1e-5)  # noqa: E731
        unfused = lambda xx, rr, ww: (F.layer_norm(xx + rr, (d,), ww, b, 1e-5), xx + rr)  # noqa: E731
    y, h = ours()
    op = "add_rms_norm" if rms else "add_layer_norm"
    if do_check:
        ref = (add_rms_norm_reference(f64(x), f64(r), f64(w), None, 1e-6, 0.0, "llama") if rms
               else add_layer_norm_reference(f64(x), f64(r), f64(w), f64(b), None, 1e-5))  # fmt: skip
        check(f"{op} {model} y", y, ref, 1e-5)
        check(f"{op} {model} h", h, f64(x) + f64(r), 1e-7)
        grads = ours_bwd(h)
        ref = (add_rms_norm_backward_reference(f64(dy), f64(dh), f64(h), f64(w), 1e-6, 0.0, "llama") if rms
               else add_layer_norm_backward_reference(f64(dy), f64(dh), f64(h), f64(w), 1e-5))  # fmt: skip
        check(f"{op}_backward {model} dh", grads[0], ref[:n], 1e-5)
        check(f"{op}_backward {model} dw", grads[1], ref[n], 1e-4)
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    lig_add = liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction") if rms else None
    bench(f"{op} fwd {model} {n}x{d} bf16+fp32", {
        "ours": ours, "torch": lambda: unfused(x, r, w),
        "liger": lig_add and (lambda: lig_add.apply(x.float(), r.clone(), w, 1e-6, 0.0, "llama")),
    }, rounds, note="(Liger's needs one dtype: x cast to fp32 first)" if lig_add else "")  # fmt: skip
    bench(f"{op} fwd+bwd {model} {n}x{d} bf16+fp32", {
        "ours": lambda: ours_bwd(ours()[1]),
        "torch": grads_of(lambda: unfused(xg, rg, wg), [xg, rg, wg], (dy, dh)),
    }, rounds)  # fmt: skip


def glu_rows(m: dict, model: str, rounds: int, do_check: bool) -> None:
    for kind in ("silu", "tanh"):
        _glu_row(m, model, rounds, do_check, kind)


def _glu_row(m: dict, model: str, rounds: int, do_check: bool, kind: str) -> None:
    n, i = m["tokens"], m["inter"]
    gate, up, dy = randn(n, i, scale=2.0), randn(n, i), randn(n, i)
    if kind == "silu":
        name, lig = "swiglu", liger("swiglu", "LigerSiLUMulFunction")
        ours = lambda: xrt.ops.swiglu(gate, up)  # noqa: E731
        ours_bwd = lambda: xrt.ops.swiglu_backward(dy, gate, up)  # noqa: E731
        eager = lambda g, u: F.silu(g) * u  # noqa: E731
    else:
        name, lig = "geglu", liger("geglu", "LigerGELUMulFunction")
        ours = lambda: xrt.ops.geglu(gate, up, "tanh")  # noqa: E731
        ours_bwd = lambda: xrt.ops.geglu_backward(dy, gate, up, "tanh")  # noqa: E731
        eager = lambda g, u: F.gelu(g, approximate="tanh") * u  # noqa: E731
    if do_check:
        ref = swiglu_reference(f64(gate), f64(up)) if kind == "silu" else geglu_reference(f64(gate), f64(up), "tanh")
        check(f"{name} {model}", ours(), ref, 1e-2)
        ref = (swiglu_backward_reference(f64(dy), f64(gate), f64(up)) if kind == "silu"
               else geglu_backward_reference(f64(dy), f64(gate), f64(up), "tanh"))  # fmt: skip
        check(f"{name}_backward {model}", torch.stack(ours_bwd()), ref, 2e-2)
        got, want = ours(), eager(gate, up)
        print(f"     {name} {model}: {float((got != want).float().mean()):.2e} of elements differ from "
              f"PyTorch eager in any bit", flush=True)  # fmt: skip
    gg, ug = gate.clone().requires_grad_(), up.clone().requires_grad_()
    bench(f"{name} fwd {model} {n}x{i} bf16", {
        "ours": ours, "torch": lambda: eager(gate, up), "liger": lig and (lambda: lig.apply(gate, up)),
    }, rounds)  # fmt: skip
    bench(f"{name} fwd+bwd {model} {n}x{i} bf16", {
        "ours": lambda: (ours(), ours_bwd()), "torch": grads_of(lambda: eager(gg, ug), [gg, ug], dy),
        "liger": lig and grads_of(lambda: lig.apply(gg, ug), [gg, ug], dy),
    }, rounds)  # fmt: skip


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_rows(m: dict, model: str, rounds: int, do_check: bool) -> None:
    b, s, hq, hk, dim = m["batch"], m["tokens"] // m["batch"], m["heads"], m["kv"], m["dim"]
    # HF: projections viewed as (B, S, H, D) and transposed to (B, H, S, D); cos/sin (B, S, D) in the input dtype
    q = randn(b, s, hq, dim).transpose(1, 2)
    k = randn(b, s, hk, dim).transpose(1, 2)
    inv = 1.0 / 10000 ** (torch.arange(0, dim, 2, device=DEV, dtype=torch.float32) / dim)
    emb = torch.cat([torch.arange(s, device=DEV, dtype=torch.float32)[:, None] * inv] * 2, dim=-1)
    cos, sin = emb.cos()[None].expand(b, s, dim).to(BF16), emb.sin()[None].expand(b, s, dim).to(BF16)
    dq, dk = randn(b, hq, s, dim), randn(b, hk, s, dim)
    ours = lambda: xrt.ops.rotary_embedding(q, k, cos, sin)  # noqa: E731
    ours_bwd = lambda: xrt.ops.rotary_embedding_backward(dq, dk, cos, sin)  # noqa: E731
    if do_check:
        got = torch.cat([t.reshape(-1) for t in ours()])
        check(f"rotary_embedding {model}", got, rope_reference(f64(q), f64(k), f64(cos), f64(sin)), 1e-2)
        got = torch.cat([t.reshape(-1) for t in ours_bwd()])
        check(f"rotary_embedding_backward {model}", got, rope_backward_reference(f64(dq), f64(dk), f64(cos), f64(sin)),
              1e-2)  # fmt: skip
        want = hf_rope(q, k, cos, sin)
        same = all(torch.equal(a, c) for a, c in zip(ours(), want))
        print(f"     rotary_embedding {model}: bit-identical to HF's apply_rotary_pos_emb: {same}", flush=True)
    lig = liger("rope", "LigerRopeFunction")
    qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    bench(f"rotary fwd {model} q{tuple(q.shape)} k{tuple(k.shape)} bf16", {
        "ours": ours, "torch": lambda: hf_rope(q, k, cos, sin),
        "liger": lig and (lambda: lig.apply(q.clone(), k.clone(), cos, sin)),
    }, rounds, note="(Liger rotates in place: its time includes cloning q and k)" if lig else "")  # fmt: skip
    bench(f"rotary fwd+bwd {model} bf16", {
        "ours": lambda: (ours(), ours_bwd()),
        "torch": grads_of(lambda: hf_rope(qg, kg, cos, sin), [qg, kg], (dq, dk)),
        "liger": lig and grads_of(lambda: lig.apply(qg * 1, kg * 1, cos, sin), [qg, kg], (dq, dk)),
    }, rounds)  # fmt: skip


def lce_rows(m: dict, model: str, rounds: int, do_check: bool) -> None:
    n, d, v = m["tokens"], m["hidden"], m["vocab"]
    hidden, weight = randn(n, d), randn(v, d, scale=d**-0.5)
    target = torch.randint(0, v, (n,), device=DEV)
    target[torch.rand(n, device=DEV) < 0.1] = -100
    if do_check:
        h64, w64, t64 = f64(hidden), f64(weight), target.cpu().numpy()
        loss, dh, dw, _ = xrt.ops.linear_cross_entropy_forward(hidden, weight, target)
        check(f"linear_cross_entropy {model} loss", loss, lce_reference(h64, w64, t64), 5e-3)
        ref = gradients_reference(1.0, h64, w64, t64)
        check(f"linear_cross_entropy {model} grad_hidden (in-pass)", dh, ref[0], 2e-2)
        check(f"linear_cross_entropy {model} grad_weight (in-pass)", dw, ref[1], 2e-2)
        g = torch.full((), 0.7, device=DEV)
        dh, dw, _ = xrt.ops.linear_cross_entropy_backward(g, hidden, weight, target)
        check(f"linear_cross_entropy_backward {model} grad_hidden", dh, 0.7 * ref[0], 2e-2)
        check(f"linear_cross_entropy_backward {model} grad_weight", dw, 0.7 * ref[1], 2e-2)
        del ref
    lig = liger("fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction")
    hg, wg = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    one = torch.ones((), device=DEV)

    def unfused() -> Any:
        return F.cross_entropy(F.linear(hg, wg).float(), target, ignore_index=-100)

    def liger_loss() -> Any:
        out = lig.apply(hg, wg, target, None, None, -100, 0.0, 0.0, "mean")
        return out[0] if isinstance(out, tuple) else out

    def ours_fwd_bwd() -> Any:  # the forward's in-pass gradients, then autograd's scaling by the upstream grad
        _, dh, dw, _ = xrt.ops.linear_cross_entropy_forward(hidden, weight, target)
        return dh.mul_(one), dw.mul_(one)

    variants = {"ours": ours_fwd_bwd, "torch": grads_of(unfused, [hg, wg], one),
                "liger": lig and grads_of(liger_loss, [hg, wg], one)}  # fmt: skip
    memory = {k: round(peak_memory(fn), 3) for k, fn in variants.items() if fn is not None}
    bench(f"linear_cross_entropy fwd {model} {n}x{d} V{v} bf16", {
        "ours": lambda: xrt.ops.linear_cross_entropy(hidden, weight, target), "torch": lambda: F.cross_entropy(
            F.linear(hidden, weight).float(), target), "liger": None,
    }, rounds)  # fmt: skip
    bench(f"linear_cross_entropy fwd+bwd {model} {n}x{d} V{v} bf16", variants, rounds,
          note=f"peak GiB above inputs {memory}")  # fmt: skip
    RESULTS["rows"][f"linear_cross_entropy peak GiB {model}"] = memory


ROWS = {"rms": rms_rows, "add": add_norm_rows, "glu": glu_rows, "rope": rope_rows, "lce": lce_rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(ROWS))
    parser.add_argument("--models", default="llama,gpt2")
    parser.add_argument("--json", default="")
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    auto = {op: xrt.explain(op, *_explain_args(op), show=False).selected for op in ("swiglu", "rotary_embedding")}
    print(f"auto selection (no policy): {auto}", flush=True)
    xrt.set_kernel_policy(strict=True, **{op: "triton" for op in FUSED_OPS})
    for model in args.models.split(","):
        for key in args.only.split(","):
            ROWS[key](MODELS[model], model, args.rounds, not args.no_check)
    failed = [k for k, v in RESULTS["checks"].items() if not v["pass"]]
    print(f"SUMMARY checks: {len(RESULTS['checks']) - len(failed)} passed, {len(failed)} failed {failed}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1)


def _explain_args(op: str) -> tuple:
    if op == "swiglu":
        return (xrt.TensorSpec((8192, 2816), "bfloat16", device="cuda:0"),) * 2
    q = xrt.TensorSpec((8, 16, 1024, 64), "bfloat16", device="cuda:0")
    k = xrt.TensorSpec((8, 4, 1024, 64), "bfloat16", device="cuda:0")
    cos = xrt.TensorSpec((8, 1024, 64), "bfloat16", device="cuda:0")
    return q, k, cos, cos


if __name__ == "__main__":
    assert torch.cuda.is_available(), "this probe needs a CUDA device"
    main()
