"""Small flash_v2 forwards + backwards (odd lengths, causal, GQA, bool mask) for compute-sanitizer, and the
forward with every configuration the tuner may pick (TMA loads included)."""

from __future__ import annotations

import math

import torch

from xpuruntime.backends.triton import flash as fl


def run_case(B, H, Hk, L, S, D, causal, masked, fwd=None):
    q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16)
    mask = (torch.rand(1, 1, L, S, device="cuda") > 0.2).expand(B, H, L, S) if masked else None
    out = torch.empty(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B * H * L, device="cuda", dtype=torch.float32)
    fl.forward(q, k, v, out, lse, mask, causal, 1 / math.sqrt(D), fwd or fl.fwd_config(D, causal))
    if fwd is not None:
        torch.cuda.synchronize()
        return
    do = torch.randn_like(out)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fl.backward(do, q, k, v, out, lse, mask, causal, 1 / math.sqrt(D), dq, dk, dv, fl.bwd_config(D, causal))
    torch.cuda.synchronize()


if __name__ == "__main__":
    run_case(1, 4, 2, 77, 131, 128, True, False)
    run_case(1, 2, 2, 65, 100, 64, False, True)
    for (D, causal), configs in fl.FWD_CANDIDATES.items():
        for cfg in configs:
            run_case(1, 2, 1, 77, 131, D, causal, False, fwd=cfg)
    print("sanitize cases done")
