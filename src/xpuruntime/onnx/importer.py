"""ONNX model (path, bytes or ModelProto) -> graph IR, with every load-time check in one place.

A model that cannot be parsed, or that no valid ONNX model can be (names that are not UTF-8, negative
dims, an IR version or opset newer than any ONNX defines, names given twice, an overridable initializer
whose declared type or shape is not its own), raises ModelLoadError; one using ops, domains, opsets or
dtypes the session cannot run raises UnsupportedModelError listing all of them at once; a broken graph
(cycle, dangling input, value defined twice) raises GraphError naming the node.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import files
from ..errors import FileError
from ..graph.ir import Dim, Graph, GraphError, Node, Value
from .dtypes import SUPPORTED_DTYPES, dtype_name
from .errors import ModelLoadError, UnsupportedModelError
from .ops import OPS, SUPPORTED, LoadContext

MIN_OPSET = 1
DEFAULT_DOMAINS = ("", "ai.onnx")


def load_model(source: Any) -> onnx.ModelProto:
    """Parse a path, bytes or ModelProto; ModelLoadError for anything that is not a readable model."""
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, bytes | bytearray | memoryview):
        data, what = bytes(source), "model bytes"
    elif isinstance(source, str | os.PathLike):
        try:  # through the checked opener: a FIFO, a folder or a device is refused unread, not waited on
            data = files.read_bytes(source, "ONNX model file")
        except FileError as exc:
            raise ModelLoadError(str(exc)) from None
        except OSError as exc:
            raise ModelLoadError(f"cannot read ONNX model file '{source}': {exc.strerror or exc}") from None
        what = f"ONNX model file '{source}'"
    else:
        raise ModelLoadError(f"expected a path, bytes or onnx.ModelProto, got {type(source).__name__}")
    if not data:
        raise ModelLoadError(f"{what} is empty")
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelLoadError(f"{what} is not a valid ONNX model (truncated or corrupt?): {exc}") from None
    if not model.HasField("graph"):
        raise ModelLoadError(f"{what} has no graph (not an ONNX model?)")
    return model


def value_of(info: onnx.ValueInfoProto) -> Value:
    t = info.type
    if t.WhichOneof("value") is None:  # no type given (subgraphs' outputs often have none): unknown
        return Value(info.name)
    if not t.HasField("tensor_type"):
        return Value(info.name, f"non-tensor ({t.WhichOneof('value')})", None)
    tensor = t.tensor_type
    dtype = dtype_name(tensor.elem_type) if tensor.elem_type else None
    shape: tuple[Dim, ...] | None = None
    if tensor.HasField("shape"):
        dims: list[Dim] = []
        for d in tensor.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return Value(info.name, dtype, shape)


def _attribute(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
    return value


def _constant_value(node: Node) -> np.ndarray:
    """The array a Constant node defines."""
    attrs = node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):  # fmt: skip
        if key in attrs:
            return np.asarray(attrs[key], dtype)
    raise UnsupportedModelError(f"{node.describe()}: Constant with attributes {sorted(attrs)} is not supported")


def _tensor(init: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    if any(d < 0 for d in init.dims):
        raise ModelLoadError(f"initializer '{init.name}' has negative dims {list(init.dims)}")
    try:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            if base_dir is None:
                raise ModelLoadError(f"initializer '{init.name}' uses external data; load the model from its path")
            onnx.external_data_helper.load_external_data_for_tensor(init, base_dir)
        array = numpy_helper.to_array(init)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"initializer '{init.name}' cannot be read: {exc}") from None
    if array.dtype.name not in SUPPORTED_DTYPES:
        raise UnsupportedModelError(f"initializer '{init.name}' has dtype {array.dtype.name}, which is not supported")
    return array


def cast_target(to: Any) -> str:
    """A Cast's `to` as a dtype name: an ONNX element type, or (Cast-1 to Cast-5) its name, such as 'FLOAT'."""
    if isinstance(to, str):
        try:
            return dtype_name(onnx.TensorProto.DataType.Value(to.upper()))
        except ValueError:
            return to  # not a type name: reported as unsupported, as it is written
    return dtype_name(int(to or 0))


def overridable_initializers(model: onnx.ModelProto, graph: Graph) -> list[Value]:
    """The initializers a feed may replace, with their declared types, in graph-input order: from IR version
    4, those also listed among the graph's inputs (as in onnxruntime; before, initializers are constants)."""
    if model.ir_version < 4:
        return []
    names = {init.name for init in model.graph.initializer}  # not a Constant node's output
    found: list[Value] = []
    for info in model.graph.input:
        array = graph.initializers.get(info.name)
        if array is None or info.name not in names or any(v.name == info.name for v in found):
            continue
        declared = value_of(info)
        if declared.dtype is not None and declared.dtype != array.dtype.name:
            raise ModelLoadError(
                f"graph input '{info.name}' is declared {declared.dtype}, but its initializer holds {array.dtype.name}"
            )
        if declared.shape is not None and not _fits(declared.shape, array.shape):
            raise ModelLoadError(
                f"graph input '{info.name}' is declared with shape {list(declared.shape)}, but its initializer has "
                f"shape {list(array.shape)}"
            )
        found.append(Value(info.name, declared.dtype or array.dtype.name, declared.shape))
    return found


