"""PyTorch's fused SDPA backends as candidates for the training ops `attention_forward` and `attention_backward`.

Each kernel calls the aten op behind one SDPA backend directly (the ops autograd saves and replays):
`torch_flash` (aten._scaled_dot_product_flash_attention / _backward, FlashAttention-2) and `torch_cudnn`
(aten._scaled_dot_product_cudnn_attention / _backward). Only arguments whose meaning is the same in
PyTorch 2.11 and later are passed. (PyTorch's memory-efficient backend is no candidate here: its backward
gave wrong gradients on an H100 with PyTorch 2.11 and it was never the fastest; the `attention` op keeps it.)

Ranking (auto): torch_cudnn (25) > flash_v2 (20) > torch_flash (15), by forward+backward on an H100 (bf16
B4 H16 S2048, ms): D128 cuDNN 1.05, flash_v2 1.25, torch_flash 1.83; D64 causal 0.57, 0.71, 0.69; GQA
H16/4 D128 flash_v2 1.22, torch_flash 1.84. So auto takes cuDNN where it runs, else flash_v2, else
torch_flash.

The logsumexp. The op's `lse` is float32 for the fp16/bf16 inputs these kernels take (float64 only for
float64 inputs, which go to the CPU kernels), contiguous, shape (*batch, L): the natural-log logsumexp of
each row of scaled, masked scores (flash_v2 and the CPU kernel write the same). The backends' formats:
- flash: [B, H, L] float32, natural log of the scaled scores: the op's format as it is.
- cuDNN: [B, H, L, 1] float32 ("softmax stats", natural log of the scaled scores): the same values with a
  trailing unit dim; the backward gets the op's buffer viewed as [B, H, L, 1].
So every backward accepts any kernel's forward (flash_v2, math or the other of these): the pairing the
dispatcher makes under auto, a policy or autotune never depends on which forward ran.

Neither kernel takes a mask, so no row sees no key (causal masks are aligned top-left: row i sees key 0).
Dropout is always 0 here, so the philox seed/offset the backward ops take are never read: uninitialized
scalars are passed (no fill kernel, safe under CUDA graph capture). Grouped-query attention: both take
fewer key/value heads natively, forward and backward (cuDNN since PyTorch 2.8, pytorch/pytorch#150337: this
is PyTorch's default backend for GQA on the H100, 0.97 ms at the bench's GQA row against flash_v2's 1.26).
Both decline L = S = 1 (cuDNN's frontend rejects s_q = s_kv = 1; PyTorch's flash failed there too).

Copies (beyond what the aten ops do themselves):
- forward, out: none without out=: the forward kernels are `returns_output` and give the aten op's own
  output; one copy into a caller's `out=` buffer (aten ops take no output buffers).
- forward, lse: one copy of B*H*L floats from the backend's logsumexp into the op's `lse` buffer (an input
  the caller allocated, so it cannot be adopted); small next to the attention.
- backward, lse: none (a view) unless a caller passes a strided lse.
- backward, out / grad_out (cuDNN): none when dense in q's dimension order (what the cuDNN forward
  writes); else one copy into that layout, since cuDNN's backward caches its graph by q/k/v strides only
  and reads out and grad_out in the layout of the graph it built (PyTorch permutes grad_out the same way).
  flash: none unless the last dim is strided.
- backward, dq / dk / dv: none without out=: both backward kernels are declared `returns_output=True`
  and return the aten op's own three tensors as the tuple (dq, dk, dv) (laid out as aten made them, e.g.
  like q for a [B, S, H, D] view). Only a caller's packed out= buffer [dq | dk | dv] gets them copied:
  one torch.cat when all three are contiguous, a copy each otherwise. That packing used to run on every
  call: at bf16 B4 H16 S2048 D128 it moved 3 x 32 MB each way, about 60 us.
Measured on an H100 (PyTorch 2.11, B4 H16 S2048 fwd+bwd): the GPU kernels of this pair and of PyTorch's
SDPA-cuDNN with autograd are the same cuDNN kernels to 0.5 % (904 vs 909 us at D128; the 1.8 us lse copy
the only extra one: `benchmarks/probes/cudnn_pair_trace.py`). Timed per call from a cold L2 with the host
latency before the first launch hidden (`xpuruntime bench`'s device timer), the pair under
autotune is within 0.3-0.8 % of SDPA's time at every S2048 row. Under do_bench it read 3-8 % slower: that
latency (about 0.2-0.3 ms of Python per fwd+bwd enqueue, as much as SDPA's autograd path) counts there
whenever it outlasts the L2 flush (`benchmarks/probes/attention_pair_host.py`).
"""

from __future__ import annotations

import functools

import torch

