"""fused_elementwise(program, *inputs, dtype): a chain of elementwise ops run as ONE op (one kernel).

The graph optimizer turns a chain of elementwise ONNX nodes into one call of this op; each backend
generates one kernel per program (a fused NumPy function on the CPU, one Triton kernel on the GPU).

Program format (the `program` attribute; plain tuples, so it is hashable and can key caches)::

    program = (instruction, instruction, ...)          # at least one; the LAST one's value is the output
    instruction = (opname, ref, ...)                   # one ref for unary ops, two for binary ops
    ref = ("in", i)       # the i-th input array (0-based), broadcast to the output shape
        | ("t", j)        # the value of instruction j (j < this instruction's index)
        | ("c", value)    # a Python float constant

Example, GELU with bias: y = gelu(x + b) ->
    (("add", ("in", 0), ("in", 1)), ("gelu", ("t", 0)))

Semantics:
- The output shape is the NumPy broadcast of all input shapes; every instruction is elementwise.
- Inputs may have any numeric or bool dtype; each is converted to the *compute dtype* when loaded.
  The compute dtype is float32 for float16/bfloat16 outputs and the output dtype otherwise.
- `dtype` (the attribute) is the output dtype (a float dtype); the last value is rounded to it once.
- Unary ops: neg abs exp log sqrt rsqrt reciprocal tanh erf sigmoid relu gelu (erf form)
  gelu_tanh (tanh approximation) sin cos copy.
- Binary ops: add sub mul div pow max min.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..abi import FLOAT_DTYPES, INT_DTYPES
from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, DTypeError, argument_error, clip
from ..schema import OpSchema
from .checks import broadcast, numel

MAX_INPUTS = 8
INPUT_NAMES = tuple(f"x{i}" for i in range(MAX_INPUTS))

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "tanh": np.tanh,
    "erf": _erf,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "sin": np.sin,
    "cos": np.cos,
    "copy": np.positive,
}
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "pow": np.power,
    "max": np.maximum,
    "min": np.minimum,
}
INPUT_DTYPES = FLOAT_DTYPES | INT_DTYPES | {"bool"}


def compute_dtype(dtype: str) -> str:
    """The dtype the instructions run in for output `dtype`."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def check_program(program: Any, n_inputs: int, op: str = "fused_elementwise") -> tuple:
    """Validate a program's structure; returns it. Errors name the instruction that is wrong."""
    if not isinstance(program, tuple) or not program:
        raise argument_error(ArgumentError, op, "program", "a non-empty tuple of instructions", repr(program))
    for index, instr in enumerate(program):
        if not isinstance(instr, tuple) or not instr or instr[0] not in UNARY.keys() | BINARY.keys():
            known = ", ".join(sorted(UNARY.keys() | BINARY.keys()))
            raise ArgumentError(
                f"{op}: argument 'program' instruction {index} {instr!r}: expected (opname, refs...) with {known}"
            )
        arity = 1 if instr[0] in UNARY else 2
        if len(instr) != 1 + arity:
            raise ArgumentError(
                f"{op}: argument 'program' instruction {index} {instr!r}: '{instr[0]}' takes {arity} ref(s)"
            )
        for ref in instr[1:]:
            _check_ref(op, index, ref, n_inputs)
    return program


def _check_ref(op: str, index: int, ref: Any, n_inputs: int) -> None:
    ok = isinstance(ref, tuple) and len(ref) == 2
    if ok and ref[0] == "in":
        ok = type(ref[1]) is int and 0 <= ref[1] < n_inputs
    elif ok and ref[0] == "t":
        ok = type(ref[1]) is int and 0 <= ref[1] < index
    elif ok and ref[0] == "c":
        ok = isinstance(ref[1], numbers.Real) and not isinstance(ref[1], bool) and _is_a_float(ref[1])
    else:
        ok = False
    if not ok:
        raise ArgumentError(
            f"{op}: argument 'program' instruction {index}: bad ref {clip(ref)}; expected ('in', i < {n_inputs}), "
            f"('t', j < {index}) or ('c', float)"
        )


def _is_a_float(value: numbers.Real) -> bool:
    """Whether a constant converts to a float (an int beyond 1.8e308 does not: kernels would crash on it)."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def used_inputs(ctx: DispatchContext) -> list[str]:
    """Names of the inputs the call passes (a prefix of x0..x7)."""
    names = [n for n in INPUT_NAMES if ctx.has_tensor(n)]
    return names


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    names = used_inputs(ctx)
    if not names or names != list(INPUT_NAMES[: len(names)]):
        raise ArgumentError(f"{ctx.op}: inputs must be x0..x{{n-1}} without gaps, got {names}")
    check_program(ctx.attrs["program"], len(names), ctx.op)
    dtype = ctx.attrs["dtype"]
    if dtype not in FLOAT_DTYPES:
        raise argument_error(DTypeError, ctx.op, "dtype", f"a float dtype ({', '.join(sorted(FLOAT_DTYPES))})", dtype)
    for name in names:
        if ctx.tensor(name).dtype not in INPUT_DTYPES:
            raise argument_error(DTypeError, ctx.op, name, "a numeric or bool dtype", ctx.tensor(name).dtype)
    return {"program": ctx.attrs["program"], "dtype": dtype, "n_inputs": len(names)}


def _infer_shape(ctx: DispatchContext) -> tuple[int, ...]:
    return broadcast(ctx.op, [(n, ctx.tensor(n).shape) for n in used_inputs(ctx)])


def evaluate(program: tuple, inputs: list[np.ndarray], fns: dict | None = None) -> np.ndarray:
    """Run a program on already-converted arrays with the given op tables (float64 reference by default)."""
    values: list[Any] = []
    for instr in program:
        args = [inputs[r[1]] if r[0] == "in" else values[r[1]] if r[0] == "t" else r[1] for r in instr[1:]]
        fn = UNARY.get(instr[0]) or BINARY[instr[0]]
        values.append(fn(*args))
    return values[-1]


def reference(*inputs: Any, program: tuple, dtype: str = "float64") -> np.ndarray:
    """float64 reference: every input converted to float64, every instruction in float64."""
    arrays = [np.asarray(x).astype(np.float64) for x in inputs if x is not None]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    with np.errstate(all="ignore"):
        return np.broadcast_to(np.asarray(evaluate(program, arrays), np.float64), shape).copy()


FUSED_ELEMENTWISE = OpSchema(
    name="fused_elementwise",
    inputs=INPUT_NAMES,
    optional=frozenset(INPUT_NAMES[1:]),
    attrs=("program", "dtype"),
    defaults={**dict.fromkeys(INPUT_NAMES[1:]), "dtype": "float32"},
    normalize_attrs=_normalize_attrs,
    infer_dtype=lambda ctx: ctx.attrs["dtype"],
    infer_shape=_infer_shape,
    reference=reference,
    flops=lambda ctx: len(ctx.attrs["program"]) * numel(ctx.out_shape),
    doc="A chain of elementwise ops with broadcasting, as one generated kernel (see the program format).",
)


def fused_elementwise(program: tuple, *inputs: Any, dtype: str = "float32", out: Any = None) -> Any:
    """Run `program` (see the module docstring) on up to 8 broadcast inputs; result in `dtype`."""
    if len(inputs) > MAX_INPUTS:
        raise ArgumentError(f"fused_elementwise: at most {MAX_INPUTS} inputs, got {len(inputs)}")
    padded = (*inputs, *(None,) * (MAX_INPUTS - len(inputs)))
    return run("fused_elementwise", padded, (program, dtype), out)
