"""flash_v2: the Triton flash attention (kernels in flash.py) declared for the ops `attention`,
`attention_forward` (with the logsumexp) and `attention_backward`.

Arrays of up to 4 dims are viewed as [B, H, S, D] without copies (batch broadcasting becomes stride 0),
so the usual [B, S, H, D] tensor transposed to [B, H, S, D] runs as it is. Block sizes come from a
table tuned per head-dim bucket and causality on an H100; masked calls use smaller tiles (the mask
tile takes shared memory too); the interpreter gets tiny tiles.
"""

from __future__ import annotations

import math

import torch

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from ..torch.attention import exp2_safe_mask
from . import flash
from .common import INTERPRET, MAX_GRID_Y, as_torch, no_negative_strides

HALF = frozenset({"float16", "bfloat16"})
MAX_HEAD_DIM = 256  # q, k, v tiles of a larger head dim do not fit in shared memory


def _head_dim(ctx: DispatchContext) -> str | None:
    e, ev = ctx.tensor("q").shape[-1], ctx.tensor("v").shape[-1]
    if e != ev:
        return f"value head dim {ev} differs from the query/key head dim {e}"
    if e > MAX_HEAD_DIM:
        return f"head dim {e} > {MAX_HEAD_DIM}: the q/k/v tiles do not fit in shared memory"
    return None


def _rank(ctx: DispatchContext) -> str | None:
    for name in ("q", "k", "v"):
        if ctx.tensor(name).ndim > 4:
            return f"'{name}' has {ctx.tensor(name).ndim} dims; at most 2 batch dims ([B, H, S, D])"
    return None


def _arch(ctx: DispatchContext) -> str | None:
    cc = ctx.compute_capability
    if not INTERPRET and (cc is None or cc < (8, 0)):
        return f"needs sm80+ (bf16 tensor cores), device has {'none' if cc is None else f'sm{cc[0]}{cc[1]}'}"
    return None


def _grid(ctx: DispatchContext) -> str | None:
    """Every kernel puts batch*heads on grid dimension 1, which CUDA caps at 65535."""
    bh = math.prod(ctx.attrs["batch"])
    if bh > MAX_GRID_Y:
        return f"batch*heads = {bh} > {MAX_GRID_Y} (the kernel grid's second dimension)"
    return None


INT32_LIMIT = 2**31


def _span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """The largest element offset within one [S, D] slice (the last two dims)."""
    return sum((n - 1) * abs(st) for n, st in zip(shape[-2:], strides[-2:]) if n > 0)


def _offsets_fit(ctx: DispatchContext) -> str | None:
    """The kernels index within a (batch, head) slice in int32 (row index times row stride): a slice whose
    offsets reach 2**31 (a 65536 x 65536 mask, a [B, S, H, D] view with S*H*D >= 2**31) would wrap."""
    named = [(n, ctx.tensor(n)) for n in ctx.arg_names if n != "lse" and ctx.has_tensor(n)]
    if ctx.out is not None and ctx.op != "attention_backward":
        named.append(("out", ctx.out))
    for name, t in named:
        if len(t.shape) >= 2 and _span(t.shape, t.strides) >= INT32_LIMIT:
            return (
                f"'{name}' spans {_span(t.shape, t.strides)} elements in one [S, D] slice (kernels index it in int32)"
            )
    shape = ctx.out_shape or ()  # a fresh row-major output (or, backward, the packed dq/dk/dv: q's [L, D] rows)
    if len(shape) >= 2 and shape[-2] * shape[-1] >= INT32_LIMIT:
        return f"output slice of {shape[-2] * shape[-1]} elements (kernels index it in int32)"
    return None


def _scale_not_negative(ctx: DispatchContext) -> str | None:
    """The forward's unmasked key loop takes the row max of unscaled scores times the scale, which is the row
    max of the scaled scores only for a scale >= 0 (a negative one overflows exp2: NaN)."""
    scale = ctx.attrs["scale"]
    return f"scale {scale} < 0 (the forward's online softmax assumes a non-negative scale)" if scale < 0 else None


CONDITIONS = (_head_dim, _rank, _arch, no_negative_strides, _grid, _offsets_fit)
FORWARD_CONDITIONS = (*CONDITIONS, _scale_not_negative)