def _fits(declared: tuple, shape: tuple[int, ...]) -> bool:
    return len(declared) == len(shape) and all(not isinstance(d, int) or d == n for d, n in zip(declared, shape))


def check_well_formed(model: onnx.ModelProto) -> None:
    """What no valid ONNX model has, refused with a ModelLoadError naming it: an IR version or a default-domain
    opset newer than this onnx package defines, names that are not UTF-8, negative declared dims, graph
    inputs or initializers named twice."""
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(f"IR version {model.ir_version} is newer than any ONNX defines (up to {onnx.IR_VERSION})")
    newest = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS and entry.version > newest:
            raise ModelLoadError(f"opset {entry.version} is newer than any ONNX defines (up to {newest})")
    g = model.graph
    for index, proto in enumerate(g.node):
        fields = [proto.op_type, proto.domain, proto.name, *proto.input, *proto.output]
        if not all(isinstance(f, str) for f in fields):
            raise ModelLoadError(f"node {index}: its op type, domain, name or a value name is not valid UTF-8")
    for what, infos in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for info in infos:
            if not isinstance(info.name, str):
                raise ModelLoadError(f"a graph {what}'s name is not valid UTF-8")
            dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
            if any(d.HasField("dim_value") and d.dim_value < 0 for d in dims):
                raise ModelLoadError(f"graph {what} '{info.name}' declares negative dims")
    for what, names in (("initializer", [i.name for i in g.initializer]), ("graph input", [i.name for i in g.input])):
        if not all(isinstance(n, str) for n in names):
            raise ModelLoadError(f"an {what}'s name is not valid UTF-8")
        twice = sorted(n for n, count in collections.Counter(names).items() if count > 1)
        if twice:
            raise ModelLoadError(f"{what}(s) {twice} are given more than once")


