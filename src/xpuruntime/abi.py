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
from dataclasses import dataclass, field
from typing import Any

from .errors import PolicyError, clip


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
    a call without allocating anything: `TensorSpec((256, 512), "float16")`.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    strides: tuple[int, ...] | None = None
    device: str = "cpu"
    ptr: int = 0
    itemsize: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if self.strides is None:
            object.__setattr__(self, "strides", contiguous_strides(self.shape))
        if not self.itemsize:
            object.__setattr__(self, "itemsize", _ITEMSIZE.get(self.dtype, 0))

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
