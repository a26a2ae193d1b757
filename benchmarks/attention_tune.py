"""flash_v2 on a GPU: correctness at full size, a block-size sweep with register/spill counts, and
timings beside PyTorch's flash and cuDNN SDPA backends, all in one process.

Usage: PYTHONPATH=src python3 benchmarks/attention_tune.py [--sweep] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from xpuruntime.backends.triton import flash as fl

DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make(B, H, Hk, L, S, D, dtype, layout_bshd=True):
    def t(b, s, h):
        if layout_bshd:
            return torch.randn(b, s, h, D, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, h, s, D, device="cuda", dtype=dtype)

    return t(B, L, H), t(B, S, Hk), t(B, S, Hk), torch.randn(B, H, L, D, device="cuda", dtype=dtype)


def ours_fwd(q, k, v, causal, mask=None, fcfg=None):
    B, H, L, D = q.shape
    out = torch.empty(B, H, L, D, device=q.device, dtype=q.dtype)
    lse = torch.empty(B * H * L, device=q.device, dtype=torch.float32)
    fl.forward(q, k, v, out, lse, mask, causal, 1 / math.sqrt(D), fcfg or fl.fwd_config(D, causal))
    return out, lse


def ours_bwd(do, q, k, v, out, lse, causal, mask=None, bcfg=None):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    D = q.shape[-1]
    fl.backward(do, q, k, v, out, lse, mask, causal, 1 / math.sqrt(D), dq, dk, dv, bcfg or fl.bwd_config(D, causal))
    return dq, dk, dv


def reference(q, k, v, do, causal, mask=None):
    H, Hk = q.shape[1], k.shape[1]
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, is_causal=causal, enable_gqa=Hk != H)
    o.backward(do.float())
    return o.detach(), qf.grad, kf.grad, vf.grad


def rel(a, b):
    a, b = a.float(), b.float()
    if torch.isnan(a).any():
        return float("nan")
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


def correctness(results):
    cases = [  # B, H, Hk, L, S, D, causal, mask kind, dtype
        (2, 8, 8, 1024, 1024, 128, False, None, "bf16"),
        (2, 8, 8, 1024, 1024, 128, True, None, "bf16"),
        (2, 8, 8, 1000, 1037, 64, True, None, "fp16"),
        (2, 8, 2, 777, 1029, 64, False, None, "bf16"),
        (2, 8, 2, 1029, 777, 128, True, None, "fp16"),
        (1, 4, 4, 300, 500, 32, False, "bool", "bf16"),
        (1, 4, 4, 300, 500, 80, False, "add", "fp16"),
        (1, 4, 4, 333, 333, 96, True, None, "bf16"),
        (1, 4, 4, 257, 300, 256, False, None, "fp16"),
        (1, 4, 4, 257, 300, 256, True, None, "bf16"),
    ]
    for B, H, Hk, L, S, D, causal, mk, dn in cases:
        dtype = DT[dn]
        q, k, v, do = make(B, H, Hk, L, S, D, dtype)
        mask = None
        if mk == "bool":
            mask = torch.rand(1, 1, L, S, device="cuda") > 0.3
        elif mk == "add":
            mask = torch.randn(1, H, L, S, device="cuda").to(dtype)
        m4 = None if mask is None else mask.expand(B, H, L, S)
        try:
            out, lse = ours_fwd(q, k, v, causal, m4)
            grads = ours_bwd(do, q, k, v, out, lse, causal, m4)
            ref = reference(q, k, v, do, causal, mask)
            errs = [rel(a, b) for a, b in zip((out, *grads), ref)]
            row = dict(case=f"B{B} H{H}/{Hk} L{L} S{S} D{D} causal={causal} mask={mk} {dn}", errs=errs)
        except Exception as exc:  # report and keep going
            row = dict(case=f"B{B} H{H}/{Hk} L{L} S{S} D{D} causal={causal} mask={mk} {dn}", error=repr(exc)[:300])
        print("CHECK", row, flush=True)
        results["correctness"].append(row)


def tflops(flops, ms):
    return flops / ms / 1e9


def time_shape(B, H, S, D, causal, dn, results, fcfg=None, bcfg=None, backends=("flash", "cudnn")):
    dtype = DT[dn]
    q, k, v, do = make(B, H, H, S, S, D, dtype, layout_bshd=False)
    f = fl.fwd_flops(B, H, S, S, D, causal)
    row = dict(B=B, H=H, S=S, D=D, causal=causal, dtype=dn)
    ours_fwd(q, k, v, causal, fcfg=fcfg)  # compile
    row["flash_v2_fwd"] = tflops(f, do_bench(lambda: ours_fwd(q, k, v, causal, fcfg=fcfg), return_mode="median"))

    def fb():
        o, l_ = ours_fwd(q, k, v, causal, fcfg=fcfg)
        ours_bwd(do, q, k, v, o, l_, causal, bcfg=bcfg)

    row["flash_v2_fwdbwd"] = tflops(3.5 * f, do_bench(fb, return_mode="median"))
    for name in backends:
        kind = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]  # fmt: skip
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel([kind]):
            row[f"torch_{name}_fwd"] = tflops(
                f, do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), return_mode="median")
            )

            def tfb(qg=qg, kg=kg, vg=vg):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)

            row[f"torch_{name}_fwdbwd"] = tflops(3.5 * f, do_bench(tfb, grad_to_none=[qg, kg, vg],
                                                                   return_mode="median"))  # fmt: skip
    print("TIME", {k_: (round(v_, 1) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)
    results["timings"].append(row)


def sweep(results, D, causal, fwd_list, kv_list, dq_list):
    B, H, S, dtype = 4, 16, 2048, torch.bfloat16
    q, k, v, do = make(B, H, H, S, S, D, dtype, layout_bshd=False)
    f = fl.fwd_flops(B, H, S, S, D, causal)
    scale = 1 / math.sqrt(D)
    fwd_cands = [fl.FwdConfig(*c) for c in fwd_list]
    out = torch.empty_like(q)
    lse = torch.empty(B * H * S, device="cuda", dtype=torch.float32)
    for c in fwd_cands:
        if causal and c.block_m % c.block_n:
            continue
        try:
            ker = fl.forward(q, k, v, out, lse, None, causal, scale, c)
            ms = do_bench(lambda c=c: fl.forward(q, k, v, out, lse, None, causal, scale, c), return_mode="median")
            row = dict(kind="fwd", D=D, causal=causal, cfg=str(c), config=c, tflops=tflops(f, ms), regs=ker.n_regs,
                       spills=ker.n_spills)  # fmt: skip
        except Exception as exc:
            row = dict(kind="fwd", D=D, causal=causal, cfg=str(c), error=repr(exc)[:200])
        print("SWEEP", row, flush=True)
        results["sweep"].append(row)
    fl.forward(q, k, v, out, lse, None, causal, scale, fl.fwd_config(D, causal))
    delta = torch.empty(B * H * S, device="cuda", dtype=torch.float32)
    fl.launch_delta(out, do, delta)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kv_cands = [fl.FwdConfig(*c) for c in kv_list]
    for c in kv_cands:
        try:
            ker = fl.launch_dkdv(do, q, k, v, lse, delta, None, causal, scale, dk, dv, c)
            ms = do_bench(lambda c=c: fl.launch_dkdv(do, q, k, v, lse, delta, None, causal, scale, dk, dv, c),
                          return_mode="median")  # fmt: skip
            row = dict(kind="dkdv", D=D, causal=causal, cfg=str(c), config=c, ms=ms, tflops=tflops(2.0 * f, ms),
                       regs=ker.n_regs, spills=ker.n_spills)  # fmt: skip
        except Exception as exc:
            row = dict(kind="dkdv", D=D, causal=causal, cfg=str(c), error=repr(exc)[:200])
        print("SWEEP", row, flush=True)
        results["sweep"].append(row)
    dq_cands = [fl.FwdConfig(*c) for c in dq_list]
    for c in dq_cands:
        try:
            ker = fl.launch_dq(do, q, k, v, lse, delta, None, causal, scale, dq, c)
            ms = do_bench(lambda c=c: fl.launch_dq(do, q, k, v, lse, delta, None, causal, scale, dq, c),
                          return_mode="median")  # fmt: skip
            row = dict(kind="dq", D=D, causal=causal, cfg=str(c), config=c, ms=ms, tflops=tflops(1.5 * f, ms),
                       regs=ker.n_regs, spills=ker.n_spills)  # fmt: skip
        except Exception as exc:
            row = dict(kind="dq", D=D, causal=causal, cfg=str(c), error=repr(exc)[:200])
        print("SWEEP", row, flush=True)
        results["sweep"].append(row)


_KV = [(64, 64, 4, 2), (64, 64, 8, 2), (64, 64, 8, 3), (32, 64, 4, 2), (64, 128, 8, 3), (32, 128, 4, 2)]
_DQ = [(128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 2), (128, 128, 8, 3), (64, 32, 4, 3)]
SWEEPS = {  # (D, causal): fwd, dkdv, dq candidates (block_m, block_n, warps, stages[, warp-specialized])
    (128, False): (
        [
            (128, 128, 8, 3),
            (128, 128, 8, 3, True),
            (128, 64, 8, 3, True),
            (128, 128, 8, 4),
            (64, 128, 4, 3),
            (64, 64, 4, 4),
        ],
        _KV,
        _DQ,
    ),
    (64, False): (
        [
            (64, 64, 4, 3),
            (64, 64, 4, 4),
            (64, 128, 4, 3),
            (128, 128, 8, 3, True),
            (128, 64, 8, 3, True),
            (128, 64, 4, 4),
        ],
        _KV,
        _DQ,
    ),
    (128, True): ([(64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3), (128, 64, 8, 3, True), (128, 128, 8, 3)], _KV, _DQ),
    (64, True): ([(64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3, True)], _KV, _DQ),
}


def pick_best(rows):
    best, score = {}, {}
    for r in rows:
        if "tflops" not in r:
            continue
        key = (r["kind"], r["D"], r["causal"])
        if r["tflops"] > score.get(key, 0):
            score[key], best[key] = r["tflops"], r["config"]
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "correctness": [], "sweep": [],
               "timings": []}  # fmt: skip
    t0 = time.time()
    if not args.no_check:
        correctness(results)
    if args.sweep:
        for (D, causal), lists in SWEEPS.items():
            sweep(results, D, causal, *lists)
        best = pick_best(results["sweep"])
        print("BEST", {k_: str(v_) for k_, v_ in best.items()}, flush=True)
    else:
        best = {}
    shapes = [(4, 16, S, D, c, "bf16") for D in (128, 64) for S in (1024, 2048, 4096, 8192) for c in (False, True)]
    shapes += [(4, 16, 2048, D, c, "fp16") for D in (128, 64) for c in (False, True)]
    if args.quick:
        shapes = [s for s in shapes if s[2] == 2048 and s[5] == "bf16"]
    for s in shapes:
        D, causal = s[3], s[4]
        fcfg, kv, dq = best.get(("fwd", D, causal)), best.get(("dkdv", D, causal)), best.get(("dq", D, causal))
        bcfg = None
        if kv or dq:
            base = fl.bwd_config(D, causal)
            bcfg = fl.BwdConfig(kv or base.dkdv, dq or base.dq)
        try:
            time_shape(*s, results, fcfg=fcfg, bcfg=bcfg)
        except Exception as exc:
            print("TIME-ERROR", s, repr(exc)[:300], flush=True)
    with open(os.path.join(args.out, "attention_tune.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    print(f"\n# done in {time.time() - t0:.0f}s")
    keys = ["flash_v2_fwd", "torch_flash_fwd", "torch_cudnn_fwd", "flash_v2_fwdbwd", "torch_flash_fwdbwd",
            "torch_cudnn_fwdbwd"]  # fmt: skip
    print("dtype D S causal | " + " | ".join(keys))
    for r in results["timings"]:
        print(f"{r['dtype']} {r['D']} {r['S']} {int(r['causal'])} | " + " | ".join(f"{r.get(k, 0):.0f}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
