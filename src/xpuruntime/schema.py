"""Op schema: what an op means, independent of any kernel (InferShape, InferDType, CheckLayout).

A schema names the op's array arguments and attributes, validates a call (raising errors that name
the argument), infers the output's shape and dtype, states the aliasing rule and carries a float64
NumPy reference used by the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import check_output_aliasing
from .errors import ArgumentError

if TYPE_CHECKING:
    from .context import DispatchContext


def _no_attrs(ctx: DispatchContext) -> dict[str, Any]:
    return dict(ctx.attrs)


def _no_flops(ctx: DispatchContext) -> int:
    return 0


@dataclass(frozen=True)
class OpSchema:
    """Declares one op. Kernels for it are registered separately, per backend."""

    name: str
    inputs: tuple[str, ...]
    infer_dtype: Callable[[DispatchContext], str]
    infer_shape: Callable[[DispatchContext], tuple[int, ...]]
    reference: Callable[..., Any]
    attrs: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)  # input and attribute defaults (explain, plan)
    optional: frozenset[str] = field(default_factory=frozenset)  # inputs that may be None
    scalars: frozenset[str] = field(default_factory=frozenset)  # inputs that may be Python numbers
    normalize_attrs: Callable[[DispatchContext], dict[str, Any]] = _no_attrs
    inplace: bool = False  # `out` may be exactly an input's view (elementwise-style ops)
    # inputs the kernels write: outputs beyond the one the ABI has (attention_forward's lse), filled like `out`
    buffers: frozenset[str] = field(default_factory=frozenset)
    flops: Callable[[DispatchContext], int] = _no_flops
    doc: str = ""

    def check_layout(self, inputs: tuple, out: Any) -> None:
        """CheckLayout: the aliasing rule between a caller's `out` and the inputs."""
        check_output_aliasing(self.name, self.inputs, inputs, out, self.inplace)

    def check_buffers(self, inputs: tuple) -> None:
        """The input buffers the kernels write must be writable (a read-only NumPy view is not; that is no
        part of the plan-cache key, so it is checked on every call)."""
        for name, x in zip(self.inputs, inputs):
            if name in self.buffers and isinstance(x, np.ndarray) and not x.flags.writeable:
                raise ArgumentError(f"{self.name}: argument '{name}' expected a writable array, got a read-only one")