from ...abi import ArgPack
from ...context import DispatchContext
from ...registry import kernel
from .attention import (
    _causal_square,
    _flash_causal_square,
    _head_dim,
    _last_dim_contiguous,
    _no_mask,
    _nonempty,
    _scale_not_negative,
    _sm80,
    cudnn_forward,
    flash_forward,
)
from .common import HALF_DTYPES, returned

aten = torch.ops.aten


# ----------------------------------------------------------------------------------------------- conditions


def _rank(ctx: DispatchContext) -> str | None:
    for name in ("q", "k", "v"):
        if ctx.tensor(name).ndim > 4:
            return f"'{name}' has {ctx.tensor(name).ndim} dims; at most 2 batch dims ([B, H, S, D])"
    return None


def _not_single(ctx: DispatchContext) -> str | None:
    """One query and one key: cuDNN's frontend raises "s_q = s_kv = 1 is not supported" and PyTorch's flash
    kernels failed there too (H100, PyTorch 2.11); flash_v2 or math take it."""
    at = ctx.attrs
    if at["L"] == 1 and at["S"] == 1:
        return "L = S = 1 (a single query and key): not supported by this fused kernel"
    return None


FLASH_CONDITIONS = (
    _sm80, _rank, _last_dim_contiguous, _no_mask, _head_dim(256, 8), _flash_causal_square, _scale_not_negative,
    _nonempty, _not_single,
)  # fmt: skip
CUDNN_CONDITIONS = (
    _sm80, _rank, _last_dim_contiguous, _no_mask, _head_dim(128, 8), _causal_square, _scale_not_negative,
    _nonempty, _not_single,
)  # fmt: skip


# ----------------------------------------------------------------------------------------------- layouts


def _view4(t: torch.Tensor) -> torch.Tensor:
    """(..., S, D) with at most 2 batch dims -> [B, H, S, D] (a view)."""
    return t.reshape((1,) * (4 - t.ndim) + tuple(t.shape)) if t.ndim < 4 else t


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _dense_strides(shape: tuple[int, ...], like: torch.Tensor) -> tuple[int, ...]:
    """Dense strides for `shape` in the dimension order of `like` (innermost = smallest stride), as
    PyTorch's cuDNN path lays out its output (alloc_with_matching_layout)."""
    order = sorted(range(len(shape)), key=like.stride)  # innermost first; ties keep index order, as PyTorch
    strides = [0] * len(shape)
    step = 1
    for i in order:
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def _same_strides(t: torch.Tensor, strides: tuple[int, ...]) -> bool:
    return all(n <= 1 or s == w for n, s, w in zip(t.shape, t.stride(), strides))


