"""ONNX element types as NumPy dtype names, and the ones the session runs (one place, below the importer and
the op records)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper

# the tensor dtypes the session runs (not bfloat16, the float 8, 4 and 2-bit types, strings)
SUPPORTED_DTYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
})  # fmt: skip


@functools.lru_cache(maxsize=64)
def dtype_name(elem_type: int) -> str:
    """ONNX TensorProto element type -> NumPy dtype name ('bfloat16', 'string', ... for the unsupported)."""
    if elem_type == onnx.TensorProto.STRING:
        return "string"  # NumPy would say 'object'
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return (
            onnx.TensorProto.DataType.Name(elem_type).lower()
            if elem_type in onnx.TensorProto.DataType.values()
            else f"type#{elem_type}"
        )
