"""Triton swiglu / geglu, forward and backward: one pass over (rows, hidden) tiles, fp32 math.

Memory-bound: the forward reads gate and up and writes y (3 accesses per element), the backward reads dy,
gate and up and writes dgate and dup (5). Each program takes a [BLOCK_M, BLOCK_H] tile of ~4096 elements;
rows of the packed [gate | up] form are two strided halves of one row. The activation is rounded to the
input dtype before the product, and the backward follows autograd through those roundings (ops/glu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, as_torch, launch, next_pow2, no_negative_strides
from .elementwise import _tanh

TILE_ELEMENTS = 4096
MAX_BLOCK_H = 1024
SILU, GELU, GELU_TANH = 0, 1, 2
ACTIVATIONS = {"silu": SILU, "none": GELU, "tanh": GELU_TANH}


@triton.jit
def _activation(g, ACT: tl.constexpr):
    """(act(g), sigmoid(g) for SiLU) in fp32, by PyTorch's formulas."""
    if ACT == 0:
        e = tl.exp(-g)
        return g / (1.0 + e), 1.0 / (1.0 + e)
    elif ACT == 1:
        return 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476)), g
    else:
        return 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))), g


@triton.jit
def _derivative(g, sigmoid, ACT: tl.constexpr):
    """d act / d g in fp32 (PyTorch's silu_backward / gelu_backward)."""
    if ACT == 0:
        return sigmoid * (1.0 + g * (1.0 - sigmoid))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(g * 0.7071067811865476))
        return cdf + g * tl.exp(-0.5 * g * g) * 0.3989422804014327
    else:
        t = _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))
        return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * g * g)


