"""GatherND, ScatterND, ScatterElements and OneHot on random shapes against onnxruntime, on the CPU and through
the GPU path's PyTorch functions (CPU tensors), and their errors for indices out of range."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import make, no_host_reads, onnxruntime, ours, randn, run_on, same, vi

from xpuruntime.graph.ir import Node
from xpuruntime.onnx import NodeExecutionError
from xpuruntime.onnx.ops import OPS

F, I64 = TensorProto.FLOAT, TensorProto.INT64
PATHS = ("numpy", "torch")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("batch_dims", [0, 1, 2])
def test_gather_nd_with_batch_dims_and_negative_indices(path: str, batch_dims: int, torch_session, rng) -> None:
    data = randn(rng, 3, 4, 5, 6)
    depth = 4 - batch_dims - 1
    lead = (3, 4)[:batch_dims]
    dims = data.shape[batch_dims : batch_dims + depth]
    indices = np.stack([rng.integers(-n, n, (*lead, 7)) for n in dims], axis=-1)
    node = helper.make_node("GatherND", ["data", "indices"], ["y"], batch_dims=batch_dims)
    model = make([node], [vi("data", list(data.shape)), vi("indices", list(indices.shape), I64)], [vi("y", None)])
    feed = {"data": data, "indices": indices}
    same(run_on(path, torch_session, model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_on_the_gpu_path_reads_no_index_on_the_host_while_capturing(batch_dims: int, monkeypatch,
                                                                             rng) -> None:  # fmt: skip
    """HF's padding-mask indexing (GatherND of a bool [B, S] mask with [B, 1, 1, S, 2] indices) sits inside the
    CUDA graph the GPU runner captures: its PyTorch function indexes on the indices' device, reading nothing
    on the host (it copied them to the host, and capture failed on BERT, GPT-2 and Llama)."""
    torch = pytest.importorskip("torch")
    data = rng.random((3, 5, 4)) > 0.5
    lead = (3,)[:batch_dims]
    indices = np.stack([rng.integers(-n, n, (*lead, 2, 6)) for n in data.shape[batch_dims : batch_dims + 2]], -1)
    node = Node("GatherND", ["data", "indices"], ["y"], {"batch_dims": batch_dims}, "g")
    want = OPS["GatherND"].numpy(node, 13)(data, indices)
    gather = OPS["GatherND"].torch(node, 13)
    with no_host_reads(monkeypatch):
        got = gather(torch.from_numpy(data), torch.from_numpy(indices))
    assert got.dtype == torch.bool and np.array_equal(got.numpy(), want)


def test_gather_nd_on_the_gpu_path_checks_indices_outside_capture(torch_session) -> None:
    node = helper.make_node("GatherND", ["data", "indices"], ["y"])
    model = make([node], [vi("data", [5, 4]), vi("indices", [1, 2], I64)], [vi("y", None)], opset=13)
    with pytest.raises(NodeExecutionError, match=r"GatherND: indices outside \[-4, 4\) for axis 1"):
        torch_session(model).run(None, {"data": np.ones((5, 4), np.float32), "indices": np.array([[0, 4]])})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_and_elements_reductions(path: str, reduction: str, torch_session, rng) -> None:
    data = randn(rng, 5, 4, 3)
    nd_index = rng.integers(-5, 5, (6, 1)) if reduction != "none" else rng.permutation(5)[:3, None] - 5
    nd_updates = randn(rng, len(nd_index), 4, 3)
    el_index = rng.integers(-4, 4, (5, 2, 3)) if reduction != "none" else np.argsort(rng.random((5, 4, 3)), 1)[:, :2]
    nodes = [
        helper.make_node("ScatterND", ["data", "nd_index", "nd_updates"], ["a"], reduction=reduction),
        helper.make_node("ScatterElements", ["data", "el_index", "el_updates"], ["b"], axis=1, reduction=reduction),
    ]
    inputs = [vi("data", [5, 4, 3]), vi("nd_index", list(nd_index.shape), I64),
              vi("nd_updates", list(nd_updates.shape)), vi("el_index", [5, 2, 3], I64), vi("el_updates", [5, 2, 3])]  # fmt: skip
    model = make(nodes, inputs, [vi("a", None), vi("b", None)], opset=18)
    feed = {"data": data, "nd_index": nd_index, "nd_updates": nd_updates, "el_index": el_index,
            "el_updates": randn(rng, 5, 2, 3)}  # fmt: skip
    same(run_on(path, torch_session, model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_wraps_negative_indices_and_drops_those_outside(path: str, axis: int, torch_session, rng) -> None:
    indices = rng.integers(-9, 9, (3, 4)).astype(np.int64)  # depth 6: some outside [-6, 6) select nothing
    node = helper.make_node("OneHot", ["indices", "depth", "values"], ["y"], axis=axis)
    consts = {"depth": np.array(6, np.int64), "values": np.array([-0.5, 2.0], np.float32)}
    model = make([node], [vi("indices", [3, 4], I64)], [vi("y", None)], consts, 11)
    feed = {"indices": indices}
    same(run_on(path, torch_session, model, feed), onnxruntime(model, feed))


@pytest.mark.parametrize(
    ("op", "indices"),
    [("GatherND", np.array([[0, 4]])), ("ScatterElements", np.array([[0, -7]])), ("ScatterND", np.array([[5]]))],
)
def test_indices_out_of_range_name_the_op(op: str, indices: np.ndarray, rng) -> None:
    data = randn(rng, 5, 4)
    if op == "GatherND":
        node, updates = helper.make_node(op, ["data", "i"], ["y"]), None
    else:
        updates = randn(rng, *(indices.shape if op == "ScatterElements" else (1, 4)))
        node = helper.make_node(op, ["data", "i", "u"], ["y"], **({"axis": 1} if op == "ScatterElements" else {}))
    consts = {"i": indices} if updates is None else {"i": indices, "u": updates}
    model = make([node], [vi("data", [5, 4])], [vi("y", None)], consts, 18)
    with pytest.raises(NodeExecutionError, match=rf"{op}: indices outside"):
        ours(model, {"data": data}, level="disabled")


# -- Compress, NonZero, Unique, ReverseSequence, TensorScatter ------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_compress_nonzero_and_unique_match_onnxruntime(path: str, torch_session, rng) -> None:
    x = rng.integers(-3, 4, (4, 6)).astype(np.float32)
    x[2] = x[0]  # a repeated row for Unique along axis 0
    nodes = [
        helper.make_node("Compress", ["x", "keep"], ["c0"], axis=0),
        helper.make_node("Compress", ["x", "short"], ["c1"], axis=-1),  # shorter than the axis
        helper.make_node("Compress", ["x", "flat"], ["c"]),
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Unique", ["x"], ["u", "ui", "uinv", "uc"], sorted=1),
        helper.make_node("Unique", ["x"], ["v", "vi", "vinv", "vc"], sorted=0),
        helper.make_node("Unique", ["x"], ["r", "ri", "rinv", "rc"], axis=0),
    ]
    outs = [o for n in nodes for o in n.output]
    types = {o: I64 if o in ("nz", "ui", "uinv", "uc", "vi", "vinv", "vc", "ri", "rinv", "rc") else F for o in outs}
    B = TensorProto.BOOL
    inputs = [vi("x", [4, 6]), vi("keep", [4], B), vi("short", [4], B), vi("flat", [10], B)]
    model = make(nodes, inputs, [vi(o, None, types[o]) for o in outs], opset=11)
    feed = {"x": x, "keep": rng.random(4) < 0.5, "short": rng.random(4) < 0.5, "flat": rng.random(10) < 0.5}
    same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=0, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_reverse_sequence_and_tensor_scatter(path: str, torch_session, rng) -> None:
    x = randn(rng, 5, 3, 2)
    node = helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=1, time_axis=0)
    model = make([node], [vi("x", [5, 3, 2]), vi("lens", [3], I64)], [vi("y", None)], opset=10)
    feed = {"x": x, "lens": np.array([5, 1, 3], np.int64)}
    same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=0, rtol=0)
    past, update = randn(rng, 2, 3, 6, 4), randn(rng, 2, 3, 3, 4)
    for mode, write in (("linear", [0, 3]), ("circular", [4, 5])):
        node = helper.make_node("TensorScatter", ["past", "update", "write"], ["present"], mode=mode, axis=2)
        inputs = [vi("past", [2, 3, 6, 4]), vi("update", [2, 3, 3, 4]), vi("write", [2], I64)]
        model = make([node], inputs, [vi("present", None)], opset=24)
        want = past.copy()
        for b, start in enumerate(write):
            for s in range(3):
                want[b, :, (start + s) % 6] = update[b, :, s]
        feed = {"past": past, "update": update, "write": np.array(write, np.int64)}
        same(run_on(path, torch_session, model, feed), [want], atol=0, rtol=0)
    with pytest.raises(NodeExecutionError, match=r"TensorScatter: write_indices \[4 5\] \+ 3 updates run past"):
        node = helper.make_node("TensorScatter", ["past", "update", "write"], ["present"], axis=2)
        run_on("numpy", None, make([node], inputs, [vi("present", None)], opset=24), feed)
