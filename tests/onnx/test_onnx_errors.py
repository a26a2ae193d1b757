"""Bad input gives a clear XpuRuntimeError subclass naming what is wrong, never a crash: malformed and
truncated files, cycles, dangling inputs, unsupported ops (all listed at once), missing or unknown inputs,
wrong dtype / rank / fixed dim, plus a fuzz test over 1,200 mutated models."""

from __future__ import annotations

import copy
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from xpuruntime.errors import DTypeError, ShapeError, XpuRuntimeError
from xpuruntime.onnx import (
    GraphError,
    InferenceSession,
    InputFeedError,
    ModelLoadError,
    SessionOptions,
    UnsupportedModelError,
)  # fmt: skip

F = TensorProto.FLOAT


def base_model() -> onnx.ModelProto:
    """A small graph with a matmul, elementwise chain, softmax, reshape and reduction."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("Softmax", ["t"], ["s"], axis=-1),
        helper.make_node("Shape", ["s"], ["shape"]),
        helper.make_node("Reshape", ["s", "shape"], ["r"]),
        helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=1),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    graph = helper.make_graph(
        nodes, "base", [helper.make_tensor_value_info("x", F, ["N", 6])], [helper.make_tensor_value_info("y", F, ["N", 1])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


FEED = {"x": np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)}


def test_base_model_runs() -> None:
    (y,) = InferenceSession(base_model().SerializeToString()).run(None, FEED)
    assert y.shape == (3, 1)


def test_truncated_and_garbage_bytes() -> None:
    data = base_model().SerializeToString()
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        InferenceSession(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="empty"):
        InferenceSession(b"")
    with pytest.raises(ModelLoadError, match="cannot read"):
        InferenceSession("/nonexistent/model.onnx")
    with pytest.raises(ModelLoadError, match="expected a path, bytes"):
        InferenceSession(12345)


def test_cycle_is_named() -> None:
    m = base_model()
    m.graph.node[1].input[0] = "t"  # Add reads Tanh's output, which reads Add's output
    with pytest.raises(GraphError, match="cycle"):
        InferenceSession(m)


def test_dangling_input_is_named() -> None:
    m = base_model()
    m.graph.node[2].input[0] = "nowhere"
    with pytest.raises(GraphError, match="'nowhere' is not produced by any node"):
        InferenceSession(m)


def test_every_unsupported_op_is_listed_at_load_time() -> None:
    m = base_model()
    m.graph.node[2].op_type = "FancyOp"
    m.graph.node[3].op_type = "ImageDecoder"
    m.graph.node[1].domain = "com.example"
    with pytest.raises(UnsupportedModelError) as info:
        InferenceSession(m)
    message = str(info.value)
    assert "FancyOp" in message and "ImageDecoder" in message and "com.example" in message


def test_feed_errors_name_the_input() -> None:
    session = InferenceSession(base_model())
    with pytest.raises(InputFeedError, match="missing input"):
        session.run(None, {})
    with pytest.raises(InputFeedError, match="unknown input"):
        session.run(None, {**FEED, "z": FEED["x"]})
    with pytest.raises(DTypeError, match="'x' expected dtype float32, got float64"):
        session.run(None, {"x": FEED["x"].astype(np.float64)})
    with pytest.raises(ShapeError, match="'x' expected rank 2"):
        session.run(None, {"x": FEED["x"][0]})
    with pytest.raises(ShapeError, match="'x' expected size 6 on dim 1"):
        session.run(None, {"x": np.zeros((3, 7), np.float32)})
    with pytest.raises(InputFeedError, match="unknown output"):
        session.run(["nope"], FEED)


def test_symbolic_dims_must_agree_between_inputs() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(n, F, ["N"]) for n in "ab"],
                          [helper.make_tensor_value_info("y", F, ["N"])])  # fmt: skip
    session = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(ShapeError, match="'N'"):
        session.run(None, {"a": np.ones(3, np.float32), "b": np.ones(4, np.float32)})


def test_run_time_failure_names_the_node() -> None:
    m = base_model()
    m.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.array([5], np.int64), "axes"))
    session = InferenceSession(m, SessionOptions(graph_optimization_level="disabled"))
    with pytest.raises(XpuRuntimeError, match="ReduceSum"):
        session.run(None, FEED)


# -- fuzzing ------------------------------------------------------------------------------------------
OPS = ["Add", "Relu", "MatMul", "Softmax", "Reshape", "Transpose", "Concat", "Gather", "Erf", "Nope", "Slice"]


def mutate(model: onnx.ModelProto, rnd: random.Random) -> bytes:
    """One random structural or byte-level mutation of `model`."""
    m = copy.deepcopy(model)
    g = m.graph
    kind = rnd.randrange(10)
    names = ["x", "w", "b", "m", "a", "t", "s", "shape", "r", "y", "axes", "", "zz"]
    node = g.node[rnd.randrange(len(g.node))] if len(g.node) else None
    if kind == 0 and node is not None:
        node.op_type = rnd.choice(OPS)
    elif kind == 1 and node is not None and len(node.input):
        node.input[rnd.randrange(len(node.input))] = rnd.choice(names)
    elif kind == 2 and node is not None:
        node.output[0] = rnd.choice(names)
    elif kind == 3 and len(g.node):
        del g.node[rnd.randrange(len(g.node))]
    elif kind == 4 and node is not None:
        node.attribute.append(
            helper.make_attribute(rnd.choice(["axis", "perm", "keepdims"]), rnd.choice([-3, 0, 1, 7]))
        )
    elif kind == 5:
        g.input[0].type.tensor_type.elem_type = rnd.choice([1, 6, 7, 9, 10, 11, 16, 8, 0])
    elif kind == 6:
        dim = g.input[0].type.tensor_type.shape.dim[rnd.randrange(2)]
        dim.dim_value = rnd.choice([0, 1, 6, 9])
    elif kind == 7 and len(g.initializer):
        init = g.initializer[rnd.randrange(len(g.initializer))]
        init.dims[:] = [rnd.choice([1, 2, 5, 6, 30])]
    elif kind == 8:
        m.opset_import[0].version = rnd.choice([0, 1, 11, 13, 17, 21, 99])
    data = bytearray(m.SerializeToString())
    if kind == 9 or rnd.random() < 0.2:
        for _ in range(rnd.randrange(1, 6)):
            op = rnd.randrange(3)
            pos = rnd.randrange(len(data))
            if op == 0:
                data[pos] = rnd.randrange(256)
            elif op == 1:
                del data[pos:]
            else:
                data[pos:pos] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 8)))
            if not data:
                break
    return bytes(data)


def test_fuzz_mutated_models_only_raise_xrt_errors() -> None:
    rnd = random.Random(1234)
    model = base_model()
    outcomes = {"ok": 0, "load": 0, "run": 0}
    levels = ["disabled", "basic", "extended", "all"]
    for i in range(1200):
        data = mutate(model, rnd)
        try:
            session = InferenceSession(data, SessionOptions(graph_optimization_level=levels[i % 4]))
        except XpuRuntimeError:
            outcomes["load"] += 1
            continue
        try:
            feed = {}
            for inp in session.get_inputs():
                shape = [d if isinstance(d, int) else 3 for d in inp.shape]
                dtype = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
                         "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16,
                         "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}.get(inp.type, np.float32)  # fmt: skip
                feed[inp.name] = np.random.default_rng(i).standard_normal(shape).astype(dtype)
            session.run(None, feed)
            outcomes["ok"] += 1
        except XpuRuntimeError:
            outcomes["run"] += 1
    assert sum(outcomes.values()) == 1200
    assert outcomes["ok"] > 50 and outcomes["load"] > 100, outcomes  # the mutations exercise every path


# -- structured fuzzing: shapes, dims, dtypes, op types and attributes, several at once -------------------------------
def vision_model() -> onnx.ModelProto:
    """A small conv / pool / gather / scatter graph: the ops real models added, for the structured fuzz."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gather", ["f", "idx"], ["h"], axis=1),
        helper.make_node("ScatterElements", ["h", "pos", "h"], ["y"], axis=1),
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "k"),
        numpy_helper.from_array(np.array([0, 3, 1], np.int64), "idx"),
        numpy_helper.from_array(np.array([[2, 0, 1]] * 2, np.int64), "pos"),
    ]
    graph = helper.make_graph(
        nodes, "vision", [helper.make_tensor_value_info("x", F, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, [2, 3])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _declared_dims(g: onnx.GraphProto) -> list:
    return [d for v in (*g.input, *g.output, *g.value_info) for d in v.type.tensor_type.shape.dim]


def structured_mutation(model: onnx.ModelProto, rnd: random.Random) -> onnx.ModelProto:
    """One to three changes to what the model declares or does (never its bytes): op types (any op, unknown
    ones, other domains), declared dims (0, negative, huge, symbolic), element types of values and
    initializers, initializer dims, attribute values, opsets."""
    from xpuruntime.onnx.ops import SUPPORTED

    m = copy.deepcopy(model)
    g = m.graph
    for _ in range(rnd.randrange(1, 4)):
        kind = rnd.randrange(7)
        node = g.node[rnd.randrange(len(g.node))]
        if kind == 0:
            node.op_type = rnd.choice([*sorted(SUPPORTED), "Nope", "", "Conv2d"])
            if rnd.random() < 0.1:
                node.domain = rnd.choice(["com.microsoft", "xrt", "ai.onnx.ml"])
        elif kind == 1:
            dims = _declared_dims(g)
            if dims:
                dim = rnd.choice(dims)
                choice = rnd.choice([0, 1, 2, 3, 7, -1, -5, 2**40, "sym"])
                if choice == "sym":
                    dim.dim_param = rnd.choice(["N", "batch", "x"])
                else:
                    dim.dim_value = choice
        elif kind == 2:
            value = rnd.choice([*g.input, *g.output])
            value.type.tensor_type.elem_type = rnd.choice([1, 2, 3, 5, 6, 7, 9, 10, 11, 12, 13, 16, 8, 0, 40])
        elif kind == 3 and len(g.initializer):
            init = g.initializer[rnd.randrange(len(g.initializer))]
            if rnd.random() < 0.5:
                init.data_type = rnd.choice([1, 6, 7, 10, 11, 16])
            else:
                init.dims[:] = [rnd.choice([0, 1, 2, 3, 4, 27, 2**31])] * rnd.randrange(1, 4)
        elif kind == 4:
            name = rnd.choice(["axis", "perm", "kernel_shape", "strides", "pads", "group", "keepdims", "axes"])
            value = rnd.choice([-9, -1, 0, 1, 2, 5, 2**40, [0], [1, 1], [-2, 3], [2**31, 1], 0.5, "x"])
            node.attribute.append(helper.make_attribute(name, value))
        elif kind == 5:
            node.input.append(rnd.choice(["x", "k", "idx", "", "zz"]))
        else:
            m.opset_import[0].version = rnd.choice([1, 6, 7, 9, 11, 13, 17, 18, 21, 23])
    return m


def _fuzz_feed(session: InferenceSession, seed: int) -> dict | None:
    feed = {}
    for inp in session.get_inputs():
        shape = [d if isinstance(d, int) else 3 for d in inp.shape]
        if any(d > 64 for d in shape):
            return None
        dtype = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(int64)": np.int64,
                 "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(float16)": np.float16,
                 "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}.get(inp.type, np.float32)  # fmt: skip
        feed[inp.name] = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return feed


@pytest.mark.parametrize("base", [base_model, vision_model])
def test_fuzz_structured_mutations_only_raise_xrt_errors(base) -> None:
    """Mutated shapes, dims, dtypes, op types and attributes: loading and running either works or raises an
    XpuRuntimeError (never a raw TypeError, IndexError, MemoryError, ...). Tensors are capped at 64 MiB."""
    rnd = random.Random(4321)
    model = base()
    outcomes = {"ok": 0, "load": 0, "run": 0}
    levels = ["disabled", "basic", "extended", "all"]
    for i in range(300):
        mutated = structured_mutation(model, rnd)
        options = SessionOptions(graph_optimization_level=levels[i % 4], max_tensor_bytes=64 << 20)
        try:
            session = InferenceSession(mutated, options)
        except XpuRuntimeError:
            outcomes["load"] += 1
            continue
        feed = _fuzz_feed(session, i)
        try:
            if feed is not None:
                session.run(None, feed)
            outcomes["ok"] += 1
        except XpuRuntimeError:
            outcomes["run"] += 1
    assert outcomes["ok"] > 20 and outcomes["load"] > 50 and outcomes["run"] > 5, outcomes
