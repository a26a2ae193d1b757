"""CPU kernel for fused_elementwise: one generated NumPy function per (program, output dtype), cached.

Every instruction runs as a NumPy ufunc (or a small helper made of ufuncs) writing into a preallocated
register: registers are full-output-shape slices of the kernel's workspace, assigned by liveness at
code-generation time, so a steady run allocates nothing. The last instruction writes straight into
`out` when it has the compute dtype.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable

import numpy as np

from ...abi import ArgPack, LaunchConfig
from ...arguments import strict_key
from ...context import DispatchContext
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES

_A1, _A2, _A3, _A4, _A5, _P = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
_exact_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_TANH_C = math.sqrt(2.0 / math.pi)
CHUNK_ELEMENTS = 1 << 16  # output elements per block of a long program (measured best of 2^13..2^17)


def _erf_into(x: np.ndarray, out: np.ndarray, a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """erf(x) into `out` (Abramowitz-Stegun 7.1.26, |error| < 1e-6 in fp32; exact in fp64)."""
    if out.dtype == np.float64:
        np.copyto(out, _exact_erf(x))
        return out
    f = out.dtype.type
    np.abs(x, out=a)
    np.multiply(a, f(_P), out=t)
    t += f(1.0)
    np.reciprocal(t, out=t)
    np.multiply(t, f(_A5), out=out)
    for c in (_A4, _A3, _A2, _A1):
        out += f(c)
        out *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    out *= a
    np.subtract(f(1.0), out, out=out)
    return np.copysign(out, x, out=out)


def erf(x: np.ndarray) -> np.ndarray:
    """erf of any float array in its own dtype (float16 computes in float32)."""
    work = np.dtype(np.float32 if x.dtype != np.float64 else np.float64)
    out, a, t = (np.empty(x.shape, work) for _ in range(3))
    return _erf_into(x.astype(work, copy=False), out, a, t).astype(x.dtype, copy=False)


def _gelu(x: np.ndarray, out: np.ndarray, s1: np.ndarray, s2: np.ndarray, s3: np.ndarray) -> np.ndarray:
    """x * Phi(x): PyTorch's vectorized kernel on the same memory where PyTorch is already loaded, then
    min(that, |x|), which is the same but where PyTorch's x * (1 + erf) / 2 overflows (x > 1.7e38 in float32);
    2.7x faster than the passes below on a 65536-element block, one core (56 against 154 us; within 9e-7 of
    float64). Else relu(x) - |x|/2 * erfc(|x|/sqrt(2)), erfc by Abramowitz-Stegun 7.1.26: 21 cheap passes.
    (PyTorch's tanh GELU was slower than `_gelu_tanh`'s passes: 1.01 against 0.65 ms; it stays NumPy.)"""
    torch = sys.modules.get("torch")  # never imported here: 1.6 s, and the core runs without it
    fits = x.shape == out.shape  # PyTorch's out= would be resized to a broadcast operand's shape, not filled
    if torch is not None and fits and x.dtype == out.dtype == np.float32 and x.flags.writeable and out.flags.writeable:
        torch._C._nn.gelu(torch.from_numpy(x), out=torch.from_numpy(out))
        return np.minimum(out, np.abs(x, out=s1), out=out)
    if out.dtype == np.float64:
        np.multiply(x, _SQRT1_2, out=s1)
        _erf_into(s1, out, s2, s3)
        out += 1.0
        out *= x
        out *= 0.5
        return out
    f = out.dtype.type
    half = np.multiply(x, f(0.5), out=s1)  # relu(x) = x/2 + |x|/2 at the end: no overflow, no NaN-aware max
    h = np.abs(half, out=s2)  # |x|/2
    t = np.multiply(h, f(2.0 * _P * _SQRT1_2), out=s3)
    t += f(1.0)
    np.reciprocal(t, out=t)
    np.multiply(t, f(_A5), out=out)
    for c in (_A4, _A3, _A2, _A1):
        out += f(c)
        out *= t
    np.multiply(h, f(-2.0), out=s3)  # t is spent: s3 = -x^2/2
    s3 *= h
    np.exp(s3, out=s3)
    out *= s3
    out *= h  # out = |x|/2 * erfc(|x|/sqrt(2))
    half += h
    return np.subtract(half, out, out=out)


def _gelu_tanh(x: np.ndarray, out: np.ndarray, s1: np.ndarray, *_: np.ndarray) -> np.ndarray:
    f = out.dtype.type
    np.multiply(x, x, out=s1)
    s1 *= x
    s1 *= f(0.044715)
    s1 += x
    s1 *= f(_TANH_C)
    np.tanh(s1, out=s1)
    s1 += f(1.0)
    s1 *= x
    return np.multiply(s1, f(0.5), out=out)


def _erf(x: np.ndarray, out: np.ndarray, s1: np.ndarray, s2: np.ndarray, *_: np.ndarray) -> np.ndarray:
    return _erf_into(x, out, s1, s2)


def _sigmoid(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.negative(x, out=out)
    np.exp(out, out=out)
    out += out.dtype.type(1.0)
    return np.reciprocal(out, out=out)


def _rsqrt(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.sqrt(x, out=out)
    return np.reciprocal(out, out=out)


def _relu(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.maximum(x, out.dtype.type(0), out=out)


def _ufunc(fn: np.ufunc) -> Callable:
    return lambda *args, out: fn(*args, out=out)


FUNCTIONS: dict[str, Callable] = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": _rsqrt,
    "reciprocal": np.reciprocal, "tanh": np.tanh, "sigmoid": _sigmoid, "relu": _relu, "sin": np.sin,
    "cos": np.cos, "copy": np.positive, "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "div": np.divide, "pow": np.power, "max": np.maximum, "min": np.minimum,
}  # fmt: skip
HELPERS: dict[str, tuple[Callable, int]] = {"erf": (_erf, 2), "gelu": (_gelu, 3), "gelu_tanh": (_gelu_tanh, 1)}


def _last_reads(program: tuple) -> dict[int, int]:
    """Instruction index -> index of the last instruction reading its value."""
    last: dict[int, int] = {}
    for index, instr in enumerate(program):
        for ref in instr[1:]:
            if ref[0] == "t":
                last[ref[1]] = index
    return last


def compile_program(program: tuple, out_dtype: str) -> tuple[Callable, int]:
    """Generate `fused(inputs, out, regs)` for one program and output dtype (cached); returns it and the
    number of full-size registers (workspace slices) it needs."""
    return _compile(strict_key(program), out_dtype)


@functools.lru_cache(maxsize=1024)
def _compile(key: tuple, out_dtype: str) -> tuple[Callable, int]:
    program = key[0]
    cdt = np.dtype("float32" if out_dtype == "float16" else out_dtype)
    namespace: dict = {"np": np, "CDT": cdt, **{f"f_{k}": v for k, v in FUNCTIONS.items()}}
    namespace.update({f"h_{k}": fn for k, (fn, _) in HELPERS.items()})
    n_inputs = 1 + max((r[1] for i in program for r in i[1:] if r[0] == "in"), default=0)
    lines = ["def fused(ins, out, regs):"]
    for i in range(n_inputs):
        lines.append(f"    x{i} = ins[{i}]")
        lines.append(f"    if x{i}.dtype != CDT: x{i} = x{i}.astype(CDT)")
    last_read = _last_reads(program)
    direct = np.dtype(out_dtype) == cdt
    free: list[int] = []
    count = 0
    register: dict[int, int] = {}
    helper_base = None  # registers for helpers' scratch come after the value registers (fixed below)
    body = []
    for index, (op, *refs) in enumerate(program):
        names = []
        for ref in refs:
            if ref[0] == "in":
                names.append(f"x{ref[1]}")
            elif ref[0] == "t":
                names.append(f"regs[{register[ref[1]]}]")
            else:
                const = f"c{index}_{len(names)}"
                namespace[const] = cdt.type(ref[1])
                names.append(const)
        last = index == len(program) - 1
        if last and direct:
            target = "out"
        else:
            if not free:
                free.append(count)
                count += 1
            register[index] = free.pop()
            target = f"regs[{register[index]}]"
        if op in HELPERS:
            body.append((f"h_{op}({', '.join(names)}, {target}", HELPERS[op][1]))
        else:
            body.append((f"f_{op}({', '.join(names)}, out={target})", 0))
        for ref in refs:  # registers whose last reader this was are free for later instructions
            if ref[0] == "t" and last_read.get(ref[1]) == index and register[ref[1]] not in free:
                free.append(register[ref[1]])
    helper_base = count
    scratch = max((n for _, n in body), default=0)
    for call, n in body:
        extra = "".join(f", regs[{helper_base + k}]" for k in range(n))
        lines.append(f"    {call}{extra})" if n else f"    {call}")
    if not direct:
        lines.append(f"    np.copyto(out, regs[{register[len(program) - 1]}], casting='unsafe')")
    exec(compile("\n".join(lines), f"<fused_elementwise {len(program)} ops>", "exec"), namespace)
    return namespace["fused"], count + scratch


def _cpu_dtype(ctx: DispatchContext) -> str | None:
    dtype = ctx.attrs["dtype"]
    return None if dtype in CPU_FLOAT_DTYPES else f"output dtype {dtype} has no NumPy kernel"


def _workspace_bytes(ctx: DispatchContext) -> int:
    """Registers: full-output-shape arrays in the compute dtype."""
    if ctx.attrs["dtype"] not in CPU_FLOAT_DTYPES:
        return 0
    _, registers = compile_program(ctx.attrs["program"], ctx.attrs["dtype"])
    itemsize = 8 if ctx.attrs["dtype"] == "float64" else 4
    return registers * math.prod(ctx.out_shape) * itemsize


def _rows(arrays: tuple, shape: tuple[int, ...]) -> list[np.ndarray] | None:
    """Each array broadcast to `shape` and viewed as (rows, last dim) without a copy; None if one cannot be."""
    rows = math.prod(shape[:-1])
    try:
        return [np.reshape(np.broadcast_to(a, shape), (rows, shape[-1]), copy=False) for a in arrays]
    except (ValueError, TypeError):  # a copy would be needed (or NumPy < 2.1 has no copy=)
        return None


def _run_in_chunks(fn: Callable, inputs: tuple, out: np.ndarray, regs: np.ndarray) -> bool:
    """Run `fn` over blocks of about CHUNK_ELEMENTS output elements, so that the program's registers stay
    in cache between its passes; False where the arrays cannot be split into row blocks."""
    if out.ndim < 2 or out.size < 2 * CHUNK_ELEMENTS:
        return False
    views = _rows((*inputs, out), out.shape)
    if views is None:
        return False
    ins, out2 = views[:-1], np.reshape(out, views[-1].shape)  # the same view as views[-1], writeable
    rows, cols = out2.shape
    step = max(1, CHUNK_ELEMENTS // cols)
    block = regs.reshape(-1)[: regs.shape[0] * step * cols].reshape(regs.shape[0], step, cols)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        fn([a[start:stop] for a in ins], out2[start:stop], block[:, : stop - start])
    return True


def _launch_config(ctx: DispatchContext) -> LaunchConfig:
    """The program's generated function, made once per plan."""
    return LaunchConfig(params={"_compiled": compile_program(ctx.attrs["program"], ctx.attrs["dtype"])})


@kernel(
    "fused_elementwise", "numpy_codegen", backend="cpu", conditions=(_cpu_dtype,), priority=10, fused=True,
    workspace_bytes=_workspace_bytes, launch_config=_launch_config,
)  # fmt: skip
def fused_elementwise_numpy(args: ArgPack) -> None:
    """One generated NumPy function per program (made with the plan), its temporaries in the workspace;
    large outputs are done in row blocks that stay in cache."""
    fn, registers = args.config.params["_compiled"]
    out = args.out
    cdt = np.float64 if out.dtype == np.float64 else np.float32
    if registers and args.workspace is not None:
        regs = args.workspace.view(cdt).reshape(registers, *out.shape)
    else:
        regs = np.empty((registers, *out.shape), cdt)
    with np.errstate(all="ignore"):  # inf/NaN follow IEEE rules, as on the GPU
        if not (registers > 2 and _run_in_chunks(fn, args.inputs, out, regs)):
            fn(args.inputs, out, regs)
