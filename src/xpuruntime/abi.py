"""The kernel ABI: what a kernel receives and how it is launched.

Contract:
- A kernel's launch function takes one `ArgPack` and returns nothing. It writes its result into
  `args.out`, which the runtime allocated (or the caller passed) with the inferred shape and dtype.
- Except a kernel declared `returns_output=True`: when the caller passed no `out=`, `args.out` is None
  and the kernel returns its output, freshly allocated (it must not alias the inputs); the op's docs say
  what form it may take. With `out=` it writes into `args.out` like any kernel.
- Tensors are described by `TensorSpec` (ptr, shape, strides in elements, dtype, device): the packed
  form a raw (C/CUDA) kernel would receive. Python kernels use the arrays in `args.inputs` directly.
- Launch geometry lives in a `LaunchConfig` computed next to the kernel by its launch-config function,
  once per plan, not per call.
- Kernels never report errors themselves: the runtime catches what a launch raises and re-raises a
  `LaunchError` naming op, kernel and launch config.
- After a launch the runtime applies the policy's `SyncPolicy`.
"""

from __future__ import annotations

import contextlib
import enum
import math
import operator
from dataclasses import dataclass, field
from typing import Any

from .errors import ArgumentError, PolicyError, clip


class MathMode(enum.Enum):
    """Arithmetic a kernel may use. FP32 means full precision of the input dtype (no TF32 shortcuts)."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    MIXED = "mixed"

    @classmethod
    def parse(cls, value: MathMode | str) -> MathMode:
        """Accept a MathMode or its value in any case ("tf32", "TF32")."""
        return _parse_enum(cls, value, "math_mode")

    @classmethod
    def for_dtype(cls, dtype: str) -> MathMode:
        """The math mode a call gets when the policy does not set one."""
        return {"float16": cls.FP16, "bfloat16": cls.BF16}.get(dtype, cls.FP32)


class SyncPolicy(enum.Enum):
    """What the runtime does after a launch: nothing, record an event on the stream, or synchronize."""

    NO_SYNC = "no_sync"
    EVENT_RECORD = "event_record"
    FULL_SYNC = "full_sync"

    @classmethod
    def parse(cls, value: SyncPolicy | str) -> SyncPolicy:
        """Accept a SyncPolicy or its value in any case, '-' for '_' ("full-sync")."""
        return _parse_enum(cls, value, "sync policy")


def _parse_enum(cls: type[enum.Enum], value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return cls(value.lower().replace("-", "_"))
    known = ", ".join(m.value for m in cls)
    raise PolicyError(f"unknown {what} {clip(value)}; expected one of {known}")


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """Launch geometry: grid and block (CUDA sense), dynamic shared memory, tile parameters.

    CPU kernels use `grid` for the number of independent tiles and `params` for tile sizes; params whose
    name starts with "_" hold objects made once per plan (a compiled kernel) and are left out of logs.
    """

    grid: tuple[int, ...] = (1,)
    block: tuple[int, ...] = (1,)
    smem_bytes: int = 0
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The config as one line for messages and traces: grid, block, shared memory, params."""
        text = f"grid={self.grid} block={self.block}"
        if self.smem_bytes:
            text += f" smem={self.smem_bytes}B"
        shown = [f"{k}={v}" for k, v in self.params.items() if not k.startswith("_")]  # _name: a handle
        if shown:
            text += " " + " ".join(shown)
        return text


FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})

_ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex64": 8, "complex128": 16,
}  # fmt: skip


