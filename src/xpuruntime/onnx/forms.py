"""Load-time checks and rewrites of node forms, at every opset (after legacy.upgrade): attribute values the
session declines raise UnsupportedModelError naming the node, the attribute and what is supported, and an
inference Dropout whose mask nobody reads becomes an Identity (which the graph passes then remove)."""

from __future__ import annotations

import numpy as np

from ..graph.ir import Graph, Node
from .errors import UnsupportedModelError
from .opmap import PAD_MODES
from .resize import resize_spec


def check_forms(graph: Graph, overridable: set[str]) -> None:
    """Check (and, for Dropout, simplify) the graph's nodes in place; `overridable` initializers are not
    fixed by the model (a feed may replace them)."""
    for node in graph.nodes:
        if node.domain:
            continue
        if node.op in ("Resize", "Upsample"):
            resize_spec(node, graph.opset)
        elif node.op == "Dropout":
            _dropout(graph, node, overridable)
        elif node.op == "Pad":
            _pad(graph, node)


def _pad(graph: Graph, node: Node) -> None:
    modes = PAD_MODES if graph.opset >= 19 else PAD_MODES[:3]  # wrap: Pad-19
    mode = node.attrs.get("mode", "constant")
    if mode not in modes:
        raise UnsupportedModelError(
            f"{node.describe()}: attribute mode={mode!r} is not supported at opset {graph.opset}; "
            f"supported: {', '.join(modes)}"
        )


def _ratio_and_training(graph: Graph, node: Node, overridable: set[str]) -> tuple[float | None, bool | None]:
    """A Dropout's ratio and training flag where the model fixes them (None: fed, overridable or computed
    at run time)."""
    if graph.opset < 12:  # ratio is an attribute; before opset 7, is_test=0 (the default) means training
        return float(node.attrs.get("ratio", 0.5)), graph.opset < 7 and not node.attrs.get("is_test", 0)
    ratio, training = 0.5, False
    if len(node.inputs) > 1 and node.inputs[1]:
        value = None if node.inputs[1] in overridable else graph.constant(node.inputs[1])
        ratio = None if value is None else float(np.asarray(value).reshape(-1)[0])
    if len(node.inputs) > 2 and node.inputs[2]:
        value = None if node.inputs[2] in overridable else graph.constant(node.inputs[2])
        training = None if value is None else bool(np.asarray(value).reshape(-1)[0])
    return ratio, training


def _dropout(graph: Graph, node: Node, overridable: set[str]) -> None:
    """Dropout in inference is the identity (its mask all True); a training-mode Dropout that drops
    anything is random and declined."""
    ratio, training = _ratio_and_training(graph, node, overridable)
    if training and ratio != 0:
        flag = "is_test=0" if graph.opset < 7 else "training_mode=True"
        raise UnsupportedModelError(
            f"{node.describe()}: {flag} makes Dropout drop values at random (training); the session runs "
            "inference only: supported are training_mode False or absent (is_test=1 before opset 7), or ratio 0"
        )
    if training is not None and not any(node.outputs[1:]):
        node.op, node.inputs, node.outputs, node.attrs = "Identity", node.inputs[:1], node.outputs[:1], {}
