"""Triton linear_cross_entropy and its backward: cuBLAS GEMMs (through torch) over chunks of rows, and one
Triton kernel per chunk that turns the chunk's logits into row losses and, in place, into logit gradients.

Per chunk of C rows: logits = hidden_c @ weight.T (+ bias) in the inputs' dtype, into a (C, V) buffer; the row
kernel reads each row (once when V <= MAX_ONE_PASS fits in registers, else an online max/sum pass and a
gradient pass), writes the row's loss and overwrites the logits with (eps = label_smoothing, t the row's target)
    d loss / d z_j = scale_r * (softmax_j * (1 + 2 z_loss_scale lse) - eps / V - (1 - eps) [j = t])
(0 for ignored rows, NaN for a target out of range); then grad_hidden_c = dz @ weight (one GEMM into the
output rows) and grad_weight += dz.T @ hidden_c, accumulated in fp32 across chunks (cuBLAS with beta = 1 where
PyTorch offers an fp32-output GEMM of half inputs, else via an fp32 product), grad_bias += the column sums.

On a CUDA device an odd vocabulary is padded with zero weight rows (`_padded_rows`); the padded columns'
gradients are never summed. Only one (C, V) logits chunk is alive: C is chosen so that it takes
LOGITS_CHUNK_BYTES at most (256 MiB: 4096 rows of a 32000-token vocabulary in bf16), for the chunk is part of a
training step's peak memory, but at least MIN_CHUNK_ROWS rows. Each chunk reads and writes the fp32 grad_weight
sum once (8 * V * H bytes), which is why fewer, larger chunks are faster. Forward + backward of 8192 bf16 rows
on an H200 (benchmarks/probes/lce_vocab_timing.py, budgets of 64 / 128 / 256 / 512 MiB): Llama's vocabulary
(32000 x 1024) 4.18 / 3.66 / 3.45 / 3.12 ms for +0.18 / 0.24 / 0.37 / 0.49 GiB of peak (inductor's unchunked
code 2.89 ms, +0.49 GiB); GPT-2's (50257 x 768) 5.46 / 5.11 / 4.66 / 4.42 ms (inductor 17.5 ms standalone).
256 MiB keeps the patched Llama step's peak under Liger-Kernel's (5.08 GiB at 64 MiB, Liger 5.37).
An fp32 gradient buffer (a master weight's) is the sum itself. Scratch
buffers come from PyTorch's caching allocator (transient: the step's backward reuses them), not the runtime's
per-thread workspace, which would hold them for good. Nothing syncs with the host: counts and scales stay on
the device, so a CUDA graph can capture the whole op.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, INTERPRET, as_torch, launch, next_pow2, no_negative_strides

LOGITS_CHUNK_BYTES = 256 << 20
MIN_CHUNK_ROWS = 1024  # below this the fp32 weight-gradient sum's traffic per chunk outweighs its GEMM
MAX_ONE_PASS = 32768  # vocabulary entries of a row kept in registers
LOOP_BLOCK = 8192
VOCAB_ALIGN = 64  # the GEMMs run on a vocabulary padded to a multiple of this (`_padded_rows`)
PAD_DEVICES = ("cuda",)  # where it pads (the tests add "cpu" to run the padded path under the interpreter)


@triton.jit
def _ce_rows_kernel(
    z_ptr, target_ptr, loss_ptr, scale_ptr, V, width, stride_z, scale_stride, ignore_index, smoothing,
    z_loss_scale, HAS_LOSS: tl.constexpr, HAS_GRAD: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One program per row of a logits chunk: its loss (HAS_LOSS) and its logit gradient in place (HAS_GRAD).

    The row holds `width` >= V columns: a padded vocabulary's extra ones (`_padded_rows`) are loaded with the
    rest, ignored in the sums and given gradient 0. Loads and stores are masked by `width`, a multiple of 16 when
    padded, which lets Triton vectorize them: masked by an odd V (GPT-2's 50257) they went one element at a time,
    3x slower (benchmarks/probes/lce_head_tuning.py)."""
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * stride_z
    t = tl.load(target_ptr + row).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    cols = tl.arange(0, BLOCK_V)
    if ONE_PASS:
        mask = cols < width
        real = cols < V
        z = tl.load(z_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        z = tl.where(real, z, float("-inf"))
        m = tl.max(z, axis=0)
        e = tl.exp(z - m)
        total_exp = tl.sum(e, axis=0)
        total = tl.sum(tl.where(real, z, 0.0), axis=0)
    else:
        m = float("-inf")
        total_exp = 0.0
        total = 0.0
        for start in range(0, width, BLOCK_V):
            c = start + cols
            real = c < V
            z = tl.load(z_row + c, mask=c < width, other=float("-inf")).to(tl.float32)
            z = tl.where(real, z, float("-inf"))
            new_m = tl.maximum(m, tl.max(z, axis=0))
            shift = tl.where(new_m == float("-inf"), 0.0, new_m)  # a block of -inf only: nothing to rescale
            total_exp = total_exp * tl.exp(m - shift) + tl.sum(tl.exp(z - shift), axis=0)
            m = new_m
            total += tl.sum(tl.where(real, z, 0.0), axis=0)
    lse = m + tl.log(total_exp)
    if HAS_LOSS:
        z_t = tl.load(z_row + t, mask=valid & in_range, other=0.0).to(tl.float32)
        loss = (1.0 - smoothing) * (lse - z_t) + smoothing * (lse - total / V) + z_loss_scale * lse * lse
        tl.store(loss_ptr + row, tl.where(valid, tl.where(in_range, loss, float("nan")), 0.0))
    if HAS_GRAD:
        scale = tl.load(scale_ptr + row * scale_stride).to(tl.float32)
        scale = tl.where(valid, tl.where(in_range, scale, float("nan")), 0.0)
        coef = 1.0 + 2.0 * z_loss_scale * lse
        if ONE_PASS:
            g = (e / total_exp) * coef - smoothing / V - tl.where(cols == t, 1.0 - smoothing, 0.0)
            g = tl.where(real, g * scale, 0.0)
            tl.store(z_row + cols, g.to(z_ptr.dtype.element_ty), mask=mask)
        else:
            for start in range(0, width, BLOCK_V):
                c = start + cols
                mask = c < width
                z = tl.load(z_row + c, mask=mask, other=0.0).to(tl.float32)
                g = tl.exp(z - lse) * coef - smoothing / V - tl.where(c == t, 1.0 - smoothing, 0.0)
                g = tl.where(c < V, g * scale, 0.0)
                tl.store(z_row + c, g.to(z_ptr.dtype.element_ty), mask=mask)


def launch_config(ctx: DispatchContext) -> LaunchConfig:
    at = ctx.attrs
    rows, vocab = at["rows"], at["vocab"]
    per_row = vocab * ctx.tensor("hidden").itemsize
    chunk = max(1, min(rows, max(MIN_CHUNK_ROWS, LOGITS_CHUNK_BYTES // per_row)))
    if chunk >= 128:
        chunk -= chunk % 128
    one_pass = next_pow2(vocab) <= MAX_ONE_PASS
    block = next_pow2(vocab) if one_pass else LOOP_BLOCK
    warps = 1 if INTERPRET else max(4, min(32, block // 1024))
    params = dict(chunk=chunk, ONE_PASS=one_pass, BLOCK_V=block, num_warps=warps)
    return LaunchConfig(grid=(chunk,), block=(32 * warps,), params=params)


@functools.cache
def _fp32_output_gemm(device: str) -> bool:
    """Whether torch.addmm(acc, a, b, out_dtype=float32, out=acc) adds half products into fp32 here (CUDA,
    PyTorch >= 2.8): tried once per device, on a small problem. (Its beta=0 is not relied on: on an H200 with
    PyTorch 2.11 the fp16 head's gradients went wrong when each sum's first chunk was written with beta=0, and
    came right once the sum is zeroed and added to; the exact cause was not isolated.)"""
    try:
        a = torch.ones((2, 16), dtype=torch.bfloat16, device=device)
        acc = torch.ones((2, 2), dtype=torch.float32, device=device)
        torch.addmm(acc, a, a.t(), out_dtype=torch.float32, out=acc)
        return bool((acc == 17).all())
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _fp32_gemm_known(device: torch.device) -> bool:
    """_fp32_output_gemm, but never first asked during a CUDA graph capture (its check reads the result)."""
    if device.type != "cuda":
        return False
    if torch.cuda.is_current_stream_capturing() and _fp32_output_gemm.cache_info().currsize == 0:
        return False
    return _fp32_output_gemm(str(device))


def _product_into(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, add: bool) -> None:
    """acc = a @ b (add=False) or acc += a @ b: one GEMM into acc where its dtype is a's (beta = 0 or 1) or
    PyTorch can add half products into fp32 (acc zeroed first), else the product in a's dtype (each chunk's
    share rounded once)."""
    if a.dtype == acc.dtype:
        torch.addmm(acc, a, b, beta=int(add), out=acc)
    elif _fp32_gemm_known(acc.device):
        if not add:
            acc.zero_()
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    elif add:
        acc += torch.mm(a, b)
    else:
        acc.copy_(torch.mm(a, b))


class _Chunks:
    """One call's tensors in launch form, and the per-chunk steps."""

    def __init__(self, args: ArgPack, hidden: Any, weight: Any, target: Any, bias: Any) -> None:
        at = args.attrs
        self.at, self.params = at, args.config.params
        self.n, self.vocab, self.width = at["rows"], at["vocab"], at["hidden"]
        self.hidden = as_torch(hidden).reshape(self.n, self.width)
        self.weight, self.bias = _padded_rows(as_torch(weight), self.vocab), _padded_rows(as_torch(bias), self.vocab)
        self.target = as_torch(target).reshape(self.n).contiguous()
        self.valid = self.target != at["ignore_index"]
        chunk = min(self.params["chunk"], self.n)
        self.logits = torch.empty((chunk, self.weight.shape[0]), dtype=self.hidden.dtype, device=self.hidden.device)

    def scale(self, grad_loss: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """(each row's factor on its logit gradient, its stride): the upstream gradient (1 in the forward),
        over the count of rows not ignored for "mean"; all on the device."""
        device = self.hidden.device
        g = torch.ones((), dtype=torch.float32, device=device) if grad_loss is None else grad_loss.float()
        if self.at["reduction"] == "mean":
            g = g / self.valid.sum().clamp_min(1).float()
        return (g.reshape(self.n).contiguous(), 1) if g.dim() else (g, 0)

    def run(self, losses: torch.Tensor | None, scale: tuple[torch.Tensor, int] | None, grads: tuple) -> None:
        """Every chunk: logits, row kernel, and the gradient GEMMs for the buffers in `grads`.

        A factor shared by every row ("mean" / "sum" of a scalar loss) goes into the logit gradients with the
        per-row ones, except in fp16: "mean" over thousands of rows would flush fp16 logit gradients (~1 / (V *
        rows)) to zero, so there it is applied in fp32 after the GEMMs (bf16 has fp32's exponent range; applying
        it afterwards cost three more passes over the gradients: 0.4 ms of a 4 ms Llama head on an H200)."""
        grad_hidden, grad_weight, grad_bias = grads
        step = self.logits.shape[0]
        factor = None
        if scale is not None and not scale[1] and self.logits.dtype == torch.float16:
            factor, scale = scale[0], (torch.ones((), dtype=torch.float32, device=scale[0].device), 0)
        accumulators = [self._accumulator(g, step, factor) for g in (grad_weight, grad_bias)]
        for start in range(0, self.n, step):
            rows = self.hidden[start : start + step]
            z = self.logits[: rows.shape[0]]
            if self.bias is None:
                torch.mm(rows, self.weight.t(), out=z)
            else:
                torch.addmm(self.bias, rows, self.weight.t(), out=z)
            self._row_kernel(z, start, losses, scale)
            if scale is None:
                continue
            if grad_hidden is not None:
                out_rows = grad_hidden.view(self.n, self.width)[start : start + rows.shape[0]]
                torch.mm(z, self.weight, out=out_rows)
                _scaled(out_rows, factor)
            dz_t = z[:, : self.vocab].t()  # a padded vocabulary's extra columns have no gradient to keep
            if accumulators[0] is not None:
                _weight_grad_into(accumulators[0], dz_t, rows, add=start > 0)
            if accumulators[1] is not None:
                _column_sums_into(accumulators[1], dz_t, add=start > 0)
        for acc, buffer in zip(accumulators, (grad_weight, grad_bias)):
            if acc is None:
                continue
            _scaled(acc, factor)
            if acc is not buffer:
                buffer.copy_(acc)

    def _accumulator(self, buffer: torch.Tensor | None, step: int, factor: Any) -> torch.Tensor | None:
        """Where a parameter gradient sums over chunks (the first chunk writes it): the buffer itself when it is
        fp32 (a master weight's gradient), or when there is one chunk and no factor to apply after it; else an
        fp32 sum."""
        if buffer is None:
            return None
        if buffer.dtype == torch.float32 or (self.n <= step and factor is None):
            return buffer
        return torch.empty(buffer.shape, dtype=torch.float32, device=buffer.device)

    def _row_kernel(self, z: torch.Tensor, start: int, losses: torch.Tensor | None, scale: Any) -> None:
        p, at = self.params, self.at
        c = z.shape[0]
        scale_t, scale_stride = scale if scale is not None else (z, 0)
        if scale is not None and scale_stride:
            scale_t = scale_t[start:]
        launch(
            _ce_rows_kernel, (c,), z, self.target[start:], z if losses is None else losses[start:], scale_t,
            self.vocab, z.shape[1], z.stride(0), scale_stride, at["ignore_index"], at["label_smoothing"],
            at["z_loss_scale"],
            HAS_LOSS=losses is not None, HAS_GRAD=scale is not None, ONE_PASS=p["ONE_PASS"], BLOCK_V=p["BLOCK_V"],
            num_warps=p["num_warps"],
        )  # fmt: skip


def _weight_grad_into(acc: torch.Tensor, dz_t: torch.Tensor, rows: torch.Tensor, add: bool) -> None:
    """acc (V, H) = (or +=) dz_t @ rows, as two GEMMs where V is not a multiple of VOCAB_ALIGN: its aligned part
    and the tail rows. One GEMM over an odd V (GPT-2's 50257) got a slower cuBLAS kernel on an H200: 228 us per
    1024-row chunk against 188 for the two (benchmarks/probes/lce_head_tuning.py)."""
    vocab = acc.shape[0]
    aligned = vocab - vocab % VOCAB_ALIGN
    if aligned in (0, vocab) or acc.device.type not in PAD_DEVICES:
        _product_into(acc, dz_t, rows, add)
        return
    _product_into(acc[:aligned], dz_t[:aligned], rows, add)
    _product_into(acc[aligned:], dz_t[aligned:], rows, add)


def _column_sums_into(acc: torch.Tensor, dz_t: torch.Tensor, add: bool) -> None:
    """acc = (or +=) the row sums of dz_t, in fp32: a bias gradient's share of one chunk."""
    sums = dz_t.sum(dim=1, dtype=torch.float32)
    if add:
        acc += sums
    else:
        acc.copy_(sums)


def _scaled(t: torch.Tensor, factor: torch.Tensor | None) -> None:
    """t *= factor (a 0-d fp32 device tensor), computed in fp32 whatever t's dtype (a half t would take the factor
    in its own dtype, where a tiny one is zero)."""
    if factor is None:
        return
    if t.dtype == torch.float32:
        t.mul_(factor)
    else:
        t.copy_(t.float().mul_(factor))


def _padded_rows(t: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """The weight (or bias) with zero rows up to a multiple of VOCAB_ALIGN on a CUDA device: the three GEMMs then
    run cuBLAS's fast kernels (an odd vocabulary, GPT-2's 50257, made them ~3.5x slower on an H200). The extra
    logits are exactly 0, the row kernel never reads them, and their gradient rows are dropped."""
    pad = -vocab % VOCAB_ALIGN
    if t is None or not pad or t.device.type not in PAD_DEVICES:
        return t
    return torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])


def _zero(buffers: tuple) -> None:
    for b in buffers:
        if b is not None:
            b.zero_()


def _loss_into(out: torch.Tensor, losses: torch.Tensor, chunks: _Chunks) -> None:
    reduction = chunks.at["reduction"]
    if reduction == "none":
        if losses.data_ptr() != out.data_ptr():
            out.copy_(losses.view(out.shape))
        return
    total = losses.sum()
    if reduction == "mean":
        total = total / chunks.valid.sum()  # 0 / 0 = NaN when every row is ignored, as PyTorch
    out.copy_(total)


def _row_losses(out: torch.Tensor, chunks: _Chunks) -> torch.Tensor:
    """Where the row losses go: `out` itself for reduction="none" when it is a contiguous fp32 array."""
    if chunks.at["reduction"] == "none" and out.is_contiguous():
        return out.view(chunks.n)
    return torch.empty(chunks.n, dtype=torch.float32, device=out.device)


_HINTS = dict(backend="triton", dtypes=FLOAT_DTYPES, priority=30, launch_config=launch_config,
              conditions=(no_negative_strides,), fused=True)  # fmt: skip


@kernel("linear_cross_entropy", "triton", **_HINTS)
def linear_cross_entropy_triton(args: ArgPack) -> None:
    """Chunked logits (cuBLAS), row losses and in-place logit gradients (Triton), gradient GEMMs per chunk."""
    hidden, weight, target, bias, *grads = args.inputs
    chunks = _Chunks(args, hidden, weight, target, bias)
    out = as_torch(args.out)
    grads = tuple(as_torch(g) for g in grads)
    if chunks.n == 0:
        _zero(grads)
        _loss_into(out, torch.zeros(0, dtype=torch.float32, device=out.device), chunks)
        return
    losses = _row_losses(out, chunks)
    chunks.run(losses, chunks.scale(None) if any(g is not None for g in grads) else None, grads)
    _loss_into(out, losses, chunks)


@kernel("linear_cross_entropy_backward", "triton", **_HINTS)
def linear_cross_entropy_backward_triton(args: ArgPack) -> None:
    """The logits again per chunk, their gradients in place, and the gradient GEMMs."""
    grad_loss, hidden, weight, target, bias, grad_weight, grad_bias = args.inputs
    chunks = _Chunks(args, hidden, weight, target, bias)
    out = as_torch(args.out)
    grads = (out, as_torch(grad_weight), as_torch(grad_bias))
    if chunks.n == 0:
        _zero(grads)
        return
    direct = out.is_contiguous()
    grad_hidden = out if direct else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    chunks.run(None, chunks.scale(as_torch(grad_loss)), (grad_hidden, *grads[1:]))
    if not direct:
        out.copy_(grad_hidden)
