"""Call arguments as the dispatcher takes them: coercion of array-likes and attributes, schema
defaults, and the plan-cache key (built here and nowhere else)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np
from numpy import ndarray

from . import arrays
from .abi import TensorSpec
from .arrays import SCALAR_TYPES, as_array, is_cpu_tensor, is_torch_tensor, numpy_view, signature
from .context import check_arity
from .errors import ArgumentError, DTypeError
from .schema import OpSchema


def python_plan_key(op: str, fingerprint: int, attrs: tuple, inputs: tuple, out: Any) -> Hashable:
    """(op, policy fingerprint, attributes and their types, each argument's signature, out's signature).

    Raises NotAnArray for an argument that `normalize_call` must convert first; hashing the key raises
    TypeError for an unhashable attribute (the caller then normalizes too).
    """
    tensor = arrays.loaded_tensor_type  # arrays, CUDA tensors and Python scalars inline (hot cases); the rest below
    sigs = [
        (x.dtype, x.shape, x.strides) if type(x) is ndarray
        else arrays.python_cuda_tensor_key(x) if type(x) is tensor and x.is_cuda
        else type(x) if type(x) in SCALAR_TYPES
        else signature(x)
        for x in inputs
    ]  # fmt: skip
    types = tuple(map(type, attrs)) if attrs else ()
    if tuple in types:
        types = attr_types(attrs)
    return (op, fingerprint, attrs, types, *sigs, None if out is None else signature(out))


# the same function in C once xpuruntime's C++ extension is loaded (runtime/extension.py); call it as
# `arguments.plan_key` so that the switch reaches every caller
plan_key: Callable[[str, int, tuple, tuple, Any], Hashable] = python_plan_key


def normalize_call(schema: OpSchema, inputs: tuple, attrs: tuple, out: Any) -> tuple[tuple, tuple, Any]:
    """Slow path: convert array-likes, NumPy scalars, array subclasses and unhashable attributes,
    naming the argument that cannot be converted."""
    check_arity(schema, inputs, attrs)
    inputs = tuple(coerce_input(schema, name, x) for name, x in zip(schema.inputs, inputs))
    out = coerce_out(schema.name, out)
    attrs = freeze(attrs)
    for name, value in zip(schema.attrs, attrs):
        try:
            hash(value)
        except TypeError:
            raise ArgumentError(
                f"{schema.name}: argument '{name}' expected a number, bool, None or tuple, got {type(value).__name__}"
            ) from None
    return inputs, attrs, out


def freeze(value: Any) -> Any:
    """Attribute values as plain, hashable Python: lists, tuples and arrays become tuples, NumPy scalars
    Python numbers, so that equal calls share one plan-cache key."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return freeze(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


_NEGATIVE_ZERO = "-0.0"  # stands for float in a key where the value is -0.0


def attr_types(attrs: tuple) -> tuple:
    """Attribute types for the plan-cache key, element types too inside tuples: True == 1 == 1.0 as
    dict keys, yet only one of them may be a valid value, and a cache hit skips validation. A negative
    zero gets a mark of its own: -0.0 == 0.0, yet 1 / x tells them apart."""
    return tuple(
        (tuple, *attr_types(a)) if type(a) is tuple
        else _NEGATIVE_ZERO if type(a) is float and a == 0.0 and math.copysign(1.0, a) < 0.0
        else type(a)
        for a in attrs
    )  # fmt: skip


def strict_key(value: Any) -> Hashable:
    """A dict key under which values that compare equal yet differ in type or a zero's sign stay apart."""
    return value, attr_types((value,))


def fill_inputs(schema: OpSchema, inputs: tuple) -> tuple:
    """Trailing inputs left out take the schema's default (sin_affine's a=1.0) or None if optional."""
    if len(inputs) > len(schema.inputs):
        raise ArgumentError(
            f"{schema.name}: expected at most {len(schema.inputs)} inputs {schema.inputs}, got {len(inputs)}"
        )
    filled = list(inputs)
    for name in schema.inputs[len(inputs) :]:
        if name not in schema.defaults and name not in schema.optional:
            raise ArgumentError(f"{schema.name}: argument '{name}' is required")
        filled.append(schema.defaults.get(name))
    return tuple(filled)


def attr_values(schema: OpSchema, attrs: Mapping[str, Any]) -> tuple:
    """Keyword attributes -> the positional tuple `run` takes, with the schema's defaults filled in."""
    unknown = set(attrs) - set(schema.attrs)
    if unknown:
        raise ArgumentError(f"{schema.name}: unknown attribute(s) {sorted(unknown)}; the op takes {list(schema.attrs)}")
    missing = [name for name in schema.attrs if name not in attrs and name not in schema.defaults]
    if missing:
        raise ArgumentError(f"{schema.name}: attribute(s) {missing} have no default; pass them")
    return tuple(attrs.get(name, schema.defaults.get(name)) for name in schema.attrs)


def coerce_input(schema: OpSchema, name: str, x: Any, specs: bool = False) -> Any:
    """One input as the dispatcher takes it; NumPy scalars count as Python numbers where the op takes those."""
    if type(x) is arrays.loaded_tensor_type and x.is_cpu:  # the common case first: a plain CPU tensor
        return cpu_tensor_view(schema.name, name, x)
    if isinstance(x, np.generic) and name in schema.scalars:
        return x.item()
    if isinstance(x, np.ma.MaskedArray):
        raise ArgumentError(f"{schema.name}: argument '{name}' is a masked array; pass x.filled(value) instead")
    if isinstance(x, TensorSpec) and not specs:
        raise ArgumentError(f"{schema.name}: argument '{name}' expected an array, got a TensorSpec (for explain)")
    if is_cpu_tensor(x):
        return cpu_tensor_view(schema.name, name, x)
    try:
        return as_array(x)
    except (ValueError, TypeError) as exc:
        raise ArgumentError(
            f"{schema.name}: argument '{name}' expected an array, got {type(x).__name__}: {exc}"
        ) from None


def coerce_out(op: str, out: Any) -> Any:
    """`out` must already be an array (it is written in place); ndarray subclasses are viewed as ndarrays,
    CPU tensors as NumPy arrays sharing their memory."""
    if out is None:
        return None
    if is_cpu_tensor(out):
        return cpu_tensor_view(op, "out", out)
    if type(out) is ndarray or is_torch_tensor(out):
        return out
    if isinstance(out, ndarray):
        return np.asarray(out)
    raise ArgumentError(f"{op}: argument 'out' expected an array, got {type(out).__name__}")


def cpu_tensor_view(op: str, name: str, x: Any) -> ndarray:
    """A CPU tensor as the NumPy view the CPU backend runs on (no copy), or a DTypeError saying why not."""
    try:
        return numpy_view(x)
    except TypeError as exc:
        raise DTypeError(f"{op}: argument '{name}' expected a CPU tensor NumPy can view, got {exc}") from None


def has_cpu_tensor(inputs: tuple, out: Any) -> bool:
    """Whether a call passes any CPU tensor (its output then comes back as a CPU tensor)."""
    return any(_is_cpu_tensor(x) for x in (*inputs, out))


def _is_cpu_tensor(x: Any) -> bool:
    """`is_cpu_tensor`, with a fast test for plain tensors (x.is_cpu builds no torch.device)."""
    return x.is_cpu if type(x) is arrays.loaded_tensor_type else is_cpu_tensor(x)