DTYPES = frozenset(_ITEMSIZE)  # the dtype names kernels declare and TensorSpecs made by hand take


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name; 0 for a name outside DTYPES."""
    return _ITEMSIZE.get(dtype, 0)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor as the ABI sees it: shape, dtype, strides (elements), device and data pointer.

    Build one from an array with `xpuruntime.arrays.describe`, or by hand to ask `explain` about
    a call without allocating anything: `TensorSpec((256, 512), "float16")`. Sizes are integers >= 0 (a
    sequence of them: a string is not one), strides integers, one per size; a spec made by hand (no
    `itemsize`) names a dtype of DTYPES. Anything else raises ArgumentError naming the field.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    strides: tuple[int, ...] | None = None
    device: str = "cpu"
    ptr: int = 0
    itemsize: int = 0

    def __post_init__(self) -> None:
        shape = self.shape
        if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):  # fast for plain tuples
            object.__setattr__(self, "shape", _integers("shape", shape, "a sequence of sizes >= 0", minimum=0))
        if self.strides is None:
            object.__setattr__(self, "strides", contiguous_strides(self.shape))
        elif (
            type(self.strides) is not tuple
            or len(self.strides) != len(self.shape)
            or not all(type(s) is int for s in self.strides)
        ):
            strides = _integers("strides", self.strides, f"{len(self.shape)} integers (one per size)")
            if len(strides) != len(self.shape):
                raise _spec_error("strides", f"{len(self.shape)} integers (one per size)", self.strides)
            object.__setattr__(self, "strides", strides)
        if type(self.itemsize) is not int or self.itemsize < 0:
            raise _spec_error("itemsize", "an integer >= 0", self.itemsize)
        if not isinstance(self.dtype, str) or not self.dtype:
            raise _spec_error("dtype", "a dtype name like 'float32'", self.dtype)
        if not self.itemsize:
            if self.dtype not in DTYPES:
                raise _spec_error("dtype", f"one of {', '.join(sorted(DTYPES))}", self.dtype)
            object.__setattr__(self, "itemsize", _ITEMSIZE[self.dtype])
        if not isinstance(self.device, str) or type(self.ptr) is not int:
            field_name, expected = (
                ("device", "a device name") if not isinstance(self.device, str) else ("ptr", "an int")
            )
            raise _spec_error(field_name, expected, getattr(self, field_name))

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements (the product of the shape)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the elements take (numel times the itemsize), whatever the strides."""
        return self.numel * self.itemsize

    @property
    def layout(self) -> str:
        """'contiguous', 'transposed' (last two axes swapped, else contiguous) or 'strided'."""
        return layout_class(self.shape, self.strides)


def _spec_error(field_name: str, expected: str, got: Any) -> ArgumentError:
    return ArgumentError(f"TensorSpec: argument '{field_name}' expected {expected}, got {clip(got)}")


def _integers(field_name: str, values: Any, expected: str, minimum: int | None = None) -> tuple[int, ...]:
    """`values` as a tuple of Python ints (NumPy integers too; no bools, floats or strings)."""
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise _spec_error(field_name, expected, values)
    try:
        items = tuple(values)
        if any(isinstance(n, bool) for n in items):
            raise TypeError
        result = tuple(operator.index(n) for n in items)
    except Exception:  # a float, a string, an iterator that raises
        raise _spec_error(field_name, expected, values) from None
    if minimum is not None and any(n < minimum for n in result):
        raise _spec_error(field_name, expected, values)
    return result


def layout_class(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """Classify a layout; size-1 axes never make a tensor non-contiguous."""

    def dense(shape_: tuple[int, ...], strides_: tuple[int, ...]) -> bool:
        return all(s == e for n, s, e in zip(shape_, strides_, contiguous_strides(shape_)) if n != 1)

    if math.prod(shape) == 0 or dense(shape, strides):
        return "contiguous"
    if len(shape) >= 2:
        perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
        if dense(tuple(shape[i] for i in perm), tuple(strides[i] for i in perm)):
            return "transposed"
    return "strided"


class ArgPack:
    """Everything one launch receives: arrays, output (None for a returns_output kernel called without
    out=), normalized attributes, config, workspace, and the stream to launch on (None on the CPU, and
    for backends whose kernels follow the framework's current stream themselves: `Backend.ambient_stream`)."""

    # the C hit path (runtime/hot_path.cpp) fills these six slots without calling __init__: keep __init__
    # to storing them
    __slots__ = ("attrs", "config", "inputs", "out", "stream", "workspace")

    def __init__(
        self, inputs: tuple, out: Any, attrs: Any, config: LaunchConfig, workspace: Any = None, stream: Any = None
    ) -> None:
        self.inputs = inputs
        self.out = out
        self.attrs = attrs
        self.config = config
        self.workspace = workspace
        self.stream = stream

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the workspace lent to this launch (0 when none)."""
        return 0 if self.workspace is None else int(self.workspace.nbytes)

    def tensors(self) -> tuple[TensorSpec | None, ...]:
        """The packed ABI view of inputs and output: (ptr, shape, strides, dtype, device) each."""
        from .arrays import describe_or_none

        return tuple(describe_or_none(x) for x in (*self.inputs, self.out))