def _in_layout_of(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`t` itself when it is dense in `like`'s dimension order, else a copy laid out so.

    cuDNN's backward caches its graph by q/k/v strides only, so out and grad_out must always come in one
    layout per q layout: the one its forward produces."""
    strides = _dense_strides(tuple(t.shape), like)
    if _same_strides(t, strides):
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


@functools.cache
def _unused_rng(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The philox seed and offset a backward takes; never read with dropout 0 (so left uninitialized, and
    made once per device: two allocations less per call)."""
    return torch.empty((), dtype=torch.int64, device=device), torch.empty((), dtype=torch.int64, device=device)


def _lse3(lse: torch.Tensor, q4: torch.Tensor) -> torch.Tensor:
    """The op's logsumexp as a contiguous [B, H, L] (a view unless a caller passed a strided one)."""
    return lse.reshape(q4.shape[:3]).contiguous()


def _pack_into(args: ArgPack, q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, grads: tuple) -> None:
    """dq, dk, dv into a caller's packed out=: one cat kernel when all three are contiguous (the usual case),
    else a copy each (a gradient laid out like a [B, S, H, D] view is transposed on the way)."""
    packed = args.out
    if all(g.is_contiguous() for g in grads[:3]):
        torch.cat([g.view(-1) for g in grads[:3]], out=packed)
        return
    a, b, c = args.attrs["sizes"]
    packed[:a].view(q4.shape).copy_(grads[0])
    packed[a : a + b].view(k4.shape).copy_(grads[1])
    packed[a + b : a + b + c].view(v4.shape).copy_(grads[2])


def _run_forward(args: ArgPack, forward) -> torch.Tensor:
    """The op's lse, and out (aten's own, or copied into args.out) from a backend's
    forward(q4, k4, v4, causal, scale) -> (out4, its logsumexp)."""
    q, k, v, _, lse = args.inputs
    at = args.attrs
    q4 = _view4(q)
    out4, stats = forward(q4, _view4(k), _view4(v), at["is_causal"], at["scale"])
    lse.view(q4.shape[:3]).copy_(stats.reshape(q4.shape[:3]))
    return returned(args, out4 if q.dim() == 4 else out4.view(*q.shape[:-1], out4.shape[-1]))


def _run_backward(args: ArgPack, backward) -> tuple | None:
    """(dq, dk, dv) from a backend's backward(do4, q4, k4, v4, o4, lse [B, H, L], causal, scale): the aten
    op's own tensors returned (no out=: the kernels are returns_output), else packed into args.out."""
    do, q, k, v, out, lse, _ = args.inputs
    at = args.attrs
    q4, k4, v4 = _view4(q), _view4(k), _view4(v)
    grads = backward(_view4(do), q4, k4, v4, _view4(out), _lse3(lse, q4), at["is_causal"], at["scale"])
    if args.out is None:
        if q.dim() == k.dim() == v.dim() == 4:
            return grads[:3]
        return grads[0].view(q.shape), grads[1].view(k.shape), grads[2].view(v.shape)
    _pack_into(args, q4, k4, v4, grads)
    return None


# ----------------------------------------------------------------------------------------------- flash


def flash_backward(do4, q4, k4, v4, o4, lse3, causal: bool, scale: float):
    seed, offset = _unused_rng(q4.device)
    do4, o4 = _unit_last(do4), _unit_last(o4)
    L, S = q4.shape[2], k4.shape[2]
    return aten._scaled_dot_product_flash_attention_backward.default(
        do4, q4, k4, v4, o4, lse3, None, None, L, S, 0.0, causal, seed, offset, scale=scale
    )


@kernel(
    "attention_forward", "torch_flash", backend="torch", dtypes=HALF_DTYPES, priority=15, fused=True,
    tensor_cores=True, conditions=FLASH_CONDITIONS, returns_output=True,
)  # fmt: skip
def attention_forward_torch_flash(args: ArgPack) -> torch.Tensor:
    """PyTorch's FlashAttention-2 forward (aten._scaled_dot_product_flash_attention); GQA natively."""
    return _run_forward(args, flash_forward)


@kernel(
    "attention_backward", "torch_flash", backend="torch", dtypes=HALF_DTYPES, priority=15, fused=True,
    tensor_cores=True, deterministic=False, conditions=FLASH_CONDITIONS, returns_output=True,
)  # fmt: skip
def attention_backward_torch_flash(args: ArgPack) -> tuple | None:
    """PyTorch's FlashAttention-2 backward; takes any forward's (out, lse) (lse is the op's [B, H, L])."""
    return _run_backward(args, flash_backward)


# ----------------------------------------------------------------------------------------------- cuDNN


@functools.cache
def _cudnn_stats_rank() -> int:
    """The rank of the logsumexp cuDNN's forward returns ([B, H, L, 1] so far), from its meta kernel."""
    try:
        t = torch.empty((1, 1, 8, 8), dtype=torch.float16, device="meta")
        stats = aten._scaled_dot_product_cudnn_attention.default(t, t, t, None, True, 0.0, False, False)[1]
        return stats.dim()
    except Exception:
        return 4


def cudnn_backward(do4, q4, k4, v4, o4, lse3, causal: bool, scale: float):
    seed, offset = _unused_rng(q4.device)
    o4 = _in_layout_of(o4, q4)
    do4 = _in_layout_of(do4, o4)  # PyTorch would permute it to out's layout itself, with a warning
    stats = lse3.unsqueeze(-1) if _cudnn_stats_rank() == 4 else lse3
    L, S = q4.shape[2], k4.shape[2]
    return aten._scaled_dot_product_cudnn_attention_backward.default(
        do4, q4, k4, v4, o4, stats, seed, offset, None, None, None, L, S, 0.0, causal, scale=scale
    )


@kernel(
    "attention_forward", "torch_cudnn", backend="torch", dtypes=HALF_DTYPES, priority=25, fused=True,
    tensor_cores=True, conditions=CUDNN_CONDITIONS, returns_output=True,
)  # fmt: skip
def attention_forward_torch_cudnn(args: ArgPack) -> torch.Tensor:
    """cuDNN's fused attention forward with its softmax stats (PyTorch's default SDPA backend on the H100)."""
    return _run_forward(args, cudnn_forward)


@kernel(
    "attention_backward", "torch_cudnn", backend="torch", dtypes=HALF_DTYPES, priority=25, fused=True,
    tensor_cores=True, deterministic=False, conditions=CUDNN_CONDITIONS, returns_output=True,
)  # fmt: skip
def attention_backward_torch_cudnn(args: ArgPack) -> tuple | None:
    """cuDNN's fused attention backward; takes any forward's (out, lse) (lse viewed as [B, H, L, 1])."""
    return _run_backward(args, cudnn_backward)


__all__ = ["cudnn_backward", "flash_backward"]
