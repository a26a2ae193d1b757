"""The ONNX backend node tests the session claims, on a CUDA device: our kernels where the selector picks them,
the op records' PyTorch functions elsewhere, ops without one on the host, CUDA graphs on (captured wherever a
plan has no host step or value-set shape). NumPy inputs in, NumPy outputs back. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from test_onnx_torch_opmap import CASES, KNOWN_TORCH  # the claimed cases, loaded once

from xpuruntime.onnx import InferenceSession, SessionOptions, UnsupportedModelError

pytestmark = pytest.mark.gpu


def _array(x: object) -> np.ndarray:
    return onnx.numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN_TORCH[c.name])) if c.name in KNOWN_TORCH else c
        for c in CASES
    ],
    ids=lambda c: c.name,
)
def test_node_on_gpu(case: object) -> None:
    try:
        session = InferenceSession(case.model, SessionOptions(graph_optimization_level="all"), device="cuda")
    except UnsupportedModelError as exc:
        assert "uint" in str(exc)  # PyTorch lacks most ops on uint16/32/64: refused at load time, by design
        pytest.skip(str(exc))
    initializers = {i.name for i in case.model.graph.initializer}
    declared = [
        onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in case.model.graph.input
        if i.name not in initializers
    ]
    names = [i.name for i in session.get_inputs()]
    for _ in range(2):  # the second run replays the captured CUDA graph, where there is one
        for inputs, outputs in case.data_sets:
            arrays = [_array(x) for x in inputs]
            arrays = [a.astype(d) if a.dtype == object else a for a, d in zip(arrays, declared)]
            got = session.run(None, dict(zip(names, arrays)))
            for g, e in zip(got, outputs):
                e = _array(e)
                assert g.dtype == e.dtype and g.shape == e.shape, f"got {g.dtype}{g.shape}, expected {e.dtype}{e.shape}"
                np.testing.assert_allclose(g, e, rtol=max(case.rtol, 1e-3), atol=max(case.atol, 1e-5), equal_nan=True)
