"""The policy in graphs that inductor compiles: two custom graph passes, installed once inductor is loaded.

- A post-grad pass (`torch._inductor.config.post_grad_custom_pre_pass`) puts `xpuruntime::mm` / `bmm` /
  `addmm` in place of aten's matrix products in the forward and backward graphs, where the policy in force
  while compiling steers matmul (or linear) and the compile-time decision for the call site says so
  (`tracing.in_graph`: the policy's kernel can run it, or under autotune ours beat PyTorch's). Tracing never
  reaches the matrix products' backend-key overrides, so this is where the matmul policy enters a graph.
  Inductor then calls our op as an extern kernel and schedules its own kernels around it.
- A pre-grad pass (`pre_grad_custom_pass`) guards every frame inductor compiles on the routing
  (`router.guard_routing`), also frames whose trace met no routed op: a graph compiled without a policy
  recompiles once a policy steers its ops, instead of running PyTorch's kernels silently.

Both chain with a pass the user had set (`inductor_pass.ChainedPass`: importable by name, so inductor can
pickle its config into its FX graph cache's key), and their `uuid()` carries the routing, so inductor's
caches never serve a graph compiled under another routing. Importing torch._inductor costs seconds, so the
passes are put in place when inductor's config is first imported (a post-import hook) or already loaded, and
checked again at every policy change (a pass set over ours afterwards is chained again).

Under the `aot_eager` backend no inductor pass runs: the norm and attention routes still emit our ops while
tracing (and guard the frame); the graph's matrix products run aten's ops eagerly, which the backend-key
overrides route at run time. A frame compiled there while no policy steered anything has no guard (nothing
of ours ran while it was traced): `torch.compiler.reset()` after setting a policy recompiles it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any

import torch

from ..abi import TensorSpec
from ..policy import current_policy
from .router import guard_routing, routed_ops
from .tracing import in_graph

_CONFIG = "torch._inductor.config"
_lock = threading.Lock()


def _product_site(node: Any) -> tuple[str, Any, tuple, dict] | None:
    """(xpuruntime op, our custom op, its arguments, the call's attributes) for an aten product node, or None."""
    aten = torch.ops.aten
    target = node.target
    if target in (aten.mm.default, aten.bmm.default):
        ours = torch.ops.xpuruntime.mm.default if target is aten.mm.default else torch.ops.xpuruntime.bmm.default
        return "matmul", ours, tuple(node.args), {}
    if target is aten.addmm.default:
        beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
        return "addmm", torch.ops.xpuruntime.addmm.default, (*node.args[:3], float(beta), float(alpha)), {}
    return None


def _fake(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def _chosen(op: str, args: tuple) -> bool:
    """The compile-time decision for one product (see `tracing.in_graph`)."""
    steered = routed_ops(current_policy())
    if op == "matmul":
        return "matmul" in steered and in_graph("matmul", "matmul", tuple(_fake(a) for a in args), {})
    bias, a, b, beta, alpha = (_fake(x) for x in args)
    if not all(isinstance(t, torch.Tensor) for t in (bias, a, b)):
        return False
    if beta == 1 and alpha == 1 and bias.dim() == 1 and ("linear" in steered or "matmul" in steered):
        head = "matmul" if "matmul" in steered else "linear"
        weight = TensorSpec(tuple(b.shape)[::-1], str(b.dtype).removeprefix("torch."), tuple(b.stride())[::-1],
                            str(b.device)) if _static(b) else b.t()  # fmt: skip
        return in_graph("linear", head, (a, weight, bias), {"activation": None})
    return "matmul" in steered and in_graph("matmul", "matmul", (a, b), {})


def _static(t: torch.Tensor) -> bool:
    return not any(isinstance(n, torch.SymInt) for n in (*t.shape, *t.stride()))


def replace_products(graph: torch.fx.Graph) -> int:
    """Put our product ops in place of aten's where the policy in force steers them; returns how many."""
    steered = routed_ops(current_policy())
    if "matmul" not in steered and "linear" not in steered:
        return 0
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        site = _product_site(node)
        if site is None:
            continue
        op, ours, args, _ = site
        if _chosen(op, args):
            node.target, node.args, node.kwargs = ours, args, {}
            replaced += 1
    return replaced


def _guard_frame(graph: torch.fx.Graph) -> None:
    guard_routing()


def install_passes() -> None:
    """Put our passes in inductor's config (chained with those set there); no-op until inductor is loaded."""
    config = sys.modules.get(_CONFIG)
    if config is None:
        return
    from .inductor_pass import ChainedPass

    with _lock:
        for slot, ours, name in (
            ("post_grad_custom_pre_pass", replace_products, "products"),
            ("pre_grad_custom_pass", _guard_frame, "guard"),
        ):
            current = getattr(config, slot, None)
            if isinstance(current, ChainedPass):
                continue
            setattr(config, slot, ChainedPass(ours, name, current))
        if getattr(config, "pre_grad_pass_timing", "early") == "default":
            # pre-grad passes with a uuid would run after inductor's cache lookup ("late"), so a graph served
            # from the cache would get no routing guard: run them before it, as PyTorch did until 2.12
            config.pre_grad_pass_timing = "early"


class _AfterInductorConfig(importlib.abc.MetaPathFinder):
    """Runs `install_passes` right after torch._inductor.config is first imported (by torch.compile)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _CONFIG:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            install_passes()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def watch_inductor() -> None:
    """Install the passes now if inductor is loaded, else as soon as its config is imported."""
    finders = getattr(sys, "meta_path", None)
    if _CONFIG in sys.modules:
        install_passes()
    elif finders is not None and not any(isinstance(f, _AfterInductorConfig) for f in finders):
        finders.insert(0, _AfterInductorConfig())
