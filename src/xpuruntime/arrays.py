"""Adapters between the array types users pass (NumPy, PyTorch) and the runtime's `TensorSpec`.

PyTorch is never imported here: a tensor is recognised only if the user already imported torch.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from .abi import TensorSpec
from .errors import ArgumentError, LayoutError

SCALAR_TYPES = (float, int, bool)


class NotAnArray(Exception):
    """Raised by `signature` for an object that must first be converted with `as_array`."""


class _NoTensorType:
    """Stands for torch.Tensor until someone imports torch (nothing is an instance of it)."""


loaded_tensor_type: type = _NoTensorType  # torch.Tensor once torch has been imported (by anyone)


def _torch_tensor_type() -> type | None:
    global loaded_tensor_type
    if loaded_tensor_type is _NoTensorType:
        found = getattr(sys.modules.get("torch"), "Tensor", None)
        if found is None:
            return None
        loaded_tensor_type = found
    return loaded_tensor_type


def is_torch_tensor(x: Any) -> bool:
    tensor_type = _torch_tensor_type()
    return tensor_type is not None and isinstance(x, tensor_type)


def python_cuda_tensor_key(x: Any) -> tuple:
    """A CUDA tensor's key (see `signature`), in Python."""
    return (x.dtype, x.shape, x.is_contiguous() or x.stride(), x.get_device(), not x.data_ptr() & 15)


def signature(x: Any) -> Any:
    """A cheap hashable key for the parts of an argument that decide the kernel (hot path).

    A CUDA tensor's key is (dtype, shape, layout, device index, 16-byte aligned?), the layout being True
    for a row-major tensor (its shape then fixes every stride that addressing uses: a size-1 dim's stride
    is never used) and the strides otherwise. Kernels may require aligned pointers, so alignment is part
    of the key (and conditions may look at `TensorSpec.ptr % 16`). A CPU tensor raises NotAnArray: the
    slow path views it as a NumPy array first.
    """
    kind = type(x)
    if kind is np.ndarray:
        return (x.dtype, x.shape, x.strides)
    if kind in SCALAR_TYPES:
        return kind
    if x is None:
        return None
    if kind is loaded_tensor_type or is_torch_tensor(x):  # the first test is the fast one for plain tensors
        if x.is_cuda:
            return python_cuda_tensor_key(x)
        if x.device.type != "cpu":
            return (x.dtype, x.shape, x.stride(), str(x.device))
    raise NotAnArray


def is_cpu_tensor(x: Any) -> bool:
    """A PyTorch tensor in CPU memory (run on the CPU backend through a NumPy view)."""
    return is_torch_tensor(x) and x.device.type == "cpu"


def numpy_view(x: Any) -> np.ndarray:
    """A CPU tensor as a NumPy array sharing its memory (no copy); autograd tracking is dropped.
    Raises TypeError for dtypes NumPy lacks (bfloat16) and tensors with lazy conjugate/negative bits."""
    try:
        return x.detach().numpy()
    except (TypeError, RuntimeError) as exc:
        dtype = str(x.dtype).removeprefix("torch.")
        hint = "NumPy has no bfloat16: pass x.float() or a CUDA tensor" if dtype == "bfloat16" else str(exc)
        raise TypeError(f"dtype {dtype} ({hint})") from None


def as_array(x: Any) -> Any:
    """Leave arrays, scalars, None and TensorSpecs alone; turn anything else (lists, NumPy scalars,
    ndarray subclasses such as np.matrix) into a plain ndarray. Raises ValueError for ragged lists."""
    if x is None or type(x) in SCALAR_TYPES or type(x) is np.ndarray or isinstance(x, TensorSpec):
        return x
    if is_torch_tensor(x):
        return x
    return np.asarray(x)