def _configs(ctx: DispatchContext) -> tuple[flash.FwdConfig, flash.BwdConfig]:
    d, causal = ctx.tensor("q").shape[-1], ctx.attrs["is_causal"]
    if INTERPRET:
        return flash.SMALL_FWD, flash.SMALL_BWD
    fwd, bwd = flash.fwd_config(d, causal), flash.bwd_config(d, causal)
    if ctx.has_tensor("attn_mask"):
        fwd = flash.FwdConfig(64, 32, 4, 1) if flash.block_d(d) > 128 else flash.FwdConfig(64, 64, 4, 2)
    return fwd, bwd


_TUNED: dict[tuple, flash.FwdConfig] = {}


def tuned_forward_config(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool, scale: float,
    default: flash.FwdConfig,
) -> flash.FwdConfig:  # fmt: skip
    """The fastest forward candidate for this shape bucket, timed as autotune times kernels (cold L2, the
    larger of device and host time) on first use and kept in the tuning cache."""
    D = q.shape[-1]
    candidates = flash.FWD_CANDIDATES.get((flash.block_d(D), causal))
    if INTERPRET or candidates is None or not q.is_cuda or default not in candidates:
        return default
    from ...autotune import TIMING, cuda_sampler, median_us, report
    from ...runtime import tuning_cache

    B, H, L, _ = q.shape
    S, group = k.shape[2], H // k.shape[1]
    cc = torch.cuda.get_device_capability(q.device)
    shape = tuning_cache.shape_bucket((B * H, L, S))
    memo = (str(q.dtype), shape, D, causal, group, cc)
    if memo in _TUNED:
        return _TUNED[memo]
    source = flash._fwd_kernel.src + flash._fwd_tma_kernel.src
    key = tuning_cache.key("attention_flash_v2_fwd", dtypes=str(q.dtype), shape=(B * H, L, S), arch=cc,
                           source=source, head_dim=D, causal=causal, group=group, timing=TIMING)  # fmt: skip
    stored = tuning_cache.get(key)
    chosen = next((c for c in candidates if stored and str(c) == stored.get("config")), None)
    times_us, source = (stored or {}).get("times_us"), "from the tuning cache"
    if chosen is None:
        measure = cuda_sampler(str(q.device), torch.cuda.current_stream(q.device), host_bound=True)
        times = {}
        for c in candidates:
            run = lambda c=c: flash.forward(q, k, v, out, None, None, causal, scale, c)  # noqa: E731
            try:
                run()  # compile
                times[c] = median_us(measure, run)
            except Exception:  # a candidate that does not compile here (shared memory) just loses
                continue
        chosen = min(times, key=times.__getitem__) if times else default
        times_us, source = {str(c): t for c, t in times.items()}, "timed"
        tuning_cache.put(key, {"config": str(chosen), "times_us": times_us})
    causal_text = " causal" if causal else ""
    report(f"flash_v2 forward blocks {q.dtype} B*H={B * H} L={L} S={S} D={D}{causal_text}", chosen, times_us, source)
    _TUNED[memo] = chosen
    return chosen


def _forward_config(
    args: ArgPack, q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, out: torch.Tensor, mask4: torch.Tensor | None
) -> flash.FwdConfig:
    """The plan's forward config: tuned on the plan's first launch, then kept in its launch params."""
    params = args.config.params
    cfg = params.get("fwd_tuned")
    if cfg is None:
        cfg = params["fwd"]
        if mask4 is None:
            cfg = tuned_forward_config(q4, k4, v4, out, args.attrs["is_causal"], args.attrs["scale"], cfg)
        params["fwd_tuned"] = cfg
    return cfg


def launch_config(ctx: DispatchContext) -> LaunchConfig:
    fwd, bwd = _configs(ctx)
    at = ctx.attrs
    grid = (math.ceil(at["L"] / fwd.block_m), math.prod(at["batch"]))
    return LaunchConfig(grid=grid, block=(fwd.warps * 32,), params={"fwd": fwd, "bwd": bwd})


def _view4(t: torch.Tensor, batch: tuple[int, ...] | None = None) -> torch.Tensor:
    """(..., S, D) with at most 2 batch dims -> [B, H, S, D] (a view); `batch` broadcasts (stride 0)."""
    t = t.reshape((1,) * (4 - t.ndim) + tuple(t.shape)) if t.ndim < 4 else t
    if batch is not None:
        b4 = (1,) * (2 - len(batch)) + tuple(batch)
        t = t.expand(*b4, *t.shape[-2:])
    return t


