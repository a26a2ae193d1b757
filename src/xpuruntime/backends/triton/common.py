"""Helpers shared by the Triton kernels: dtypes, array conversion, layout collapsing, device facts."""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...context import DispatchContext
from ...runtime.launch_capture import CAPTURE
from ...runtime.traced import RECORDING, NotTraceable
from ..torch.common import empty as cuda_empty

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # kernels run on CPU tensors through Triton's interpreter

# Triton computes in fp32 for these (fp16/bf16 load, fp32 math, round once on store).
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32"})

MAX_GRID_Y = 65535  # CUDA's limit on grid dimensions 1 and 2


def as_torch(x: Any) -> Any:
    """A torch view of an array (NumPy arrays under the interpreter, zero-copy); scalars and None pass."""
    if x is None or isinstance(x, torch.Tensor | float | int | bool):
        return x
    return torch.from_numpy(x)


def no_negative_strides(ctx: DispatchContext) -> str | None:
    """torch.from_numpy cannot view a reversed NumPy array (negative strides)."""
    specs = [*ctx.tensors, *([ctx.out] if ctx.out is not None else [])]
    for spec in specs:
        if any(s < 0 for s in spec.strides):
            return "an argument has negative strides (a reversed view); pass a copy"
    return None


def collapse(shape: Sequence[int], *strides: Sequence[int]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge neighbours that are contiguous with each other in every operand.

    Returns (shape, [strides per operand]) with at least one dim (a scalar becomes shape (1,)).
    """
    dims: list[tuple[int, list[int]]] = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        now = [s[i] for s in strides]
        if dims:
            prev_n, prev = dims[-1]
            if all(p == s * n for p, s in zip(prev, now)):
                dims[-1] = (prev_n * n, now)
                continue
        dims.append((n, now))
    if not dims:
        return (1,), [(0,) for _ in strides]
    return tuple(n for n, _ in dims), [tuple(d[1][k] for d in dims) for k in range(len(strides))]


def broadcast_strides(shape: Sequence[int], target: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """Strides of `shape` broadcast to `target` (0 along broadcast dims)."""
    pad = len(target) - len(shape)
    return tuple(0 if i < pad or shape[i - pad] == 1 else strides[i - pad] for i in range(len(target)))


def next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def out_strides(ctx: DispatchContext) -> tuple[int, ...]:
    """Strides of the output: the caller's `out=` if given, else row-major (what `empty` allocates)."""
    if ctx.out is not None:
        return ctx.out.strides
    from ...abi import contiguous_strides

    return contiguous_strides(ctx.out_shape)


@functools.lru_cache(maxsize=16)
def sm_count(device: str) -> int:
    """Streaming multiprocessors (a small stand-in under the interpreter)."""
    if INTERPRET or not device.startswith("cuda"):
        return 4
    return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


def workspace_f32(args: Any, count: int, device: Any) -> torch.Tensor:
    """`count` fp32 elements of the lent workspace (allocated here when none was lent)."""
    ws = args.workspace
    if ws is not None:
        ws = as_torch(ws)
        if ws.numel() >= 4 * count:
            return ws[: 4 * count].view(torch.float32)
    return torch.empty(count, dtype=torch.float32, device=device)


def numpy_or_torch_empty(shape: tuple[int, ...], dtype: str, device: str) -> Any:
    """Outputs under the interpreter are NumPy arrays (the CPU front end expects them)."""
    if device.startswith("cpu"):
        return np.empty(shape, np.dtype(dtype))
    return cuda_empty(shape, dtype, device)


# -- launching --------------------------------------------------------------------------------------
# Triton's own launch path binds and specializes every argument in Python on each call (tens of µs on
# a slow host, more than a 50 µs kernel). After the first launch of a specialization we keep the
# compiled kernel and call its launcher directly. The key holds everything Triton specializes on: the
# device, the constexprs and options, each tensor's dtype and 16-byte alignment, each int's ==1 / %16 / 64-bit.

_COMPILED: dict[tuple, tuple[Any, tuple]] = {}
_RUNTIME: list = []  # [triton.knobs.runtime, current-device function, current-stream function], bound once


def _runtime() -> list:
    if not _RUNTIME:
        from triton import knobs
        from triton.runtime import driver

        _RUNTIME.extend((knobs.runtime, driver.active.get_current_device, driver.active.get_current_stream))
    return _RUNTIME


def _spec(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    kind = type(value)
    if kind is int:
        return value == 1, value % 16 == 0, -(2**31) <= value < 2**31
    if kind is float:
        return float
    return kind, value


def _specs(args: tuple) -> tuple:
    """`_spec` of each argument, with tensors and ints inline (a flash launch has ~30 arguments: a
    function call per argument was half of the key's cost)."""
    tensor = torch.Tensor
    return tuple([
        (a.dtype, not a.data_ptr() & 15) if type(a) is tensor
        else (a == 1, not a & 15, -2147483648 <= a < 2147483648) if type(a) is int
        else _spec(a)
        for a in args
    ])  # fmt: skip


def launch_hooks_active() -> bool:
    """Whether Triton's launch hooks (a profiler's) are set: launches must then go through Triton's own path."""
    return _hooked((_RUNTIME or _runtime())[0])


def _hooked(runtime: Any) -> bool:
    return hook_active(runtime.launch_enter_hook) or hook_active(runtime.launch_exit_hook)


def current_stream(device: int) -> Any:
    """The current CUDA stream of `device` as Triton's launchers take it."""
    return (_RUNTIME or _runtime())[2](device)


def hook_active(hook: Any) -> bool:
    """Whether a Triton launch hook would run: None, or (Triton >= 3.5) an empty HookChain, would not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _constexpr_tail(fn: Any, n_positional: int, constexprs: dict[str, Any]) -> tuple:
    """The launcher takes every parameter after the positional ones: the constexprs given, else defaults."""
    params = list(inspect.signature(fn.fn).parameters.values())[n_positional:]
    missing = [p.name for p in params if p.name not in constexprs and p.default is p.empty]
    unknown = set(constexprs) - {p.name for p in params}
    if missing or unknown:
        raise TypeError(f"{fn.__name__}: missing {missing}, or {sorted(unknown)} not after the positional arguments")
    return tuple(constexprs.get(p.name, p.default) for p in params)


def launch(fn: Any, grid: tuple[int, ...], *args: Any, num_warps: int = 4, num_stages: int | None = None,
           **constexprs: Any) -> Any:  # fmt: skip
    """fn[grid](*args, **constexprs), with the compiled kernel reused directly after the first call.
    Returns the compiled kernel (None under the interpreter, or while the launch is traced into a graph)."""
    options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    if RECORDING.on:  # traced into a graph (runtime.traced): a node for inductor to compile and launch
        if INTERPRET:
            raise NotTraceable("Triton's interpreter runs kernels on the host")
        torch.library.wrap_triton(fn)[grid](*args, **options, **constexprs)
        return None
    if INTERPRET:
        fn[grid](*args, **options, **constexprs)
        if CAPTURE.capture is not None:
            CAPTURE.capture.launches.append(None)  # nothing to relaunch: the interpreter ran it on the host
        return None
    runtime, current_device, stream_of = _RUNTIME or _runtime()
    hooked = _hooked(runtime)
    device = current_device()  # a compiled kernel is loaded per device
    key = (fn, device, num_warps, num_stages, tuple(constexprs.items()), _specs(args))
    entry = None if hooked else _COMPILED.get(key)
    if entry is None:
        kernel = fn[grid](*args, **options, **constexprs)
        if kernel is not None and not hooked and getattr(kernel, "function", None) is not None:
            entry = _COMPILED[key] = (kernel, _constexpr_tail(fn, len(args), constexprs))
        if CAPTURE.capture is not None:
            CAPTURE.capture.launches.append(None if entry is None else (kernel, grid, args, entry[1]))
        return kernel
    kernel, tail = entry
    if CAPTURE.capture is not None:
        CAPTURE.capture.launches.append((kernel, grid, args, tail))
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    stream = stream_of(device)
    kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *args, *tail)
    return kernel
