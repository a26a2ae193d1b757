"""Each pass alone: it changes the graph as intended and never what the graph computes (compared with the
unoptimized graph on random inputs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from xpuruntime.graph.ir import Graph
from xpuruntime.graph.passes import (
    PassContext,
    attention_fusion,
    constant_folding,
    conv_activation_fusion,
    conv_regions,
    cse,
    dead_code,
    elementwise_fusion,
    gelu_fusion,
    layer_norm_fusion,
    layout_cleanup,
    linear_fusion,
    matmul_packing,
    optimize,
    shape_inference,
)  # fmt: skip
from xpuruntime.onnx.executor import run_graph
from xpuruntime.onnx.importer import import_model
from xpuruntime.onnx.semantics import ONNX_SEMANTICS
from xpuruntime.registry import default_registry

F = TensorProto.FLOAT


def ctx() -> PassContext:
    return PassContext(frozenset(default_registry().ops), semantics=ONNX_SEMANTICS)


def model(nodes: list, inputs: list, outputs: list, consts: dict[str, np.ndarray]) -> Graph:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    g = helper.make_graph(nodes, "t", inputs, outputs, inits)
    graph = import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    shape_inference.run(graph, ctx())
    return graph


def check_pass(graph: Graph, run_pass, feeds: dict[str, np.ndarray], atol: float = 1e-5) -> Graph:
    """Apply one pass to a copy; outputs must match the original graph's. Returns the changed graph."""
    before = run_graph(graph, feeds)
    changed = graph.copy()
    assert run_pass(changed, ctx()) > 0, "the pass changed nothing"
    changed.verify()
    after = run_graph(changed, feeds)
    for b, a in zip(before, after):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol)
    return changed


def vi(name: str, shape: list, dtype: int = F) -> object:
    return helper.make_tensor_value_info(name, dtype, shape)


rng = np.random.default_rng(0)


def test_constant_folding_folds_constants_and_shape_chains() -> None:
    nodes = [
        helper.make_node("Add", ["c1", "c2"], ["c3"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["width"]),  # dim 1 is fixed: foldable
        helper.make_node("Unsqueeze", ["width", "zero"], ["w1"]),
        helper.make_node("Concat", ["minus1", "w1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Mul", ["r", "c3"], ["y"]),
    ]
    consts = {"c1": np.float32(1.5), "c2": np.float32(2.0), "one": np.int64(1), "zero": np.array([0], np.int64),
              "minus1": np.array([-1], np.int64)}  # fmt: skip
    g = model(nodes, [vi("x", ["B", 6])], [vi("y", ["B", 6])], consts)
    out = check_pass(g, constant_folding.run, {"x": rng.standard_normal((4, 6)).astype(np.float32)})
    dead_code.run(out, ctx())  # the Shape node is now unread
    assert [n.op for n in out.nodes] == ["Reshape", "Mul"]
    assert out.initializers["target"].tolist() == [-1, 6]


def test_cse_merges_identical_nodes() -> None:
    nodes = [
        helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Exp", ["x"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]  # fmt: skip
    g = model(nodes, [vi("x", [3, 5])], [vi("y", [3, 5])], {})
    out = check_pass(g, cse.run, {"x": rng.standard_normal((3, 5)).astype(np.float32)})
    dead_code.run(out, ctx())
    assert [n.op for n in out.nodes] == ["Exp", "Add"] and out.nodes[1].inputs == ["a", "a"]


def test_dead_code_removes_unused_nodes() -> None:
    nodes = [helper.make_node("Exp", ["x"], ["unused"]), helper.make_node("Neg", ["x"], ["y"])]
    g = model(nodes, [vi("x", [4])], [vi("y", [4])], {"spare": np.ones(3, np.float32)})
    out = check_pass(g, dead_code.run, {"x": rng.standard_normal(4).astype(np.float32)})
    assert [n.op for n in out.nodes] == ["Neg"] and "spare" not in out.initializers


def test_layout_cleanup_removes_needless_moves() -> None:
    nodes = [
        helper.make_node("Identity", ["x"], ["i"]),
        helper.make_node("Transpose", ["i"], ["t1"], perm=[1, 0, 2]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0, 2]),
        helper.make_node("Reshape", ["t2", "flat"], ["r1"]),
        helper.make_node("Reshape", ["r1", "back"], ["r2"]),
        helper.make_node("ReduceSum", ["r2", "axes"], ["y"], keepdims=0),
    ]
    consts = {"flat": np.array([-1], np.int64), "back": np.array([2, 3, 4], np.int64), "axes": np.array([2], np.int64)}
    g = model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 3])], consts)
    out = check_pass(g, layout_cleanup.run, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})
    dead_code.run(out, ctx())
    assert [n.op for n in out.nodes] == ["ReduceSum"] and out.nodes[0].inputs[0] == "x"


