"""Triton sin_affine: y = sin(a*x + b) with broadcasting and any strides, fp32 math, one rounding.

The launch-config function collapses the broadcast layout once per plan: contiguous operands and
Python-number `a`/`b` take a flat 1-D path (the fast one); anything else indexes up to 4 collapsed dims.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import threading
from typing import Any

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ...abi import ArgPack, LaunchConfig, TensorSpec
from ...arguments import strict_key
from ...context import DispatchContext
from ...registry import kernel
from .common import (
    FLOAT_DTYPES,
    INTERPRET,
    as_torch,
    broadcast_strides,
    collapse,
    launch,
    no_negative_strides,
    out_strides,
)

# libdevice's sinf is accurate to a few ulp; tl.sin may lower to the approximate sin.approx.f32. The
# interpreter implements only tl.sin (through NumPy, exactly).
LIBDEVICE_SIN = tl.constexpr(not INTERPRET)

MAX_DIMS = 4
SCALAR, SPLAT, LINEAR, STRIDED = 0, 1, 2, 3  # how an operand is read: Python number, one element, flat, strided


@triton.jit
def _offsets(idx, d1, d2, d3, s0, s1, s2, s3):
    """Element offsets of flat (row-major over the collapsed dims d0..d3) indices `idx`."""
    i3 = idx % d3
    rest = idx // d3
    i2 = rest % d2
    rest = rest // d2
    i1 = rest % d1
    i0 = rest // d1
    return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3


@triton.jit
def _operand(ptr, value, idx, mask, d1, d2, d3, s0, s1, s2, s3, MODE: tl.constexpr):
    if MODE == 0:
        return value
    elif MODE == 1:
        return tl.load(ptr).to(tl.float32)
    elif MODE == 2:
        return tl.load(ptr + idx, mask=mask).to(tl.float32)
    else:
        return tl.load(ptr + _offsets(idx, d1, d2, d3, s0, s1, s2, s3), mask=mask).to(tl.float32)


@triton.jit
def _sin_affine_kernel(
    x_ptr, a_ptr, b_ptr, y_ptr, a_value, b_value, n,
    d1, d2, d3,
    xs0, xs1, xs2, xs3, as0, as1, as2, as3, bs0, bs1, bs2, bs3, ys0, ys1, ys2, ys3,
    X_MODE: tl.constexpr, A_MODE: tl.constexpr, B_MODE: tl.constexpr, Y_LINEAR: tl.constexpr,
    WIDE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if WIDE:
        idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    x = _operand(x_ptr, 0.0, idx, mask, d1, d2, d3, xs0, xs1, xs2, xs3, X_MODE)
    a = _operand(a_ptr, a_value, idx, mask, d1, d2, d3, as0, as1, as2, as3, A_MODE)
    b = _operand(b_ptr, b_value, idx, mask, d1, d2, d3, bs0, bs1, bs2, bs3, B_MODE)
    if LIBDEVICE_SIN:
        y = libdevice.sin(a * x + b).to(y_ptr.dtype.element_ty)
    else:
        y = tl.sin(a * x + b).to(y_ptr.dtype.element_ty)
    if Y_LINEAR:
        tl.store(y_ptr + idx, y, mask=mask)
    else:
        tl.store(y_ptr + _offsets(idx, d1, d2, d3, ys0, ys1, ys2, ys3), y, mask=mask)


def _strides_of(ctx: DispatchContext, name: str) -> tuple[int, ...] | None:
    spec = ctx[name]
    if not isinstance(spec, TensorSpec):
        return None
    return broadcast_strides(spec.shape, ctx.out_shape, spec.strides)


def _layout(ctx: DispatchContext, names: tuple[str, ...]) -> tuple[tuple[int, ...], list[tuple[int, ...] | None]]:
    """Collapsed dims and per-operand strides (the named inputs, then the output); None for numbers/absent."""
    given = [_strides_of(ctx, n) for n in names] + [out_strides(ctx)]
    present = [s for s in given if s is not None]
    dims, collapsed = collapse(ctx.out_shape, *present)
    it = iter(collapsed)
    return dims, [None if s is None else next(it) for s in given]


def _fits_dims(names: tuple[str, ...]):
    def at_most_4_dims(ctx: DispatchContext) -> str | None:
        dims, _ = _layout(ctx, names)
        if len(dims) > MAX_DIMS:
            return f"broadcast layout needs {len(dims)} dims after collapsing (kernel indexes at most {MAX_DIMS})"
        return None

    return at_most_4_dims


def _mode(strides: tuple[int, ...] | None, linear: tuple[int, ...]) -> int:
    if strides is None:
        return SCALAR
    if all(s == 0 for s in strides):
        return SPLAT
    return LINEAR if strides == linear else STRIDED


def broadcast_launch_config(ctx: DispatchContext, names: tuple[str, ...]) -> LaunchConfig:
    """Flat grid over the output; per input how it is read (MODES), padded dims and strides."""
    dims, strides = _layout(ctx, names)
    pad = MAX_DIMS - len(dims)
    linear = tuple(0 if n == 1 else s for n, s in zip(dims, _row_major(dims)))
    n = math.prod(dims) if math.prod(ctx.out_shape) else 0
    block, warps = (1024, 4) if n < (1 << 22) else (2048, 8)
    params = {
        "dims": ((1,) * pad + dims)[1:],
        "strides": [((0,) * pad + s) if s is not None else (0,) * MAX_DIMS for s in strides],
        "MODES": tuple(_mode(s, linear) for s in strides[:-1]),
        "Y_LINEAR": strides[-1] == linear or n <= 1,
        "WIDE": _max_offset(ctx, n) >= 2**31 - 1,
        "BLOCK": block,
        "num_warps": warps,
        "n": n,
    }
    return LaunchConfig(grid=(triton.cdiv(n, block),), block=(warps * 32,), params=params)


def sin_affine_launch_config(ctx: DispatchContext) -> LaunchConfig:
    return broadcast_launch_config(ctx, ("x", "a", "b"))


def _row_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(dims):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _max_offset(ctx: DispatchContext, n: int) -> int:
    reach = n
    for spec in (*ctx.tensors, ctx.out):
        if spec is not None:
            reach = max(reach, sum((d - 1) * abs(s) for d, s in zip(spec.shape, spec.strides)) + 1)
    return reach


@kernel(
    "sin_affine", "triton", backend="triton", dtypes=FLOAT_DTYPES, priority=30,
    conditions=(_fits_dims(("x", "a", "b")), no_negative_strides), launch_config=sin_affine_launch_config,
)  # fmt: skip
def sin_affine_triton(args: ArgPack) -> None:
    """One pass: each input element read once (broadcast operands from cache), each output written once."""
    p = args.config.params
    if p["n"] == 0:
        return
    x, a, b = (as_torch(v) for v in args.inputs)
    y = as_torch(args.out)
    a_tensor, b_tensor = not isinstance(a, float | int), not isinstance(b, float | int)
    xs, as_, bs, ys = p["strides"]
    launch(
        _sin_affine_kernel, args.config.grid,
        x, a if a_tensor else x, b if b_tensor else x, y,
        0.0 if a_tensor else float(a), 0.0 if b_tensor else float(b), p["n"],
        *p["dims"], *xs, *as_, *bs, *ys,
        X_MODE=p["MODES"][0], A_MODE=p["MODES"][1], B_MODE=p["MODES"][2], Y_LINEAR=p["Y_LINEAR"],
        WIDE=p["WIDE"], BLOCK=p["BLOCK"], num_warps=p["num_warps"],
    )  # fmt: skip


# -- fused elementwise: one generated Triton kernel per program ------------------------------------

# Expressions per instruction, in the compute dtype (fp32). `{0}`/`{1}` are the operands. On the GPU the
# accurate libdevice functions; under the interpreter (which lacks libdevice) tl equivalents.
_UNARY = {
    "neg": "-({0})", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "log": "{ld}log({0})", "sqrt": "{ld}sqrt({0})",
    "rsqrt": "1.0 / {ld}sqrt({0})", "reciprocal": "1.0 / ({0})", "tanh": "_tanh({0})", "erf": "tl.erf({0})",
    "sigmoid": "tl.sigmoid({0})", "relu": "_relu({0})", "gelu": "_gelu({0})", "gelu_tanh": "_gelu_tanh({0})",
    "sin": "{ld}sin({0})", "cos": "{ld}cos({0})", "copy": "({0})",
}  # fmt: skip
_BINARY = {
    "add": "({0}) + ({1})", "sub": "({0}) - ({1})", "mul": "({0}) * ({1})", "div": "({0}) / ({1})",
    "pow": "_pow({0}, {1})", "max": "_max({0}, {1})", "min": "_min({0}, {1})",
}  # fmt: skip


@triton.jit
def _relu(x):
    return tl.where(x != x, x, tl.maximum(x, 0.0))  # NaN stays NaN, as in NumPy and PyTorch


@triton.jit
def _max(x, y):
    return tl.where(x != x, x, tl.where(y != y, y, tl.maximum(x, y)))  # NaN propagates, as np.maximum


@triton.jit
def _min(x, y):
    return tl.where(x != x, x, tl.where(y != y, y, tl.minimum(x, y)))


@triton.jit
def _tanh(x):
    if LIBDEVICE_SIN:
        return libdevice.tanh(x)
    else:
        return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _gelu(x):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def _gelu_tanh(x):
    return 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def _pow(x, y):
    if LIBDEVICE_SIN:
        return libdevice.pow(x, y)
    else:  # |x|^y with the sign of an odd integer power; 0^0 = 1; negative base, fractional y: NaN
        magnitude = tl.exp2(y * tl.log2(tl.abs(x)))
        odd = (tl.abs(y) % 2.0) == 1.0
        integral = y == tl.floor(y)
        negative = x < 0  # nested selects, not &: the interpreter cannot combine a splat mask with a block one
        signed = tl.where(negative, tl.where(odd, -magnitude, magnitude), magnitude)
        result = tl.where(negative, tl.where(integral, signed, float("nan")), signed)
        return tl.where(y == 0.0, 1.0, result)


def _ref(ref: tuple) -> str:
    kind, value = ref
    if kind == "in":
        return f"v{value}"
    if kind == "t":
        return f"t{value}"
    value = float(value)
    if value == 0.0 and math.copysign(1.0, value) < 0.0:
        return "neg_zero"  # a launch argument: Triton 3.6 compiles a -0.0 literal as +0.0 (seen on the H100)
    return repr(value) if math.isfinite(value) else f'float("{value}")'


def kernel_source(program: tuple, n_inputs: int, interpret: bool = INTERPRET) -> str:
    """The Triton source of one fused kernel: load each input (by its mode), run the program, store."""
    ld = "tl." if interpret else "libdevice."
    args = ", ".join(f"in{i}" for i in range(n_inputs))
    strides = ", ".join(f"s{i}_{d}" for i in range(n_inputs) for d in range(MAX_DIMS))
    modes = ", ".join(f"M{i}: tl.constexpr" for i in range(n_inputs))
    lines = [
        f"def fused_kernel({args}, y_ptr, n, d1, d2, d3, {strides}, ys0, ys1, ys2, ys3, neg_zero, {modes},",
        "                 Y_LINEAR: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):",
        "    pid = tl.program_id(0)",
        "    if WIDE:",
        "        idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        "    else:",
        "        idx = pid * BLOCK + tl.arange(0, BLOCK)",
        "    mask = idx < n",
    ]
    for i in range(n_inputs):
        s = ", ".join(f"s{i}_{d}" for d in range(MAX_DIMS))
        lines.append(f"    v{i} = _operand(in{i}, 0.0, idx, mask, d1, d2, d3, {s}, M{i})")
    for j, (name, *refs) in enumerate(program):
        template = _UNARY.get(name) or _BINARY[name]
        lines.append(f"    t{j} = " + template.format(*map(_ref, refs), ld=ld))
    last = len(program) - 1
    lines += [
        f"    y = (t{last} + tl.zeros([BLOCK], tl.float32)).to(y_ptr.dtype.element_ty)",
        "    if Y_LINEAR:",
        "        tl.store(y_ptr + idx, y, mask=mask)",
        "    else:",
        "        tl.store(y_ptr + _offsets(idx, d1, d2, d3, ys0, ys1, ys2, ys3), y, mask=mask)",
    ]
    return "\n".join(lines) + "\n"


_GENERATED: dict[tuple, Any] = {}
_GENERATED_LOCK = threading.Lock()


def fused_kernel(program: tuple, n_inputs: int) -> Any:
    """The jitted kernel for a program, generated once per (program, input count) and cached."""
    key = (strict_key(program), n_inputs)
    found = _GENERATED.get(key)
    if found is not None:
        return found
    with _GENERATED_LOCK:
        if key not in _GENERATED:
            source = kernel_source(program, n_inputs)
            digest = hashlib.sha256(source.encode()).hexdigest()[:16]
            filename = f"<xpuruntime-fused-{digest}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for getsource
            helpers = (_operand, _offsets, _relu, _max, _min, _tanh, _gelu, _gelu_tanh, _pow)
            namespace = {"tl": tl, "libdevice": libdevice, "LIBDEVICE_SIN": LIBDEVICE_SIN}
            namespace.update({fn.__name__: fn for fn in helpers})
            exec(compile(source, filename, "exec"), namespace)
            _GENERATED[key] = triton.jit(namespace["fused_kernel"])
    return _GENERATED[key]


def _fused_names(ctx: DispatchContext) -> tuple[str, ...]:
    return tuple(f"x{i}" for i in range(ctx.attrs["n_inputs"]))


def _fused_output_dtype(ctx: DispatchContext) -> str | None:
    if ctx.attrs["dtype"] not in FLOAT_DTYPES:
        return f"output dtype {ctx.attrs['dtype']} not in {{{', '.join(sorted(FLOAT_DTYPES))}}} (fp32 compute)"
    return None


def _fused_dims(ctx: DispatchContext) -> str | None:
    return _fits_dims(_fused_names(ctx))(ctx)


def fused_launch_config(ctx: DispatchContext) -> LaunchConfig:
    config = broadcast_launch_config(ctx, _fused_names(ctx))
    config.params["_kernel"] = fused_kernel(ctx.attrs["program"], ctx.attrs["n_inputs"])  # once per plan
    return config


@kernel(
    "fused_elementwise", "triton", backend="triton", priority=30, fused=True,
    conditions=(_fused_output_dtype, _fused_dims, no_negative_strides), launch_config=fused_launch_config,
)  # fmt: skip
def fused_elementwise_triton(args: ArgPack) -> None:
    """One generated kernel per program: each input read once, the chain in registers, one store."""
    p = args.config.params
    if p["n"] == 0:
        return
    count = args.attrs["n_inputs"]
    inputs = [as_torch(x) for x in args.inputs[:count]]
    strides = [s for per_input in p["strides"][:count] for s in per_input]
    modes = {f"M{i}": m for i, m in enumerate(p["MODES"])}
    launch(
        p["_kernel"], args.config.grid,
        *inputs, as_torch(args.out), p["n"], *p["dims"], *strides, *p["strides"][-1], -0.0,
        Y_LINEAR=p["Y_LINEAR"], WIDE=p["WIDE"], BLOCK=p["BLOCK"], num_warps=p["num_warps"], **modes,
    )  # fmt: skip
