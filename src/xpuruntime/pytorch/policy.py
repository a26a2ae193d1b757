"""The core's policy store, used as is: the same store, precedence, sources and functions as `xpuruntime`.

A listener on the core's policy changes installs or removes the aten overrides each new policy needs,
so `xrt.set_kernel_policy(...)` and `xpuruntime.pytorch.set_kernel_policy(...)` are the same call and an
op no policy names costs nothing.
"""

from __future__ import annotations

import warnings

from .. import policy as _core
from ..errors import PolicyError, UnknownNameError
from ..policy import KernelPolicy, clear_kernel_policy, get_kernel_policy, kernel_policy, set_kernel_policy
from . import compiled, native
from .install import refresh_overrides, scope_entered, scope_exited

__all__ = ["KernelPolicy", "clear_kernel_policy", "get_kernel_policy", "kernel_policy", "set_kernel_policy"]


class _OverrideInstaller:
    """Keeps the installed overrides equal to what the process policy and the active scopes route."""

    def process_policy_changed(self) -> None:
        try:
            refresh_overrides()
        except (
            PolicyError,
            UnknownNameError,
        ) as exc:  # a malformed environment policy: every xrt call raises it already
            warnings.warn(f"aten overrides left as they were: {exc}", RuntimeWarning, stacklevel=3)
        native.reset()  # decisions learned under the old policy no longer hold
        compiled.watch_inductor()  # a graph pass set over ours since is chained again

    def scope_entered(self, policy: KernelPolicy) -> None:
        scope_entered(policy)

    def scope_exited(self, policy: KernelPolicy) -> None:
        scope_exited(policy)


_core.add_policy_listener(_OverrideInstaller())