def _mask4(mask: torch.Tensor | None, b4: tuple[int, ...], L: int, S: int) -> torch.Tensor | None:
    if mask is None:
        return None
    m = mask.reshape((1,) * max(0, 4 - mask.ndim) + tuple(mask.shape)) if mask.ndim < 4 else mask
    return m.expand(*b4, L, S)


def _numel(x: object) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else int(x.size)  # type: ignore[attr-defined]


def _batch4(batch: tuple[int, ...]) -> tuple[int, int]:
    b = (1,) * (2 - len(batch)) + tuple(batch)
    return b[0], b[1]


@kernel(
    "attention", "flash_v2", backend="triton", dtypes=HALF, conditions=FORWARD_CONDITIONS, priority=20, fused=True,
    tensor_cores=True, launch_config=launch_config,
)  # fmt: skip
def attention_flash_v2(args: ArgPack) -> None:
    """Flash attention forward (online softmax over key blocks, fp32 accumulation)."""
    if _numel(args.out) == 0:
        return
    q, k, v, mask = (as_torch(t) for t in args.inputs)
    at = args.attrs
    b4 = _batch4(at["batch"])
    out = _view4(as_torch(args.out))
    safe = mask if at["bounded_mask"] else exp2_safe_mask(mask)  # the kernel too adds the mask times log2(e)
    mask4 = _mask4(safe, b4, at["L"], at["S"])
    kv_batch = at["batch"] if at.get("group", 1) == 1 else None  # grouped: k and v keep their own heads
    q4, k4, v4 = _view4(q, at["batch"]), _view4(k, kv_batch), _view4(v, kv_batch)
    cfg = _forward_config(args, q4, k4, v4, out, mask4)
    flash.forward(q4, k4, v4, out, None, mask4, at["is_causal"], at["scale"], cfg)


@kernel(
    "attention_forward", "flash_v2", backend="triton", dtypes=HALF, conditions=FORWARD_CONDITIONS, priority=20,
    fused=True, tensor_cores=True, launch_config=launch_config,
)  # fmt: skip
def attention_forward_flash_v2(args: ArgPack) -> None:
    """Flash attention forward that also writes each row's logsumexp (for backward)."""
    if _numel(args.out) == 0:
        return
    q, k, v, mask, lse = (as_torch(t) for t in args.inputs)
    at = args.attrs
    b4 = _batch4(at["batch"])
    mask4 = _mask4(mask, b4, at["L"], at["S"])
    q4, k4, v4, out = _view4(q), _view4(k), _view4(v), _view4(as_torch(args.out))
    cfg = _forward_config(args, q4, k4, v4, out, mask4)
    flash.forward(q4, k4, v4, out, lse.reshape(-1), mask4, at["is_causal"], at["scale"], cfg)


@kernel(
    "attention_backward", "flash_v2", backend="triton", dtypes=HALF, conditions=CONDITIONS, priority=20,
    fused=True, tensor_cores=True, launch_config=launch_config,
)  # fmt: skip
def attention_backward_flash_v2(args: ArgPack) -> None:
    """Flash attention backward: delta = rowsum(dO * O), then a dK/dV kernel and a dQ kernel (deterministic)."""
    if _numel(args.out) == 0:
        return
    do, q, k, v, out, lse, mask = (as_torch(t) for t in args.inputs)
    at = args.attrs
    packed = as_torch(args.out)
    q4, k4, v4 = _view4(q), _view4(k), _view4(v)
    a, b, c = at["sizes"]
    dq = packed[:a].view(q4.shape)
    dk = packed[a : a + b].view(k4.shape)
    dv = packed[a + b : a + b + c].view(v4.shape)
    B, H = _batch4(at["batch"])
    if at["L"] == 0 or B * H == 0:
        dk.zero_()
        dv.zero_()
        return
    flash.backward(_view4(do), q4, k4, v4, _view4(out), lse.reshape(-1), _mask4(mask, (B, H), at["L"], at["S"]),
                   at["is_causal"], at["scale"], dq, dk, dv, args.config.params["bwd"])  # fmt: skip