def test_layout_cleanup_removes_reshape_sandwich_around_matmul() -> None:
    w = rng.standard_normal((4, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Reshape", ["x", "to2d"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w"], ["m"]),
        helper.make_node("Reshape", ["m", "to3d"], ["y"]),
    ]
    consts = {"w": w, "to2d": np.array([6, 4], np.int64), "to3d": np.array([2, 3, 5], np.int64)}
    g = model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 3, 5])], consts)
    out = check_pass(g, layout_cleanup.run, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})
    dead_code.run(out, ctx())
    assert [n.op for n in out.nodes] == ["MatMul"] and out.nodes[0].inputs[0] == "x"


def gelu_nodes(x: str, y: str) -> list:
    return [
        helper.make_node("Div", [x, "sqrt2"], [y + "_d"]), helper.make_node("Erf", [y + "_d"], [y + "_e"]),
        helper.make_node("Add", [y + "_e", "one"], [y + "_a"]), helper.make_node("Mul", [x, y + "_a"], [y + "_m"]),
        helper.make_node("Mul", [y + "_m", "half"], [y]),
    ]  # fmt: skip


GELU_CONSTS = {"sqrt2": np.float32(math.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5)}


def test_gelu_fusion() -> None:
    g = model(gelu_nodes("x", "y"), [vi("x", [3, 7])], [vi("y", [3, 7])], GELU_CONSTS)
    out = check_pass(g, gelu_fusion.run, {"x": rng.standard_normal((3, 7)).astype(np.float32) * 3})
    assert [n.op for n in out.nodes] == ["Gelu"]


def test_layer_norm_fusion() -> None:
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["y"]),
    ]
    consts = {"two": np.float32(2), "eps": np.float32(1e-5), "gamma": rng.standard_normal(8).astype(np.float32),
              "beta": rng.standard_normal(8).astype(np.float32)}  # fmt: skip
    g = import_model(helper.make_model(
        helper.make_graph(nodes, "t", [vi("x", [2, 5, 8])], [vi("y", [2, 5, 8])],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]),
        opset_imports=[helper.make_opsetid("", 13)]))  # fmt: skip
    shape_inference.run(g, ctx())
    out = check_pass(g, layer_norm_fusion.run, {"x": rng.standard_normal((2, 5, 8)).astype(np.float32)})
    assert [n.op for n in out.nodes] == ["LayerNormalization"]


