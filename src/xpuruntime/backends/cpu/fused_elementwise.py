"""CPU kernel for fused_elementwise: one generated NumPy function per (program, output dtype), cached.

The generated function converts each input to the compute dtype once, runs the instructions with
NumPy ufuncs, reuses a temporary in place once its last reader has run (when it has the full output
shape), and writes the last instruction straight into `out` when the dtypes allow it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from ...abi import ArgPack
from ...context import DispatchContext
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES

_A1, _A2, _A3, _A4, _A5, _P = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
_exact_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf: exact (math.erf) for float64; Abramowitz-Stegun 7.1.26 in float64 (|error| < 1.5e-7) else."""
    if x.dtype == np.float64:
        result = _exact_erf(x)
    else:
        x64 = np.asarray(x, np.float64)
        t = 1.0 / (1.0 + _P * np.abs(x64))
        poly = ((((_A5 * t + _A4) * t + _A3) * t + _A2) * t + _A1) * t
        result = np.copysign(1.0 - poly * np.exp(-x64 * x64), x64).astype(x.dtype)
    if out is None:
        return result
    np.copyto(out, result, casting="unsafe")
    return out


def _gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    y = erf(x * x.dtype.type(1.0 / math.sqrt(2.0)))
    y += 1.0
    y *= x
    return np.multiply(y, x.dtype.type(0.5), out=out)


def _gelu_tanh(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    c = x.dtype.type(math.sqrt(2.0 / math.pi))
    y = np.tanh(c * (x + x.dtype.type(0.044715) * x * x * x))
    y += 1.0
    y *= x
    return np.multiply(y, x.dtype.type(0.5), out=out)


def _sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    y = np.negative(x, out=out)
    np.exp(y, out=y)
    y += 1.0
    return np.reciprocal(y, out=y)


def _rsqrt(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    y = np.sqrt(x, out=out)
    return np.reciprocal(y, out=y)


def _relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.maximum(x, x.dtype.type(0), out=out)


FUNCTIONS: dict[str, Callable] = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": _rsqrt,
    "reciprocal": np.reciprocal, "tanh": np.tanh, "erf": erf, "sigmoid": _sigmoid, "relu": _relu,
    "gelu": _gelu, "gelu_tanh": _gelu_tanh, "sin": np.sin, "cos": np.cos, "copy": np.positive,
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "max": np.maximum, "min": np.minimum,
}  # fmt: skip


def _last_reads(program: tuple) -> dict[int, int]:
    """Instruction index -> index of the last instruction reading its value."""
    last: dict[int, int] = {}
    for index, instr in enumerate(program):
        for ref in instr[1:]:
            if ref[0] == "t":
                last[ref[1]] = index
    return last


@functools.lru_cache(maxsize=1024)
def compile_program(program: tuple, out_dtype: str) -> Callable[[tuple, np.ndarray], None]:
    """Generate and compile `fused(inputs, out)` for one program and output dtype."""
    cdt = np.dtype("float32" if out_dtype == "float16" else out_dtype)
    namespace: dict = {"np": np, "CDT": cdt, **{f"f_{k}": v for k, v in FUNCTIONS.items()}}
    n_inputs = 1 + max((r[1] for i in program for r in i[1:] if r[0] == "in"), default=0)
    lines = ["def fused(ins, out):", "    shape = out.shape"]
    for i in range(n_inputs):
        lines.append(f"    x{i} = ins[{i}]")
        lines.append(f"    if x{i}.dtype != CDT: x{i} = x{i}.astype(CDT)")
    last_read = _last_reads(program)
    direct = np.dtype(out_dtype) == cdt
    for index, (op, *refs) in enumerate(program):
        names = []
        for ref in refs:
            if ref[0] == "in":
                names.append(f"x{ref[1]}")
            elif ref[0] == "t":
                names.append(f"t{ref[1]}")
            else:
                namespace[f"c{index}_{len(names)}"] = cdt.type(ref[1])
                names.append(f"c{index}_{len(names)}")
        call = f"f_{op}({', '.join(names)}"
        if index == len(program) - 1 and direct:
            lines.append(f"    {call}, out=out)")
            break
        reusable = [n for n, r in zip(names, refs) if r[0] == "t" and last_read.get(r[1]) == index]
        target = (
            f"{reusable[0]} if type({reusable[0]}) is np.ndarray and {reusable[0]}.shape == shape else None"
            if reusable
            else "None"
        )
        lines.append(f"    t{index} = {call}, out={target})")
    else:
        lines.append(f"    np.copyto(out, t{len(program) - 1}, casting='unsafe')")
    exec(compile("\n".join(lines), f"<fused_elementwise {len(program)} ops>", "exec"), namespace)
    return namespace["fused"]


def _cpu_dtype(ctx: DispatchContext) -> str | None:
    dtype = ctx.attrs["dtype"]
    return None if dtype in CPU_FLOAT_DTYPES else f"output dtype {dtype} has no NumPy kernel"


@kernel("fused_elementwise", "numpy_codegen", backend="cpu", conditions=(_cpu_dtype,), priority=10, fused=True)
def fused_elementwise_numpy(args: ArgPack) -> None:
    """One generated NumPy function per program (cached): inputs converted once, temporaries reused."""
    fn = compile_program(args.attrs["program"], args.attrs["dtype"])
    with np.errstate(all="ignore"):  # inf/NaN follow IEEE rules, as on the GPU
        fn(args.inputs, args.out)
