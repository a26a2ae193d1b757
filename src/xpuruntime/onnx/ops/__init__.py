"""The ONNX ops the session runs: one `OpRecord` per op (see record.py), in one module per op family.

Adding an op: write its NumPy builder (and its PyTorch builder for the GPU path) in the family's module and
call `op(...)` with the facts about it; importing the module here registers it. Nothing else lists ops.
An op can be written once for both paths against arrays.py's `xp` (`op(name, *builders(fn))`); one without
a PyTorch builder runs on the host on the GPU path. Control flow (control.py) runs its subgraphs' nodes
through these same records.
"""

from __future__ import annotations

import importlib

from .record import OPS, LoadContext, OpRecord

FAMILIES = (
    "attention", "bitwise", "control", "conv", "conv_region", "detection", "elementwise", "indexing", "linalg",
    "losses", "nn", "pad", "pool", "quantize", "recurrent", "reduce", "resize", "rotary", "sampling", "shape",
    "spectral", "text",
)  # fmt: skip
for _family in FAMILIES:  # importing a family's module registers its ops
    importlib.import_module(f".{_family}", __name__)

SUPPORTED = frozenset(OPS) | {"Constant"}  # Constant nodes become initializers when the model is loaded

__all__ = ["OPS", "SUPPORTED", "LoadContext", "OpRecord"]
