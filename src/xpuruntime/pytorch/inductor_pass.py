"""`ChainedPass`: the object that `compiled` puts in inductor's config, running our graph pass and then the
pass that was set there before (if any).

A module of its own for two reasons. It subclasses inductor's `CustomGraphPass`, and importing inductor
costs seconds: `compiled` imports this module only once inductor is loaded. And it must be importable by
name: inductor pickles its config into the key of its FX graph cache (PyTorch 2.11 pickles the pre-grad
pass itself, later versions ignore it), and pickle stores a class by its module and name. A class made
inside a function cannot be pickled, so every compile bypassed the cache.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from .router import routing_token

VERSION = "xpuruntime-graph-pass-1"  # part of the uuid: a change in what the passes do invalidates caches


class ChainedPass(CustomGraphPass):
    """`ours`, then `chained` (the pass set before, or None); the uuid names both and the routing in force.

    Picklable as long as `ours` and `chained` are (module-level functions are, by name)."""

    def __init__(self, ours: Callable[[torch.fx.Graph], Any], name: str, chained: Any) -> None:
        self.ours, self.name, self.chained = ours, name, chained

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.ours(graph)
        if self.chained is not None:
            self.chained(graph)

    def uuid(self) -> Any:
        chained = None if self.chained is None else getattr(self.chained, "uuid", lambda: None)()
        return (VERSION, traced_kernels_digest(), self.name, routing_token(), chained)


@functools.cache
def traced_kernels_digest() -> str:
    """A hash of the source files of the kernels that graphs may trace (`KernelSpec.traceable`): part of every
    cache key inductor and AOTAutograd compute under our passes, so no cache serves a graph traced from an
    older kernel (the keys see the custom op, not the kernel that was traced into its place)."""
    from .. import files
    from ..registry import default_registry

    sources = set()
    for kernels in default_registry().kernels.values():
        sources.update(inspect.getsourcefile(k.launch) or "" for k in kernels.values() if k.traceable)
    digest = hashlib.sha256()
    for name in sorted(f for f in sources if f):
        digest.update(files.read_bytes(name, "kernel source"))
    return digest.hexdigest()[:16]
