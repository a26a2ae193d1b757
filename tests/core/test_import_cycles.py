"""The core modules form layers: no import cycles between them (imports under `if TYPE_CHECKING:` aside),
each imports alone in a fresh interpreter, and none pulls in torch or triton. The graph IR and its passes
sit below the ONNX front end: nothing under graph/ imports onnx/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "src" / "xpuruntime"

# Deferred (function-level) imports that close a cycle, each with why it is deferred rather than gone.
# An import here runs only when the function runs, never while the modules load.
DEFERRED_ALLOWED = {
    ("xpuruntime.abi", "xpuruntime.arrays"),  # ArgPack.tensors() describes its arrays with arrays.describe
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Modules of the core packages that need PyTorch by design (imported only when a GPU session asks for them).
NEEDS_TORCH = {"xpuruntime.onnx.runners.gpu"}


def core_modules() -> dict[str, Path]:
    """The package's own modules and the runtime, graph and onnx packages: not ops, backends, other front
    ends or tools."""
    paths = [*PACKAGE_DIR.glob("*.py")]
    for package in ("runtime", "graph", "onnx"):
        paths += (PACKAGE_DIR / package).rglob("*.py")
    return {module_name(p): p for p in sorted(paths) if p.name != "__main__.py"}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(path: Path, deferred: bool) -> set[str]:
    """Modules (and `from m import name` targets, as m.name) imported by `path` at module level, or also
    inside functions with `deferred`; imports under `if TYPE_CHECKING:` do not count."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit_one(stmt)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not deferred:
            return
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        else:
            visit(node)

    visit(ast.parse(path.read_text()))
    return found


def import_graph(deferred: bool) -> dict[str, set[str]]:
    modules = core_modules()
    return {name: {t for t in imported(path, deferred) if t in modules and t != name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    result: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return result


def test_the_analysis_sees_imports():
    loading, deferred = import_graph(deferred=False), import_graph(deferred=True)
    assert "xpuruntime.errors" in loading["xpuruntime.registry"]
    assert "xpuruntime.registry" not in loading["xpuruntime.policy"]  # only under TYPE_CHECKING and in functions
    assert "xpuruntime.registry" in deferred["xpuruntime.policy"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_import_cycles_between_core_modules_when_they_load():
    assert cycles(import_graph(deferred=False)) == []


def test_no_import_cycles_through_deferred_imports_either():
    graph = import_graph(deferred=True)
    for source, target in DEFERRED_ALLOWED:
        graph[source].discard(target)
    assert cycles(graph) == []


def test_graph_passes_know_the_graph_ir_not_the_onnx_front_end():
    """graph/ (the IR and its passes) never imports onnx/, not even inside a function."""
    graph = import_graph(deferred=True)
    found = {
        source: sorted(t for t in targets if t.startswith("xpuruntime.onnx"))
        for source, targets in graph.items()
        if source.startswith("xpuruntime.graph")
    }
    assert any(source.startswith("xpuruntime.graph.passes.") for source in found)  # the analysis sees them
    assert {source: targets for source, targets in found.items() if targets} == {}


@pytest.mark.parametrize("module", sorted(set(core_modules()) - NEEDS_TORCH))
def test_core_module_imports_alone_without_torch_or_triton(module):
    code = (
        f"import sys, {module}; heavy = sorted({{'torch', 'triton'}} & set(sys.modules)); "
        "assert not heavy, f'pulled in {heavy}'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