@triton.jit
def _tile(pid, M, H, n_h_blocks, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = ((pid // n_h_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = ((pid % n_h_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    return rows[:, None], cols[None, :], (rows < M)[:, None] & (cols < H)[None, :]


@triton.jit
def _glu_fwd_kernel(
    g_ptr, u_ptr, y_ptr, M, H, n_h_blocks, sgm, sgh, sum_, suh, sym, syh,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    rows, cols, mask = _tile(tl.program_id(0), M, H, n_h_blocks, BLOCK_M, BLOCK_H)
    g = tl.load(g_ptr + rows * sgm + cols * sgh, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rows * sum_ + cols * suh, mask=mask, other=0.0).to(tl.float32)
    a, _ = _activation(g, ACT)
    a = a.to(y_ptr.dtype.element_ty).to(tl.float32)  # as PyTorch stores act(gate) before the product
    tl.store(y_ptr + rows * sym + cols * syh, (a * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd_kernel(
    dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, M, H, n_h_blocks, sdym, sdyh, sgm, sgh, sum_, suh, sdm, sdh,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """dgate and dup share strides (sdm, sdh): two halves of one packed output."""
    rows, cols, mask = _tile(tl.program_id(0), M, H, n_h_blocks, BLOCK_M, BLOCK_H)
    dtype = dg_ptr.dtype.element_ty
    dy = tl.load(dy_ptr + rows * sdym + cols * sdyh, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows * sgm + cols * sgh, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rows * sum_ + cols * suh, mask=mask, other=0.0).to(tl.float32)
    a, sigmoid = _activation(g, ACT)
    du = dy * a.to(dtype).to(tl.float32)
    dg = (dy * u).to(dtype).to(tl.float32) * _derivative(g, sigmoid, ACT)
    tl.store(dg_ptr + rows * sdm + cols * sdh, dg.to(dtype), mask=mask)
    tl.store(du_ptr + rows * sdm + cols * sdh, du.to(dtype), mask=mask)


def launch_config(ctx: DispatchContext) -> LaunchConfig:
    m, h = ctx.attrs["rows"], ctx.attrs["hidden"]
    block_h = min(next_pow2(h), MAX_BLOCK_H)
    block_m = max(1, min(next_pow2(m), TILE_ELEMENTS // block_h))
    n_h = triton.cdiv(h, block_h)
    act = ACTIVATIONS[ctx.attrs.get("approximate", "silu")] if ctx.op.startswith("geglu") else SILU
    params = dict(M=m, H=h, n_h=n_h, ACT=act, BLOCK_M=block_m, BLOCK_H=block_h, num_warps=8 if h >= 512 else 4)
    return LaunchConfig(grid=(triton.cdiv(m, block_m) * n_h,), block=(32 * params["num_warps"],), params=params)


def _halves(gate: torch.Tensor, up: torch.Tensor | None, m: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) as (m, h) matrices: views of the two inputs, or of the packed one's halves."""
    if up is None:
        packed = gate.reshape(m, 2 * h)
        return packed[:, :h], packed[:, h:]
    return gate.reshape(m, h), up.reshape(m, h)


def _output_matrix(out: torch.Tensor, m: int, h: int) -> tuple[torch.Tensor, bool]:
    """(an (m, h) view of out, True) or (a fresh buffer to copy into out afterwards, False)."""
    try:
        return out.view(m, h), True
    except RuntimeError:
        return torch.empty((m, h), dtype=out.dtype, device=out.device), False


def _run_forward(args: ArgPack) -> None:
    p = args.config.params
    m, h = p["M"], p["H"]
    if m * h == 0:
        return
    g, u = _halves(as_torch(args.inputs[0]), as_torch(args.inputs[1]), m, h)
    out = as_torch(args.out)
    y, direct = _output_matrix(out, m, h)
    launch(
        _glu_fwd_kernel, args.config.grid, g, u, y, m, h, p["n_h"], *g.stride(), *u.stride(), *y.stride(),
        ACT=p["ACT"], BLOCK_M=p["BLOCK_M"], BLOCK_H=p["BLOCK_H"], num_warps=p["num_warps"],
    )  # fmt: skip
    if not direct:
        out.copy_(y.view(out.shape))


def _run_backward(args: ArgPack) -> None:
    p = args.config.params
    m, h = p["M"], p["H"]
    if m * h == 0:
        return
    dy_in, gate, up = (as_torch(t) for t in args.inputs)
    g, u = _halves(gate, up, m, h)
    dy = dy_in.reshape(m, h)
    out = as_torch(args.out)
    try:  # the packed gradient as (m, 2h) halves, or the stacked one as [dgate; dup] of (m, h) each
        grads = out.view(m, 2 * h) if up is None else out.view(2 * m, h)
        direct = True
    except RuntimeError:
        grads, direct = torch.empty((m, 2 * h) if up is None else (2 * m, h), dtype=out.dtype, device=out.device), False
    dg, du = (grads[:, :h], grads[:, h:]) if up is None else (grads[:m], grads[m:])
    launch(
        _glu_bwd_kernel, args.config.grid, dy, g, u, dg, du, m, h, p["n_h"],
        *dy.stride(), *g.stride(), *u.stride(), *dg.stride(),
        ACT=p["ACT"], BLOCK_M=p["BLOCK_M"], BLOCK_H=p["BLOCK_H"], num_warps=p["num_warps"],
    )  # fmt: skip
    if not direct:
        out.copy_(grads.view(out.shape))


_HINTS = dict(backend="triton", dtypes=FLOAT_DTYPES, priority=30, launch_config=launch_config,
              conditions=(no_negative_strides,), traceable=True)  # fmt: skip


@kernel("swiglu", "triton", **_HINTS)
def swiglu_triton(args: ArgPack) -> None:
    """One read of gate and up, one write of y."""
    _run_forward(args)


@kernel("geglu", "triton", **_HINTS)
def geglu_triton(args: ArgPack) -> None:
    """One read of gate and up, one write of y."""
    _run_forward(args)


@kernel("swiglu_backward", "triton", **_HINTS)
def swiglu_backward_triton(args: ArgPack) -> None:
    """One read of dy, gate and up; one write of dgate and dup."""
    _run_backward(args)


@kernel("geglu_backward", "triton", **_HINTS)
def geglu_backward_triton(args: ArgPack) -> None:
    """One read of dy, gate and up; one write of dgate and dup."""
    _run_backward(args)
