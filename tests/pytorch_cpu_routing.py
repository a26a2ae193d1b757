"""Test-only: a private registry whose kernels run PyTorch CPU code and count their calls, and a
fixture that routes CPU aten ops through it, so override routing is tested end to end without a GPU."""

from __future__ import annotations

import collections
import contextlib
import importlib
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator

import numpy as np
import torch

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime import autotune
from xpuruntime.dispatch import Dispatcher
from xpuruntime.pytorch import install, router, tuner
from xpuruntime.pytorch.state import STATE
from xpuruntime.registry import OPS_PACKAGE, Backend, Registry, _declared, _submodules, kernel
from xpuruntime.schema import OpSchema

CALLS: collections.Counter[str] = collections.Counter()
_DTYPES = {"float32", "float64", "bfloat16", "float16"}


def _empty(shape, dtype, device, stream):
    return np.full(shape, np.nan, dtype=dtype)  # poisoned: unwritten elements show


def _tensors(args):
    """CPU tensors reach CPU kernels as NumPy views (zero-copy); back to tensors for the math here."""
    return tuple(None if a is None else torch.from_numpy(np.asarray(a)) for a in args.inputs), torch.from_numpy(
        args.out
    )


def _mm(args):
    CALLS["matmul"] += 1
    (a, b), out = _tensors(args)
    out.copy_(torch.matmul(a.double(), b.double()))


def _linear(args):
    CALLS["linear"] += 1
    (x, w, b), out = _tensors(args)
    y = torch.matmul(x.double(), w.double().t())
    out.copy_(y if b is None else y + b.double())


def _attention(args):
    CALLS["attention"] += 1
    inputs, out = _tensors(args)
    q, k, v, mask = (t if t is None else t.double() for t in inputs)
    scores = torch.matmul(q, k.transpose(-1, -2)) * args.attrs["scale"]
    if args.attrs["is_causal"]:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    elif mask is not None:
        scores = scores.masked_fill(~inputs[3], -math.inf) if inputs[3].dtype == torch.bool else scores + mask
    out.copy_(torch.matmul(torch.softmax(scores, -1), v))


def _attention_math(q, k, v, mask, is_causal, scale):
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    elif mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.double()
    return scores


def _grouped(q, t, args):
    """k or v with each head repeated for its query group (enable_gqa), else as it is."""
    if args.attrs.get("enable_gqa") and t.shape[-3] != q.shape[-3]:
        return t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3)
    return t


def _ungrouped(grad, like):
    if grad.shape[-3] != like.shape[-3]:
        return grad.unflatten(-3, (like.shape[-3], grad.shape[-3] // like.shape[-3])).sum(-3)
    return grad


def _attention_forward(args):
    CALLS["attention_forward"] += 1
    (q, k, v, mask, lse), out = _tensors(args)
    k, v = _grouped(q, k, args), _grouped(q, v, args)
    scores = _attention_math(q.double(), k.double(), v.double(), mask, args.attrs["is_causal"], args.attrs["scale"])
    out.copy_(torch.matmul(torch.softmax(scores, -1), v.double()))
    lse.copy_(torch.logsumexp(scores, -1))


def _attention_backward(args):
    """Closed-form gradients in float64 (no autograd: a custom op's body runs below it)."""
    CALLS["attention_backward"] += 1
    (dout, q, k_in, v_in, _o, lse, mask), out = _tensors(args)
    k, v = _grouped(q, k_in, args), _grouped(q, v_in, args)
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    scale = args.attrs["scale"]
    scores = _attention_math(q, k, v, mask, args.attrs["is_causal"], scale)
    assert torch.allclose(torch.logsumexp(scores, -1), lse.double(), atol=1e-4)  # the forward's, passed on
    p = torch.softmax(scores, -1)
    o = torch.matmul(p, v)
    dv = torch.matmul(p.transpose(-1, -2), dout)
    ds = p * (torch.matmul(dout, v.transpose(-1, -2)) - (dout * o).sum(-1, keepdim=True))
    dq, dk = torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-1, -2), q) * scale
    dk, dv = _ungrouped(dk, k_in), _ungrouped(dv, v_in)
    out.copy_(torch.cat([g.reshape(-1) for g in (dq, dk, dv)]))


def _layer_norm(args):
    CALLS["layer_norm"] += 1
    inputs, out = _tensors(args)
    x, w, b = (t if t is None else t.double() for t in inputs)
    dims = args.attrs["normalized_shape"]
    out.copy_(torch.ops.aten.layer_norm.default.decompose(x, list(dims), w, b, args.attrs["eps"]))


def _rms_norm(args):
    CALLS["rms_norm"] += 1
    inputs, out = _tensors(args)
    x, w = (t if t is None else t.double() for t in inputs)
    axes = tuple(range(x.dim() - len(args.attrs["normalized_shape"]), x.dim()))
    eps = args.attrs["eps"]
    y = x * torch.rsqrt(x.square().mean(axes, keepdim=True) + eps)
    out.copy_(y if w is None else y * w)