def test_attention_fusion() -> None:
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Div", ["s", "scale"], ["s2"]),
        helper.make_node("Add", ["s2", "mask"], ["s3"]),
        helper.make_node("Softmax", ["s3"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    shape = [2, 3, 5, 4]
    g = model(nodes, [vi("q", shape), vi("k", shape), vi("v", shape), vi("mask", [2, 1, 1, 5])], [vi("y", shape)],
              {"scale": np.float32(2.0)})  # fmt: skip
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    feeds["mask"] = np.where(rng.random((2, 1, 1, 5)) < 0.3, -1e4, 0).astype(np.float32)
    out = check_pass(g, attention_fusion.run, feeds)
    dead_code.run(out, ctx())  # the K^T transpose is now unread
    assert [n.op for n in out.nodes] == ["attention"] and out.nodes[0].attrs["scale"] == 0.5


def test_linear_fusion() -> None:
    w, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]  # fmt: skip
    g = model(nodes, [vi("x", [2, 3, 6])], [vi("y", [2, 3, 4])], {"w": w, "b": b})
    feeds = {"x": rng.standard_normal((2, 3, 6)).astype(np.float32)}
    assert linear_fusion.run(g.copy(), ctx()) == 0  # CPU graphs keep MatMul + Add (faster there)
    gpu = lambda graph, c: linear_fusion.run(graph, PassContext(c.available_ops, "cuda"))  # noqa: E731
    out = check_pass(g, gpu, feeds)
    assert [n.op for n in out.nodes] == ["linear"] and out.nodes[0].attrs["activation"] == "relu"


ACTIVATIONS = [  # (node, its constants): every activation the fused Conv applies
    (helper.make_node("Relu", ["c"], ["y"]), {}),
    (helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2), {}),
    (helper.make_node("Sigmoid", ["c"], ["y"]), {}),
    (helper.make_node("Tanh", ["c"], ["y"]), {}),
    (helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4), {}),
    (helper.make_node("HardSwish", ["c"], ["y"]), {}),
    (helper.make_node("Clip", ["c", "lo", "hi"], ["y"]), {"lo": np.float32(-0.5), "hi": np.float32(0.75)}),
    (helper.make_node("Clip", ["c", "", "hi"], ["y"]), {"hi": np.float32(0.75)}),
]


@pytest.mark.parametrize("torch_kernels", [True, False], ids=["pytorch", "numpy"])
@pytest.mark.parametrize("case", range(len(ACTIVATIONS)))
def test_conv_activation_fusion(case: int, torch_kernels: bool, monkeypatch) -> None:
    """A Conv (odd sizes, groups, strides, asymmetric pads, a bias) and the activation after it become one
    FusedConv whose outputs equal the two nodes', through PyTorch's CPU kernels and through NumPy."""
    from xpuruntime.onnx.ops import conv as conv_ops

    monkeypatch.setattr(conv_ops, "CPU_TORCH", torch_kernels and conv_ops.CPU_TORCH)
    act, consts = ACTIVATIONS[case]
    w, b = rng.standard_normal((6, 2, 3, 2)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], group=2, strides=[2, 1], pads=[1, 0, 0, 1])
    g = model([conv, act], [vi("x", [2, 4, 7, 5])], [vi("y", [2, 6, 3, 5])], {"w": w, "b": b, **consts})
    feeds = {"x": rng.standard_normal((2, 4, 7, 5)).astype(np.float32) * 3}
    out = check_pass(g, conv_activation_fusion.run, feeds)
    assert [n.op for n in out.nodes] == ["FusedConv"] and out.nodes[0].attrs["activation"] == act.op_type


