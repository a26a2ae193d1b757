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

from .arrays import check_output_aliasing, check_written_tensor, is_torch_tensor, mark_written, returned_array_problem
from .errors import ArgumentError

if TYPE_CHECKING:
    from .context import DispatchContext

# (shape, dtype) of each part of a returns_output kernel's tuple result, where the op allows one
ReturnedParts = Callable[["DispatchContext"], tuple[tuple[tuple[int, ...], str], ...]]


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
    returned_parts: ReturnedParts | None = None  # a returns_output kernel may return a tuple of these instead
    doc: str = ""

    def check_layout(self, inputs: tuple, out: Any) -> None:
        """CheckLayout: the aliasing rule between a caller's `out` and the inputs."""
        check_output_aliasing(self.name, self.inputs, inputs, out, self.inplace)

    def returned_problem(self, ctx: DispatchContext, returned: Any) -> str | None:
        """What is wrong with a returns_output kernel's result for `ctx` (None: nothing): it must be an array
        of the inferred shape and dtype on the call's device, or the tuple `returned_parts` describes."""
        if type(returned) is tuple and self.returned_parts is not None:
            parts = self.returned_parts(ctx)
            if len(returned) != len(parts):
                return f"a tuple of {len(parts)} arrays, got a tuple of {len(returned)}"
            for index, (part, (shape, dtype)) in enumerate(zip(returned, parts)):
                problem = returned_array_problem(part, shape, dtype, ctx.device)
                if problem is not None:
                    return f"{problem} as item {index} of its tuple"
            return None
        return returned_array_problem(returned, ctx.out_shape, ctx.out_dtype, ctx.device)

    def check_buffers(self, inputs: tuple) -> None:
        """The input buffers the kernels write must be writable (a read-only NumPy view is not; that is no
        part of the plan-cache key, so it is checked on every call), and a PyTorch tensor among them must be
        one autograd lets us write (see `arrays.check_written_tensor`)."""
        for name, x in zip(self.inputs, inputs):
            if name not in self.buffers or x is None:
                continue
            if isinstance(x, np.ndarray):
                if not x.flags.writeable:
                    raise ArgumentError(
                        f"{self.name}: argument '{name}' expected a writable array, got a read-only one"
                    )
            elif is_torch_tensor(x):
                check_written_tensor(self.name, name, x)

    def mark_buffers_written(self, inputs: tuple) -> None:
        """Bump the version counter of each PyTorch tensor among the buffers the kernels wrote."""
        for name, x in zip(self.inputs, inputs):
            if name in self.buffers and x is not None and is_torch_tensor(x):
                mark_written(x)
