"""xpuruntime.pytorch is layered (issue 25 item 5): each module imports only modules of lower layers, at load
time and inside functions alike, and keeps no mutable state of its own outside `state.STATE`."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "import_cycles", Path(__file__).parents[1] / "core" / "test_import_cycles.py"
)
_cycles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cycles)
PACKAGE_DIR, imported, module_name = _cycles.PACKAGE_DIR, _cycles.imported, _cycles.module_name  # the same AST reading

PYTORCH_DIR = PACKAGE_DIR / "pytorch"
PREFIX = "xpuruntime.pytorch."

# top to bottom: a module may import modules of its own layer's lower layers only (the layers of the
# package docstring; the public API modules share the top layer)
LAYERS = [
    {"__init__", "policy", "ops", "graphs", "autocast", "profiling", "allocator"}
    | {"patching", "patching.architectures", "patching.binding", "patching.forwards"},
    {"install"},
    {"compiled"},
    {"inductor_pass"},
    {"routes", "routes.attention", "routes.matmul", "routes.norm"},
    {"tracing"},
    {
        "custom_ops",
        "custom_ops.attention",
        "custom_ops.matmul",
        "custom_ops.norm",
        "custom_ops.glu",
        "custom_ops.rotary",
        "custom_ops.linear",
        "custom_ops.linear_cross_entropy",
        "custom_ops.add_norm",
    },
    {"custom_ops.eager", "custom_ops.inline"},
    {"custom_ops.replay"},
    {"custom_ops.common"},
    {"router"},
    {"tuner"},
    {"native"},
    {"families"},
    {"state"},
]
LAYER_OF = {name: depth for depth, layer in enumerate(LAYERS) for name in layer}
# a package's __init__ gathers its own modules: imports from the package to its members are not upward
SAME_PACKAGE = {("routes", "routes."), ("custom_ops", "custom_ops."), ("patching", "patching.")}


def front_end_modules() -> dict[str, Path]:
    paths = sorted(p for p in PYTORCH_DIR.rglob("*.py"))
    return {module_name(p).removeprefix("xpuruntime.pytorch").lstrip(".") or "__init__": p for p in paths}


def _internal_imports(path: Path) -> set[str]:
    found = set()
    for target in imported(path, deferred=True):
        if target.startswith(PREFIX):
            name = target.removeprefix(PREFIX)
            while name and name not in LAYER_OF:  # `from .x import name`: the module x
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def test_every_module_has_a_layer():
    assert set(front_end_modules()) == set(LAYER_OF)


def test_each_module_imports_only_lower_layers():
    upward = []
    for name, path in front_end_modules().items():
        for target in _internal_imports(path):
            if target == name or any(name == pkg and target.startswith(dot) for pkg, dot in SAME_PACKAGE):
                continue
            if LAYER_OF[target] <= LAYER_OF[name] and LAYER_OF[target] != 0:
                upward.append(f"{name} (layer {LAYER_OF[name]}) imports {target} (layer {LAYER_OF[target]})")
            elif LAYER_OF[name] != 0 and LAYER_OF[target] == 0:
                upward.append(f"{name} imports the public API module {target}")
    assert upward == []


def _module_level_stores(path: Path) -> list[str]:
    """Module-level names bound to a mutable container (dict, list, set, Counter, ...) or to `global` use."""
    tree = ast.parse(path.read_text())
    stores = []
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        mutable = isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp) or (
            isinstance(value, ast.Call) and getattr(value.func, "attr", getattr(value.func, "id", "")) in
            {"Counter", "defaultdict", "dict", "list", "set", "local", "WeakValueDictionary"}
        )  # fmt: skip
        if mutable:
            stores += [t.id for t in targets if isinstance(t, ast.Name)]
    stores += [n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names]
    return stores


# constant tables (never written after import): the only module-level containers outside `state`
CONSTANT_TABLES = {
    "families": {"FAMILIES", "FAMILY_OF"},
    "install": {"_DEVICE_KEYS", "_OWN_SOURCES"},
    "native": {"ROUTE_IDS"},
    "router": {"PYTORCH_OWN_KERNELS"},
    "tuner": {"ROUTING_COST_US"},
    "custom_ops.common": {"GRAD_ALIASES"},
    "routes": {"ROUTES", "__all__"},
    "routes.attention": {"ROUTES"},
    "routes.matmul": {"ROUTES", "_AUTOCAST_KEYS"},
    "routes.norm": {"ROUTES"},
    "autocast": {"_MATH_MODE"},
    "allocator": {"_COUNTERS"},
    "__init__": {"__all__"},
    "policy": {"__all__"},
    "custom_ops": {"__all__"},
    "patching": {"__all__"},
    "patching.architectures": {"GATE_ACTIVATIONS", "LLAMA_LIKE", "NOT_BY_DEFAULT", "REQUIRED"},
}


def test_no_mutable_state_outside_the_state_object():
    found = {}
    for name, path in front_end_modules().items():
        if name == "state":
            continue
        extra = set(_module_level_stores(path)) - CONSTANT_TABLES.get(name, set())
        if extra:
            found[name] = sorted(extra)
    assert found == {}