def test_conv_activation_fusion_leaves_a_shared_output_and_a_computed_bound() -> None:
    w = rng.standard_normal((3, 3, 1, 1)).astype(np.float32)
    shared = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("Add", ["r", "c"], ["y"])]  # fmt: skip
    computed = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
                helper.make_node("Clip", ["c", "", "m"], ["y"])]  # fmt: skip
    for nodes in (shared, computed):
        g = model(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", [1, 3, 4, 4])], {"w": w})
        assert conv_activation_fusion.run(g, ctx()) == 0


def residual_cnn(fused: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
    """Conv, Relu, a grouped Conv, a residual Add, Relu (also a graph output), MaxPool, a dilated FusedConv, an Add
    that broadcasts a constant, GlobalAveragePool: one region, with two outputs and a broadcast."""
    w1, b1 = rng.standard_normal((4, 4, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    w2 = rng.standard_normal((4, 2, 3, 1)).astype(np.float32)
    w3, b3 = rng.standard_normal((6, 4, 3, 3)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    shift = rng.standard_normal((1, 6, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=2, pads=[1, 0, 1, 0]),
        helper.make_node("Add", ["c2", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["m", "w3", "b3"], ["c3"], dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("Add", ["r3", "shift"], ["s"]),
        helper.make_node("GlobalAveragePool", ["s"], ["y"]),
    ]
    g = model(nodes, [vi("x", [2, 4, 7, 5])], [vi("y", [2, 6, 1, 1]), vi("r2", [2, 4, 7, 5])],
              {"w1": w1, "b1": b1, "w2": w2, "w3": w3, "b3": b3, "shift": shift})  # fmt: skip
    if fused:  # as the pipeline runs it first: FusedConv nodes join regions too
        conv_activation_fusion.run(g, ctx())
    return g, {"x": rng.standard_normal((2, 4, 7, 5)).astype(np.float32)}


def test_conv_regions_run_a_cnn_on_onednn_layout_with_unchanged_outputs() -> None:
    g, feeds = residual_cnn()
    out = check_pass(g, conv_regions.run, feeds, atol=1e-4)
    assert [n.op for n in out.nodes] == ["ConvRegion"]
    assert out.nodes[0].outputs == ["r2", "y"] or sorted(out.nodes[0].outputs) == ["r2", "y"]
    body = out.nodes[0].attrs["body"]
    assert [n.op for n in body.nodes].count("FusedConv") == 2 and len(body.nodes) == 8


def squeeze_excite_cnn() -> tuple[Graph, dict[str, np.ndarray]]:
    """MobileNetV3's pieces: a depthwise Conv + HardSwish, squeeze-excite (ReduceMean over H and W, 1x1 Conv + Relu,
    1x1 Conv + PyTorch's HardSigmoid, a broadcast Mul), a Conv + Clip, a Conv + HardSigmoid of other constants
    (applied after oneDNN's convolution) and a Sigmoid."""
    c = 8
    consts = {"wd": rng.standard_normal((c, 1, 3, 3)), "bd": rng.standard_normal(c), "w1": rng.standard_normal((4, c, 1, 1)),
              "b1": rng.standard_normal(4), "w2": rng.standard_normal((c, 4, 1, 1)), "b2": rng.standard_normal(c),
              "w3": rng.standard_normal((6, c, 1, 1)), "w4": rng.standard_normal((6, 6, 3, 3))}  # fmt: skip
    consts = {k: v.astype(np.float32) for k, v in {**consts, "lo": np.array(-0.5), "hi": np.array(0.75)}.items()}
    nodes = [
        helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["d"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["m"], axes=[2, 3], keepdims=1),
        helper.make_node("Conv", ["m", "w1", "b1"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["s2"]),
        helper.make_node("HardSigmoid", ["s2"], ["g"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["h", "g"], ["e"]),
        helper.make_node("Conv", ["e", "w3"], ["c3"]),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["k"]),
        helper.make_node("Conv", ["k", "w4"], ["c4"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c4"], ["hs"], alpha=0.2, beta=0.4),
        helper.make_node("Sigmoid", ["hs"], ["y"]),
    ]
    g = model(nodes, [vi("x", [2, c, 9, 7])], [vi("y", [2, 6, 9, 7])], consts)
    conv_activation_fusion.run(g, ctx())
    return g, {"x": rng.standard_normal((2, c, 9, 7)).astype(np.float32) * 2}


def test_conv_regions_take_squeeze_excite_and_every_fused_activation() -> None:
    g, feeds = squeeze_excite_cnn()
    out = check_pass(g, conv_regions.run, feeds, atol=1e-4)
    assert [n.op for n in out.nodes] == ["ConvRegion"]
    ops = out.nodes[0].attrs["body"].op_counts()
    assert ops == {"FusedConv": 5, "GlobalAveragePool": 1, "Mul": 1, "Sigmoid": 1}, ops


def test_conv_regions_only_on_the_cpu_with_pytorch(monkeypatch) -> None:
    from xpuruntime.onnx.ops import conv as conv_ops

    g, _ = residual_cnn()
    assert conv_regions.run(g.copy(), PassContext(ctx().available_ops, "cuda", ONNX_SEMANTICS)) == 0
    monkeypatch.setattr(conv_ops, "CPU_TORCH", False)
    assert conv_regions.run(g.copy(), ctx()) == 0


def projections(biased: bool, k: int = 6) -> tuple[list, dict]:
    """x @ Wq, x @ Wk, x @ Wv (+ bq, bk, bv), each reshaped to heads as attention's projections are."""
    nodes, consts = [], {"heads": np.array([2, 3, 2, -1], np.int64)}
    for name, n in (("q", 4), ("k", 4), ("v", 6)):
        consts[f"w{name}"] = rng.standard_normal((k, n)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_mm"]))
        if biased:
            consts[f"b{name}"] = rng.standard_normal(n).astype(np.float32)
            nodes.append(helper.make_node("Add", [f"b{name}", f"{name}_mm"], [f"{name}_b"]))  # bias first
        nodes.append(helper.make_node("Reshape", [f"{name}_b" if biased else f"{name}_mm", "heads"], [name]))
    return nodes, consts


@pytest.mark.parametrize("biased", [True, False])
def test_matmul_packing_makes_one_gemm_and_a_split(biased: bool) -> None:
    nodes, consts = projections(biased)
    outputs = [vi("q", [2, 3, 2, 2]), vi("k", [2, 3, 2, 2]), vi("v", [2, 3, 2, 3])]
    g = model(nodes, [vi("x", [2, 3, 6])], outputs, consts)
    out = check_pass(g, matmul_packing.run, {"x": rng.standard_normal((2, 3, 6)).astype(np.float32)})
    ops = [n.op for n in out.nodes]
    assert ops == ["MatMul", *(["Add"] if biased else []), "Split", "Reshape", "Reshape", "Reshape"]
    assert out.constant(out.nodes[0].inputs[1]).shape == (6, 14)
    assert matmul_packing.run(g.copy(), PassContext(ctx().available_ops, "cuda")) == 1  # GPU graphs alike


def test_matmul_packing_stacks_the_linears_of_gpu_graphs() -> None:
    """On a GPU graph the linear fusion has made the biased projections `linear` nodes ((N, K) weights): the three
    reading x become one linear on the stacked weights and biases, then a Split; outputs unchanged."""
    nodes, consts = projections(True)
    outputs = [vi("q", [2, 3, 2, 2]), vi("k", [2, 3, 2, 2]), vi("v", [2, 3, 2, 3])]
    g = model(nodes, [vi("x", [2, 3, 6])], outputs, consts)
    cuda = PassContext(ctx().available_ops, "cuda", ONNX_SEMANTICS)
    assert linear_fusion.run(g, cuda) == 3
    out = check_pass(
        g, lambda graph, _: matmul_packing.run(graph, cuda), {"x": rng.standard_normal((2, 3, 6)).astype(np.float32)}
    )
    assert [n.op for n in out.nodes] == ["linear", "Split", "Reshape", "Reshape", "Reshape"]
    weight, bias = (out.constant(name) for name in out.nodes[0].inputs[1:])
    assert weight.shape == (14, 6) and bias.shape == (14,)


def test_matmul_packing_leaves_lone_or_mismatched_matmuls() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["b"]),
             helper.make_node("MatMul", ["x", "s"], ["c"])]  # fmt: skip
    consts = {"w1": np.ones((6, 6), np.float32), "w2": np.ones((6, 2), np.float32)}
    g = model(nodes, [vi("x", [3, 6]), vi("s", [6, 2])], [vi("b", [3, 2]), vi("c", [3, 2])], consts)
    assert matmul_packing.run(g, ctx()) == 0  # one constant-weight MatMul per activation (s is an input)


def test_elementwise_fusion_makes_one_node_per_chain() -> None:
    nodes = [*gelu_nodes("x", "g"), helper.make_node("Add", ["g", "bias"], ["h"]),
             helper.make_node("Tanh", ["h"], ["y"])]  # fmt: skip
    consts = {**GELU_CONSTS, "bias": rng.standard_normal(7).astype(np.float32)}
    g = model(nodes, [vi("x", [3, 7])], [vi("y", [3, 7])], consts)
    out = check_pass(g, elementwise_fusion.run, {"x": rng.standard_normal((3, 7)).astype(np.float32)})
    assert [n.op for n in out.nodes] == ["fused_elementwise"]
    program = out.nodes[0].attrs["program"]
    assert [i[0] for i in program] == ["div", "erf", "add", "mul", "mul", "add", "tanh"]
    assert out.nodes[0].inputs == ["x", "bias"]


def test_elementwise_fusion_keeps_values_read_outside_the_chain() -> None:
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["e"], ["n"]),
             helper.make_node("MatMul", ["e", "n"], ["y"])]  # fmt: skip
    g = model(nodes, [vi("x", [4, 4])], [vi("y", [4, 4])], {})
    out = check_pass(g, elementwise_fusion.run, {"x": rng.standard_normal((4, 4)).astype(np.float32)})
    assert [n.op for n in out.nodes] == ["fused_elementwise", "fused_elementwise", "MatMul"]


@pytest.mark.parametrize("level", [0, 1, 2, 99])
def test_pipeline_levels_keep_outputs(level: int) -> None:
    nodes = [*gelu_nodes("x", "y0"), helper.make_node("Softmax", ["y0"], ["y"], axis=-1)]
    g = model(nodes, [vi("x", [3, 7])], [vi("y", [3, 7])], GELU_CONSTS)
    feeds = {"x": rng.standard_normal((3, 7)).astype(np.float32)}
    optimized, records = optimize(g, level)
    assert records[0].name == "shape_inference"
    np.testing.assert_allclose(run_graph(optimized, feeds)[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-6)
    if level == 99:
        assert [n.op for n in optimized.nodes] == ["fused_elementwise", "Softmax"]


def test_a_session_saves_its_optimized_graph_with_a_conv_region(tmp_path) -> None:
    """The region's body is a subgraph attribute (ONNX writes it) and FusedConv's empty activation_params is left
    out (ONNX cannot type an empty list); the saved graph's region holds the FusedConv nodes."""
    import onnx

    from xpuruntime.onnx import InferenceSession, SessionOptions
    from xpuruntime.onnx.export import to_onnx

    g, feeds = residual_cnn(fused=False)
    path = tmp_path / "optimized.onnx"
    session = InferenceSession(to_onnx(g).SerializeToString(), SessionOptions(optimized_model_filepath=str(path)))
    assert "ConvRegion" in session.graph.op_counts()
    saved = onnx.load(str(path))
    (region,) = [n for n in saved.graph.node if n.op_type == "ConvRegion"]
    body = next(a.g for a in region.attribute if a.name == "body")
    assert [n.op_type for n in body.node].count("FusedConv") == 2
    np.testing.assert_allclose(session.run(None, feeds)[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-4)


def test_a_region_adds_in_place_only_into_a_tensor_of_the_result_shape() -> None:
    from xpuruntime.onnx.ops.conv_region import _covers

    assert _covers((1, 72, 28, 28), (1, 72, 1, 1)) and _covers((2, 3), (3,)) and _covers((4, 5), ())
    assert not _covers((1, 72, 1, 1), (1, 72, 28, 28)) and not _covers((3,), (2, 3)) and not _covers((2, 3), (2,))


def test_a_region_reorders_weights_per_input_shape_and_forgets_old_shapes() -> None:
    """Ten image sizes, then the first again: more than MAX_SHAPES reorderings per convolution, each right."""
    from xpuruntime.onnx import InferenceSession
    from xpuruntime.onnx.export import to_onnx
    from xpuruntime.onnx.ops import conv_region

    w1, w2 = (rng.standard_normal((4, 4, 3, 3)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]  # fmt: skip
    g = model(nodes, [vi("x", ["n", 4, "h", "w"])], [vi("y", ["n", 4, "h", "w"])], {"w1": w1, "w2": w2})
    session = InferenceSession(to_onnx(g).SerializeToString())
    assert "ConvRegion" in session.graph.op_counts()
    sizes = [(5 + i, 3 + i % 4) for i in range(conv_region.MAX_SHAPES + 2)]
    for h, w in [*sizes, sizes[0]]:
        feeds = {"x": rng.standard_normal((1, 4, h, w)).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], run_graph(g, feeds)[0], rtol=1e-5, atol=1e-4)


def test_a_region_sums_residuals_into_convolutions() -> None:
    """conv(x) + conv'(x) then Relu (summed into the spare one, Relu fused), conv(r) + r (r read twice: a fresh
    output), conv(t) + a broadcast constant (the shapes differ: separate operations); outputs unchanged."""
    ws = {name: rng.standard_normal((4, 4, 3, 3)).astype(np.float32) for name in ("wa", "wb", "wc", "wd")}
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Conv", ["r", "wc"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "r"], ["t"]),
        helper.make_node("Conv", ["t", "wd"], ["d"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["d", "shift"], ["y"]),
    ]
    shift = rng.standard_normal((1, 4, 1, 1)).astype(np.float32)
    g = model(nodes, [vi("x", [2, 4, 6, 5])], [vi("y", [2, 4, 6, 5])], {**ws, "shift": shift})
    out = check_pass(g, conv_regions.run, {"x": rng.standard_normal((2, 4, 6, 5)).astype(np.float32)}, atol=1e-4)
    assert [n.op for n in out.nodes] == ["ConvRegion"]


def test_a_region_reuses_its_steps_per_signature_and_overwrites_only_dead_values() -> None:
    """Squeeze-excite (its 1x1 convolutions of the pooled image are matrix products) whose Mul is the last reader
    of `d` (so multiplies in place) while `d` is read before by the pooling, a Relu of a returned value (not in
    place), and a Mul of the region's input (never overwritten): run at two batch sizes in turn, so each reuses the
    steps made at its first run; outputs equal the unfused graph's and the feed is unchanged."""
    from xpuruntime.onnx import InferenceSession
    from xpuruntime.onnx.export import to_onnx

    c = 6
    consts = {"wd": rng.standard_normal((c, 1, 3, 3)), "w1": rng.standard_normal((3, c, 1, 1)),
              "b1": rng.standard_normal(3), "w2": rng.standard_normal((c, 3, 1, 1)), "w3": rng.standard_normal((c, c, 1, 1))}  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "wd"], ["d"], group=c, pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["d"], ["m"]),
        helper.make_node("Conv", ["m", "w1", "b1"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["s2"]),
        helper.make_node("Sigmoid", ["s2"], ["g"]),
        helper.make_node("Mul", ["d", "g"], ["e"]),
        helper.make_node("Conv", ["e", "w3"], ["k"]),
        helper.make_node("Relu", ["k"], ["y"]),
        helper.make_node("Mul", ["x", "k"], ["z"]),
    ]
    consts = {k: v.astype(np.float32) for k, v in consts.items()}
    outputs = [vi("y", ["n", c, 5, 4]), vi("k", ["n", c, 5, 4]), vi("z", ["n", c, 5, 4])]
    g = model(nodes, [vi("x", ["n", c, 5, 4])], outputs, consts)
    session = InferenceSession(to_onnx(g).SerializeToString())
    assert "ConvRegion" in session.graph.op_counts()
    for n in (2, 1, 2, 1):
        feeds = {"x": rng.standard_normal((n, c, 5, 4)).astype(np.float32)}
        given = feeds["x"].copy()
        for got, want in zip(session.run(None, feeds), run_graph(g, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(feeds["x"], given)
