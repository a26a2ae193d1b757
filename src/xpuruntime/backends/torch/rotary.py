"""rotary_embedding and its backward as Hugging Face's apply_rotary_pos_emb computes them in PyTorch
(`q * cos + rotate_half(q) * sin`, in the dtype q and cos promote to), written into the packed output.
A position outside the cos/sin table gives NaN rows, as the op defines (indexing would raise on the device)."""

from __future__ import annotations

from typing import Any

import torch

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES


def table(t: torch.Tensor, position_ids: torch.Tensor | None, axis: int) -> torch.Tensor:
    """cos or sin as HF applies it: rows gathered by position_ids (NaN where out of range), unsqueezed at `axis`."""
    if position_ids is not None:
        valid = (position_ids >= 0) & (position_ids < t.shape[0])
        rows = t[torch.where(valid, position_ids, 0)]
        t = torch.where(valid[..., None], rows, torch.full((), float("nan"), dtype=t.dtype, device=t.device))
    return t.unsqueeze(axis)


def _rotated(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, backward: bool) -> torch.Tensor:
    """x * cos + rotate(x) * sin over the rotary dims (backward: the transpose, dy * cos - rotate(dy * sin))."""
    r = cos.shape[-1]
    part = x[..., :r]
    y = part * cos - _rotated(part * sin, interleaved) if backward else part * cos + _rotated(part, interleaved) * sin
    return torch.cat((y.to(x.dtype), x[..., r:]), dim=-1) if r < x.shape[-1] else y.to(x.dtype)


def _run(args: ArgPack, backward: bool) -> None:
    q, k, cos, sin, position_ids = args.inputs
    at = args.attrs
    c, s = (table(t, position_ids, at["unsqueeze_dim"]) for t in (cos, sin))
    parts = [rotation(x, c, s, at["interleaved"], backward).reshape(-1) for x in (q, k)]
    out = args.out
    if out.is_contiguous():
        torch.cat(parts, out=out)
    else:
        out.copy_(torch.cat(parts))


_HINTS: dict[str, Any] = dict(backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, traceable=True)


@kernel("rotary_embedding", "torch", **_HINTS)
def rotary_embedding_torch(args: ArgPack) -> None:
    """q * cos + rotate(q) * sin and the same for k (HF's apply_rotary_pos_emb)."""
    _run(args, backward=False)


@kernel("rotary_embedding_backward", "torch", **_HINTS)
def rotary_embedding_backward_torch(args: ArgPack) -> None:
    """dq * cos - rotate(dq * sin) and the same for dk: autograd's gradient of the forward formula."""
    _run(args, backward=True)
