"""Every flash_v2 forward configuration the tuner may pick (TMA loads included) against the float64
reference, and the tuner itself: it times every candidate, keeps the fastest, and stores the times (GPU)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from triton_harness import ON_GPU, assert_close, f64, torch

from xpuruntime.backends.triton import attention, flash
from xpuruntime.ops.attention_forward import lse_reference
from xpuruntime.ops.attention_forward import reference as forward_reference

pytestmark = pytest.mark.skipif(not ON_GPU, reason="compiled forward configurations need a CUDA device")
TOL = {"float16": 5e-3, "bfloat16": 2e-2}
CONFIGS = sorted({c for cs in flash.FWD_CANDIDATES.values() for c in cs} | set(flash.FWD_CONFIGS.values()), key=str)


def _bshd(rng: np.random.Generator, b: int, h: int, s: int, d: int, dtype: str):
    """[B, S, H, D] data viewed as [B, H, S, D] (the usual non-contiguous layout)."""
    data = torch.tensor(rng.standard_normal((b, s, h, d)), dtype=getattr(torch, dtype), device="cuda")
    return data.transpose(1, 2)


@pytest.mark.parametrize(
    ("causal", "dtype", "D"), [(False, "bfloat16", 128), (True, "float16", 128), (False, "float16", 80)]
)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_every_forward_config_matches_the_reference(cfg, causal, dtype, D) -> None:
    """Odd lengths (L != S), GQA, the [B, S, H, D] layout, a padded head dim; outputs poisoned first."""
    if causal and cfg.block_m % cfg.block_n:
        pytest.skip("causal tiles need block_m to be a multiple of block_n")
    if D != 128 and not cfg.tma:
        pytest.skip("the padded head dim is tested through the TMA loads (the pointer loads in test_attention_flash)")
    rng = np.random.default_rng()
    B, H, Hk, L, S = 2, 4, 2, 333, 517
    q, k, v = _bshd(rng, B, H, L, D, dtype), _bshd(rng, B, Hk, S, D, dtype), _bshd(rng, B, Hk, S, D, dtype)
    out = torch.full((B, H, L, D), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((B * H * L,), float("nan"), dtype=torch.float32, device="cuda")
    flash.forward(q, k, v, out, lse, None, causal, 1 / math.sqrt(D), cfg)
    q64, k64, v64 = f64(q), f64(k), f64(v)
    assert_close(out, forward_reference(q64, k64, v64, None, None, causal, None, True), dtype, TOL[dtype])
    assert_close(lse.view(B, H, L), lse_reference(q64, k64, None, causal, None, True), "float32", 1e-3)


def test_the_tuner_times_every_candidate_and_keeps_the_fastest(tmp_path, monkeypatch) -> None:
    from xpuruntime.runtime import tuning_cache

    monkeypatch.setenv("XPURUNTIME_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning_cache, "_default", None, raising=False)
    monkeypatch.setattr(attention, "_TUNED", {})
    rng = np.random.default_rng()
    q, k, v = (_bshd(rng, 2, 8, 1000, 128, "bfloat16") for _ in range(3))
    out = torch.empty_like(q)
    default = flash.fwd_config(128, False)
    chosen = attention.tuned_forward_config(q, k, v, out, False, 0.1, default)
    candidates = flash.FWD_CANDIDATES[(128, False)]
    [stored] = [json.loads(path.read_text())["value"] for path in tmp_path.rglob("*.json")]
    times = stored["times_us"]
    assert set(times) == {str(c) for c in candidates} and all(t > 0 for t in times.values())
    assert str(chosen) == stored["config"] == min(times, key=times.get)
    monkeypatch.setattr(attention, "_TUNED", {})  # a new process: the stored winner, nothing timed again
    monkeypatch.setattr(attention.flash, "forward", lambda *a: pytest.fail("timed again"))
    assert attention.tuned_forward_config(q, k, v, out, False, 0.1, default) == chosen
