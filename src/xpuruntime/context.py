"""DispatchContext: the minimum a selector needs to know about one call to pick a kernel."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .abi import MathMode, TensorSpec
from .arrays import SCALAR_TYPES, describe, overlaps_itself
from .errors import ArgumentError, DeviceMismatchError, DTypeError, LayoutError, ShapeError, argument_error

if TYPE_CHECKING:
    from .policy import KernelPolicy
    from .schema import OpSchema

InputSpec = TensorSpec | type | None  # a tensor, a Python scalar's type (float/int/bool), or absent


@dataclass(frozen=True, slots=True)
class DispatchContext:
    """Op, argument specs (dtype, shape, strides, layout), device, compute capability, math mode."""

    op: str
    arg_names: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    attrs: Mapping[str, Any]  # normalized; may hold derived values (e.g. matmul's m, n, k)
    attr_names: tuple[str, ...] = ()  # the op's own attribute names, shown in summaries
    device: str = "cpu"
    compute_capability: tuple[int, int] | None = None
    math_mode: MathMode = MathMode.FP32
    deterministic: bool = False
    out: TensorSpec | None = None  # the caller's `out=`, if given
    out_shape: tuple[int, ...] | None = None
    out_dtype: str | None = None

    def __getitem__(self, name: str) -> InputSpec:
        return self.inputs[self.arg_names.index(name)]

    def tensor(self, name: str) -> TensorSpec:
        """The TensorSpec of the input named `name` (a schema error if that input is not a tensor)."""
        spec = self[name]
        if not isinstance(spec, TensorSpec):  # a schema bug: it should have asked has_tensor() first
            raise TypeError(f"{self.op}: argument '{name}' is {spec!r}, not a tensor")
        return spec

    def has_tensor(self, name: str) -> bool:
        """Whether the input named `name` is a tensor (optional inputs may be None)."""
        return isinstance(self[name], TensorSpec)

    @property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """The specs of the inputs that are tensors, in schema order."""
        return tuple(t for t in self.inputs if isinstance(t, TensorSpec))

    @property
    def dtype(self) -> str:
        """The dtype kernels are selected by: the first tensor argument's."""
        return self.tensors[0].dtype

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the tensor inputs, in schema order."""
        return tuple(t.shape for t in self.tensors)

    def summary(self) -> str:
        """One line for logs and errors: 'float16[256x512] contiguous, float16[512x128] transposed'."""
        parts = []
        for name, spec in zip(self.arg_names, self.inputs):
            if isinstance(spec, TensorSpec):
                dims = "x".join(map(str, spec.shape)) or "scalar"
                parts.append(f"{name}={spec.dtype}[{dims}] {spec.layout}")
            elif spec is not None:
                parts.append(f"{name}={spec.__name__}")
        attrs = ", ".join(f"{k}={self.attrs[k]!r}" for k in self.attr_names if k in self.attrs)
        return ", ".join(parts) + (f"; {attrs}" if attrs else "") + f" on {self.device}"


def _describe_input(schema: OpSchema, name: str, value: Any) -> InputSpec:
    if value is None:
        if name in schema.optional:
            return None
        raise argument_error(ArgumentError, schema.name, name, "an array", "None")
    if type(value) in SCALAR_TYPES:
        if name in schema.scalars:
            return type(value)
        raise argument_error(ArgumentError, schema.name, name, "an array", f"Python {type(value).__name__}")
    return _describe(schema.name, name, value)


def _describe(op: str, name: str, value: Any) -> TensorSpec:
    """`describe`, with a layout error that names the op and the argument."""
    try:
        return describe(value)
    except LayoutError as exc:
        raise LayoutError(f"{op}: argument '{name}': {exc}") from None


def _describe_out(op: str, out: Any) -> TensorSpec:
    try:
        return _describe(op, "out", out)
    except TypeError:
        raise argument_error(ArgumentError, op, "out", "an array", type(out).__name__) from None


def _common_device(op: str, names: tuple[str, ...], specs: tuple[InputSpec, ...], out: TensorSpec | None) -> str:
    device, first = None, None
    for name, spec in (*zip(names, specs), ("out", out)):
        if not isinstance(spec, TensorSpec):
            continue
        if device is None:
            device, first = spec.device, name
        elif spec.device != device:
            hint = " (NumPy arrays and CPU tensors live on the CPU: move them with .to(device) first)"
            hint = hint if "cpu" in (device, spec.device) else ""
            raise argument_error(DeviceMismatchError, op, name, f"device {device} (like '{first}')", spec.device + hint)
    return device or "cpu"


def check_arity(schema: OpSchema, inputs: tuple, attrs: tuple) -> None:
    """As many inputs and attributes as the schema names (the positional form `Dispatcher.run` takes);
    trailing attributes that have defaults may be left out, so that an op can gain an attribute without
    breaking callers that pass the older, shorter tuple."""
    omitted = schema.attrs[len(attrs) :]
    if (
        len(inputs) != len(schema.inputs)
        or len(attrs) > len(schema.attrs)
        or any(name not in schema.defaults for name in omitted)
    ):
        raise ArgumentError(
            f"{schema.name}: expected inputs {schema.inputs} and attributes {schema.attrs}, "
            f"got {len(inputs)} inputs and {len(attrs)} attributes"
        )


def with_default_attrs(schema: OpSchema, attrs: tuple) -> tuple:
    """`attrs` with the defaults of the trailing attributes it leaves out."""
    if len(attrs) == len(schema.attrs):
        return attrs
    return (*attrs, *(schema.defaults[name] for name in schema.attrs[len(attrs) :]))


def build_context(schema: OpSchema, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy) -> DispatchContext:
    """Validate a call against its schema and describe it; raises errors naming the bad argument."""
    from .runtime.device import compute_capability

    check_arity(schema, inputs, attrs)
    attrs = with_default_attrs(schema, attrs)
    specs = tuple(_describe_input(schema, n, v) for n, v in zip(schema.inputs, inputs))
    out_spec = None if out is None else _describe_out(schema.name, out)
    device = _common_device(schema.name, schema.inputs, specs, out_spec)
    tensors = [s for s in specs if isinstance(s, TensorSpec)]
    ctx = DispatchContext(
        op=schema.name,
        arg_names=schema.inputs,
        inputs=specs,
        attrs=dict(zip(schema.attrs, attrs)),
        attr_names=schema.attrs,
        device=device,
        compute_capability=compute_capability(device),
        math_mode=policy.math_mode or MathMode.for_dtype(tensors[0].dtype if tensors else "float32"),
        deterministic=policy.deterministic,
        out=out_spec,
    )
    ctx = dataclasses.replace(ctx, attrs=schema.normalize_attrs(ctx))
    ctx = dataclasses.replace(ctx, out_dtype=schema.infer_dtype(ctx), out_shape=schema.infer_shape(ctx))
    if out_spec is not None:
        _check_out(ctx, out_spec)
    for name, spec in zip(schema.inputs, specs):  # buffers the kernels write are outputs too
        if name in schema.buffers and isinstance(spec, TensorSpec):
            _refuse_self_overlap(schema.name, name, spec)
    return ctx


def _check_out(ctx: DispatchContext, out: TensorSpec) -> None:
    if out.shape != ctx.out_shape:
        raise argument_error(ShapeError, ctx.op, "out", f"shape {ctx.out_shape}", out.shape)
    if out.dtype != ctx.out_dtype:
        raise argument_error(DTypeError, ctx.op, "out", f"dtype {ctx.out_dtype}", out.dtype)
    _refuse_self_overlap(ctx.op, "out", out)


def _refuse_self_overlap(op: str, name: str, spec: TensorSpec) -> None:
    """A written array whose elements share memory gives wrong results (strides are in the plan key: this runs
    once per plan)."""
    if overlaps_itself(spec.shape, spec.strides):
        expected = "an array whose elements do not overlap each other"
        got = f"strides {spec.strides} for shape {spec.shape} (a zero or overlapping stride)"
        raise argument_error(LayoutError, op, name, expected, got)
