"""The core's policy store, re-exported: the same store, precedence and sources as `xpuruntime`.

Setting, clearing or entering a scoped policy here also installs or removes the aten overrides the
new policy needs, so an op the policy does not name costs nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from .. import policy as _core
from ..policy import KernelPolicy, get_kernel_policy
from .overrides import refresh_overrides, scope_entered, scope_exited
from .routing import routed_ops

__all__ = ["KernelPolicy", "clear_kernel_policy", "get_kernel_policy", "kernel_policy", "set_kernel_policy"]


def set_kernel_policy(policy: KernelPolicy | str | Mapping | None = None, **prefs: Any) -> None:
    """Set the process-wide policy (the core's) and install the overrides it needs."""
    _core.set_kernel_policy(policy, **prefs)
    refresh_overrides()


def clear_kernel_policy() -> None:
    """Drop the process-wide policy and the overrides only it needed."""
    _core.clear_kernel_policy()
    refresh_overrides()


@contextlib.contextmanager
def kernel_policy(policy: KernelPolicy | str | Mapping | None = None, **prefs: Any) -> Iterator[KernelPolicy]:
    """The core's scoped policy (this thread / task), with the overrides it needs while it is active."""
    with _core.kernel_policy(policy, **prefs) as scoped:
        ops = routed_ops(scoped)
        scope_entered(ops)
        try:
            yield scoped
        finally:
            scope_exited(ops)