def describe(x: Any) -> TensorSpec:
    """The ABI description of an array (NumPy ndarray, torch.Tensor) or a `TensorSpec` itself."""
    if isinstance(x, TensorSpec):
        return x
    if isinstance(x, np.ndarray):
        itemsize = x.itemsize
        if not itemsize:
            raise LayoutError(f"array of dtype {x.dtype} has elements of 0 bytes")
        if any(s % itemsize for s in x.strides):
            raise LayoutError(
                f"array strides {x.strides} (bytes) are not a multiple of its itemsize {itemsize} "
                "(a field of a structured array?); pass a copy"
            )
        return TensorSpec(
            shape=x.shape,
            dtype=x.dtype.name,
            strides=tuple(s // itemsize for s in x.strides),
            device="cpu",
            ptr=x.__array_interface__["data"][0],
            itemsize=itemsize,
        )
    if is_torch_tensor(x):
        return TensorSpec(
            shape=tuple(x.shape),
            dtype=str(x.dtype).removeprefix("torch."),
            strides=tuple(x.stride()),
            device=str(x.device),
            ptr=x.data_ptr() if x.device.type != "meta" else 0,
            itemsize=x.element_size(),
        )
    raise TypeError(f"cannot describe {type(x).__name__} as a tensor")


def describe_or_none(x: Any) -> TensorSpec | None:
    if x is None or type(x) in SCALAR_TYPES:
        return None
    return describe(x)


def byte_range(t: TensorSpec) -> tuple[int, int]:
    """Byte range [lo, hi) that a view can touch."""
    lo = hi = 0
    for n, s in zip(t.shape, t.strides):
        if n == 0:
            return t.ptr, t.ptr
        reach = (n - 1) * s * t.itemsize
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return t.ptr + lo, t.ptr + hi + t.itemsize


def overlaps(a: Any, b: Any) -> bool:
    """Whether two arrays (NumPy or torch) may touch the same memory."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if not np.may_share_memory(a, b):
            return False
        try:
            return bool(np.shares_memory(a, b, max_work=10_000))
        except np.exceptions.TooHardError:
            return True  # cannot prove disjoint: treat as overlapping
    sa, sb = describe(a), describe(b)
    if sa.device != sb.device:
        return False
    (alo, ahi), (blo, bhi) = byte_range(sa), byte_range(sb)
    return alo < bhi and blo < ahi


def _same_view(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        same_layout = (a.shape, a.strides, a.dtype) == (b.shape, b.strides, b.dtype)
        return same_layout and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    sa, sb = describe(a), describe(b)
    return (sa.ptr, sa.shape, sa.strides, sa.dtype) == (sb.ptr, sb.shape, sb.strides, sb.dtype)


MAX_OVERLAP_PROOF = 1 << 20  # elements enumerated to prove that an unusually strided view does not overlap itself


def overlaps_itself(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether two elements of a view (strides in elements) share memory. Exact: dims sorted by stride, each
    stride beyond the reach of the smaller ones proves the view free of overlap; otherwise its offsets are
    enumerated (a view too large for that counts as overlapping)."""
    if 0 in shape:
        return False
    dims = sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1)
    reach = 0  # the largest offset the dims so far reach
    for stride, n in dims:
        if stride <= reach:
            break
        reach += stride * (n - 1)
    else:
        return False
    if any(stride == 0 for stride, _ in dims) or math.prod(n for _, n in dims) > MAX_OVERLAP_PROOF:
        return True
    offsets = np.zeros(1, np.int64)
    for stride, n in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * stride).reshape(-1)
    return len(np.unique(offsets)) < len(offsets)


def check_output_aliasing(
    op: str, names: tuple[str, ...], inputs: tuple, out: Any, inplace: bool, out_name: str = "out"
) -> None:
    """Reject a read-only `out` and one that overlaps an input; `inplace` ops accept `out` that *is*
    an input's view. `out_name`: what the error calls `out` (an op's second output buffer, say)."""
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ArgumentError(f"{op}: argument '{out_name}' expected a writable array, got a read-only one")
    for name, x in zip(names, inputs):
        if x is None or type(x) in SCALAR_TYPES or (inplace and x is out) or not overlaps(out, x):
            continue
        if inplace and _same_view(out, x):
            continue
        rule = "no overlap, or exactly the same view for in-place use" if inplace else "no overlap"
        raise LayoutError(f"{op}: argument '{out_name}' overlaps input '{name}'; expected {rule}")


def check_out_autograd(op: str, names: tuple[str, ...], inputs: tuple, out: Any) -> None:
    """`out=` into a PyTorch tensor, refused where PyTorch's own out= functions refuse it: while grad mode is on
    and any tensor of the call requires grad (autograd cannot record the write: gradients would be silently
    wrong), and into an inference tensor outside inference mode."""
    torch = sys.modules["torch"]
    if torch.is_grad_enabled():
        tensor = torch.Tensor
        for name, x in zip(("out", *names), (out, *inputs)):
            if isinstance(x, tensor) and x.requires_grad:
                raise ArgumentError(
                    f"{op}: argument '{name}' requires grad, and a call with out= is not recorded by autograd (as "
                    "PyTorch's out= functions refuse it); call it under torch.no_grad(), or without out="
                )
    _check_inference(op, "out", out, torch)


def check_written_tensor(op: str, name: str, x: Any) -> None:
    """A PyTorch tensor a kernel writes besides `out` (an op's buffer): refused while grad mode is on if it
    requires grad, and as an inference tensor outside inference mode, as PyTorch's in-place ops refuse them."""
    torch = sys.modules["torch"]
    if x.requires_grad and torch.is_grad_enabled():
        raise ArgumentError(
            f"{op}: argument '{name}' requires grad, and the kernels write it without autograd recording the write; "
            "call it under torch.no_grad(), or pass a tensor that does not require grad"
        )
    _check_inference(op, name, x, torch)


def _check_inference(op: str, name: str, x: Any, torch: Any) -> None:
    if x.is_inference() and not torch.is_inference_mode_enabled():
        raise ArgumentError(
            f"{op}: argument '{name}' is an inference tensor, which may be written only inside torch.inference_mode()"
        )


def mark_written(out: Any) -> None:
    """Bump a tensor's version counter, as PyTorch's in-place ops do: a backward that saved its old values then
    raises instead of computing wrong gradients."""
    sys.modules["torch"].autograd.graph.increment_version(out)


def returned_array_problem(x: Any, shape: tuple[int, ...], dtype: str, device: str) -> str | None:
    """Why `x` is not an array of `shape` and `dtype` on `device` (a NumPy array on the CPU, a tensor
    elsewhere); None when it is."""
    expected = f"a {dtype} array of shape {shape} on {device}"
    on_cpu = device == "cpu"
    if not (type(x) is np.ndarray if on_cpu else is_torch_tensor(x)):
        return f"{expected}, got {type(x).__name__}"
    got = describe(x)
    if (got.shape, got.dtype, got.device) != (tuple(shape), dtype, device):
        return f"{expected}, got a {got.dtype} array of shape {got.shape} on {got.device}"
    return None