def _layer_norm_backward(args):
    """Closed-form gradients in float64 (no autograd: a custom op's body runs below it)."""
    CALLS["layer_norm_backward"] += 1
    (dy, x, w), out = _tensors(args)
    n = math.prod(args.attrs["normalized_shape"])
    x2, dy2 = x.double().reshape(-1, n), dy.double().reshape(-1, n)
    centered = x2 - x2.mean(1, keepdim=True)
    rstd = torch.rsqrt(centered.square().mean(1, keepdim=True) + args.attrs["eps"])
    xhat = centered * rstd
    wdy = dy2 if w is None else dy2 * w.double().reshape(1, n)
    dx = (wdy - xhat * (xhat * wdy).mean(1, keepdim=True) - wdy.mean(1, keepdim=True)) * rstd
    out.copy_(torch.cat([dx, (dy2 * xhat).sum(0, keepdim=True), dy2.sum(0, keepdim=True)]))


def make_registry() -> Registry:
    """The built-in op schemas with one counting PyTorch-CPU kernel per routed op."""
    registry = Registry()
    for schema in _declared(_submodules(importlib.import_module(OPS_PACKAGE)), OpSchema):
        registry.register_op(schema)
    registry.register_backend(Backend("torchcpu", "cpu", empty=_empty))
    specs = [
        kernel("matmul", "test_mm", backend="torchcpu", dtypes={"float32", "float16"})(_mm),
        kernel("linear", "test_mm", backend="torchcpu", dtypes={"float32", "float16"})(_linear),
        kernel("attention", "test_attention", backend="torchcpu", dtypes=_DTYPES)(_attention),
        kernel("layer_norm", "test_ln", backend="torchcpu", dtypes=_DTYPES)(_layer_norm),
        kernel("rms_norm", "test_rms", backend="torchcpu", dtypes=_DTYPES)(_rms_norm),
    ]
    if "attention_forward" in registry.ops:
        specs.append(
            kernel("attention_forward", "test_attention", backend="torchcpu", dtypes=_DTYPES)(_attention_forward)
        )
        specs.append(
            kernel("attention_backward", "test_attention", backend="torchcpu", dtypes=_DTYPES)(_attention_backward)
        )
    if "layer_norm_backward" in registry.ops:
        specs.append(kernel("layer_norm_backward", "test_ln", backend="torchcpu", dtypes=_DTYPES)(_layer_norm_backward))
    for spec in specs:
        registry.register_kernel(spec)
    return registry


POLICY = {"matmul": "test_mm", "attention": "test_attention", "layer_norm": "test_ln", "rms_norm": "test_rms",
          "layer_norm_backward": "test_ln"}  # fmt: skip


def policy(*ops: str, registry: Registry, **options) -> xrt.KernelPolicy:
    prefs = {op: POLICY[op] for op in ops if op in registry.ops and POLICY[op] in registry.kernels[op]}
    return xrt.KernelPolicy(prefs, validate=registry, **options)


def routed_registry() -> Iterator[Registry]:
    """Route CPU aten ops through a private dispatcher (use from a fixture); everything is undone after."""
    registry = make_registry()
    router.use_dispatcher(Dispatcher(registry))
    install.route_devices(("cpu",))
    CALLS.clear()
    forget_warnings()
    try:
        yield registry
    finally:
        xtorch.clear_kernel_policy()
        tuner.reset()
        install.route_devices(("cuda",))
        router.use_dispatcher(None)
        CALLS.clear()
        forget_warnings()


def forget_warnings() -> None:
    """One fallback warning per op and kernel name (and per op and reason): each test sees its own."""
    STATE.router.warned.clear()
    STATE.tracing.warned.clear()
    STATE.tracing.decisions.clear()


def run_without_extension(code: str, timeout: float = 300) -> str:
    """Run `code` in a fresh Python with xpuruntime's C++ extension switched off; its stdout."""
    from xpuruntime.runtime import extension

    env = {**os.environ, extension.ENV_SWITCH: "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout


def fake_timings(monkeypatch) -> dict[str, float]:
    """Make tuning report the µs per kernel put in the returned dict instead of timing (nothing reaches
    the disk cache)."""
    times: dict[str, float] = {}
    monkeypatch.setattr(
        autotune, "time_candidates", lambda d, dec, cands, i, p: {c.kernel.name: times[c.kernel.name] for c in cands}
    )
    monkeypatch.setattr(autotune.STORE, "get", lambda key: None)
    monkeypatch.setattr(autotune.STORE, "put", lambda key, value: None)
    return times


@contextlib.contextmanager
def foreign_override(aten_name: str = "bmm") -> Iterator[None]:
    """Another library's kernel for aten::<aten_name> on CPU, as xpuruntime must refuse to replace."""
    foreign = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        foreign.impl(aten_name, lambda a, b: a, "CPU")
    try:
        yield
    finally:
        foreign._destroy()