def opset_of(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedModelError("the model imports no default-domain opset ('' / 'ai.onnx')")
    return max(versions)


def import_model(model: onnx.ModelProto, base_dir: str | None = None) -> Graph:
    """Build the graph IR of `model`; raises the load-time errors described in the module docstring."""
    check_well_formed(model)
    opset = opset_of(model)
    if opset < MIN_OPSET:
        raise UnsupportedModelError(f"opset {opset} is too old; the session supports opset {MIN_OPSET} and newer")
    return _import_graph(model.graph, opset, model, base_dir, subgraph=False)


def _import_graph(g: onnx.GraphProto, opset: int, model: onnx.ModelProto, base_dir: str | None,
                  subgraph: bool) -> Graph:  # fmt: skip
    """The graph IR of the model's graph or of a subgraph (a control-flow node's attribute, imported with its
    node): every node checked, old forms rewritten, and for a subgraph the outer values it reads."""
    initializers = {init.name: _tensor(init, base_dir) for init in g.initializer}
    inputs = [value_of(v) for v in g.input if v.name not in initializers]
    outputs = [value_of(v) for v in g.output]
    if not outputs:
        raise ModelLoadError(f"subgraph '{g.name}' has no outputs" if subgraph else "the model's graph has no outputs")
    values = {v.name: value_of(v) for v in g.value_info}
    nodes = [_node(proto, index, opset, model, base_dir) for index, proto in enumerate(g.node)]
    _check_supported(nodes, inputs, outputs)
    for node in nodes:
        _check_arity(node, opset)
        node.inputs += node.implicit_inputs()  # after the arity check: the schema counts the declared ones
    graph = Graph([], inputs, outputs, initializers, values, opset, g.name or "graph")
    for node in nodes:
        if node.op == "Constant" and not node.domain:
            if len(node.outputs) != 1 or node.outputs[0] in graph.initializers:
                raise ModelLoadError(f"{node.describe()}: a Constant must define exactly one new value")
            graph.initializers[node.outputs[0]] = _checked_constant(node)
        else:
            graph.nodes.append(node)
    if subgraph:
        graph.outer = _outer_names(graph)
    _rewrite_and_check(graph, model, subgraph)
    graph.verify()
    return graph


def _node(proto: onnx.NodeProto, index: int, opset: int, model: onnx.ModelProto, base_dir: str | None) -> Node:
    """One node of the IR; its subgraph attributes imported as graphs."""
    attrs: dict[str, Any] = {}
    for attr in proto.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            attrs[attr.name] = _import_graph(attr.g, opset, model, base_dir, subgraph=True)
            continue
        if attr.type == onnx.AttributeProto.GRAPHS:
            attrs[attr.name] = [_import_graph(sub, opset, model, base_dir, subgraph=True) for sub in attr.graphs]
            continue
        try:
            attrs[attr.name] = _attribute(attr)
        except Exception as exc:
            raise ModelLoadError(
                f"node {index} ('{proto.name}', {proto.op_type}): unreadable attribute: {exc}"
            ) from None
    name = proto.name or f"{proto.op_type}_{index}"
    domain = "" if proto.domain in DEFAULT_DOMAINS else proto.domain
    node = Node(proto.op_type, list(proto.input), list(proto.output), attrs, name, domain)
    if not node.outputs:
        raise ModelLoadError(f"{node.describe()} has no outputs")
    return node


def _outer_names(graph: Graph) -> tuple[str, ...]:
    """The values a subgraph reads (its nodes, nested subgraphs included, and its outputs) but does not define:
    those of the graphs around it, in order of first use."""
    defined = set(graph.initializers) | {v.name for v in graph.inputs}
    defined |= {out for node in graph.nodes for out in node.outputs if out}
    read = [name for node in graph.nodes for name in node.inputs] + [v.name for v in graph.outputs]
    return tuple(dict.fromkeys(name for name in read if name and name not in defined))


def _rewrite_and_check(graph: Graph, model: onnx.ModelProto, subgraph: bool = False) -> None:
    """Old-opset forms rewritten (each op record's `upgrade`: attributes that later versions made inputs
    become constant inputs, defaults that changed are written out, legacy broadcasting becomes NumPy's),
    then attribute values the session declines refused (each record's `check`)."""
    overridable = set() if subgraph else {value.name for value in overridable_initializers(model, graph)}
    ctx = LoadContext(graph, model, overridable)
    for node in list(graph.nodes):
        upgrade = OPS[node.op].upgrade if not node.domain else None
        if upgrade is not None:
            upgrade(node, ctx)
    for node in list(graph.nodes):
        check = OPS[node.op].check if not node.domain else None
        if check is not None:
            check(node, ctx)


def _check_arity(node: Node, opset: int) -> None:
    """Input/output counts and required attributes as the ONNX schema of the node's op declares them."""
    try:
        schema = onnx.defs.get_schema(node.op, opset, "")
    except Exception:
        raise UnsupportedModelError(f"{node.describe()}: op {node.op} does not exist in opset {opset}") from None
    n_in, n_out = len(node.inputs), len(node.outputs)
    if not schema.min_input <= n_in <= schema.max_input:
        raise GraphError(f"{node.describe()}: expects {schema.min_input}..{schema.max_input} inputs, got {n_in}")
    if not schema.min_output <= n_out <= schema.max_output:
        raise GraphError(f"{node.describe()}: expects {schema.min_output}..{schema.max_output} outputs, got {n_out}")
    for name, attr in schema.attributes.items():
        if attr.required and name not in node.attrs:
            raise GraphError(f"{node.describe()}: required attribute '{name}' is missing")
    unknown = sorted(set(node.attrs) - set(schema.attributes))
    if unknown:
        raise GraphError(f"{node.describe()}: unknown attribute(s) {unknown}")


def _checked_constant(node: Node) -> np.ndarray:
    array = _constant_value(node)
    if array.dtype.name not in SUPPORTED_DTYPES:
        raise UnsupportedModelError(f"{node.describe()}: constant dtype {array.dtype.name} is not supported")
    return array


def _check_supported(nodes: list[Node], inputs: list[Value], outputs: list[Value]) -> None:
    """Collect every unsupported op, domain and dtype, then raise once listing them all."""
    problems: dict[str, list[str]] = {}
    for node in nodes:
        if node.domain:
            problems.setdefault(f"{node.domain}.{node.op} (domain '{node.domain}')", []).append(node.name)
        elif node.op not in SUPPORTED:
            problems.setdefault(node.op, []).append(node.name)
        elif node.op == "Cast" and cast_target(node.attrs.get("to")) not in SUPPORTED_DTYPES:
            problems.setdefault(f"Cast to {cast_target(node.attrs.get('to'))}", []).append(node.name)
        else:
            for key, value in node.attrs.items():
                if isinstance(value, np.ndarray) and value.dtype.name not in SUPPORTED_DTYPES:
                    problems.setdefault(f"{node.op} attribute '{key}' of dtype {value.dtype.name}", []).append(
                        node.name
                    )
    for v in (*inputs, *outputs):
        if v.dtype is not None and v.dtype not in SUPPORTED_DTYPES:
            problems.setdefault(f"value '{v.name}' of dtype {v.dtype}", []).append("graph input/output")
    if problems:
        listing = "; ".join(f"{what} (nodes: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for what, names in sorted(problems.items()))  # fmt: skip
        raise UnsupportedModelError(f"the session cannot run this model: unsupported {listing}")
    for node in nodes:
        if node.op == "Cast":
            node.attrs["to"] = cast_target(node.attrs["to"])
