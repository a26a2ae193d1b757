"""Forwards bound on module instances, and copies of Hugging Face's functions with one piece replaced.

Patching never touches a class or a module's globals: a swap puts a bound method in one module instance's
`__dict__` (where it shadows the class's `forward`), and undoing it restores exactly what that `__dict__` held.
Other instances of the same class, in this model or another, keep running the class's code.

Where the fused path reuses Hugging Face's own forward with one global function replaced (the attention's
`apply_rotary_pos_emb`) or with its innermost function replaced behind its decorators (a language model's
forward, behind `can_return_tuple` and `deprecate_kwarg`), `with_inner` copies the function and every wrapper
around it (`__wrapped__`), each copy with its own globals or closure cell, the originals untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import UnsupportedModelError

_MISSING = object()


@dataclasses.dataclass
class Swap:
    """One module's forward replaced (or kept, with `note` saying why): the plan's unit, shown by dry runs."""

    path: str  # the module's name in the model ("" for the model itself)
    module: Any
    kind: str  # what the swap fuses: "rms_norm", "swiglu", "rotary_embedding", "linear_cross_entropy", ...
    ops: tuple[str, ...]  # the xpuruntime ops its forward calls
    forward: Callable[..., Any] | None  # the function bound as the module's forward; None: kept as it is
    note: str  # what it replaces, or why it is kept
    warning: str = ""  # for a module kept because this transformers version's code differs: what patch warns
    before: Any = _MISSING  # the instance's own `forward` entry before the swap (_MISSING: none)

    @property
    def kept(self) -> bool:
        return self.forward is None

    def left_out(self, why: str | None = None) -> Swap:
        """This swap kept, because the caller did not ask for its kind (`why`: a default's reason)."""
        return dataclasses.replace(
            self, forward=None, ops=(), note=f"kept: {why or f'kind {self.kind!r} not asked for'}"
        )

    def apply(self) -> None:
        if self.forward is None:
            return
        self.before = self.module.__dict__.get("forward", _MISSING)
        object.__setattr__(self.module, "forward", types.MethodType(self.forward, self.module))

    def undo(self) -> None:
        if self.forward is None:
            return
        current = self.module.__dict__.get("forward")
        if getattr(current, "__func__", None) is not self.forward:
            raise UnsupportedModelError(
                f"unpatch: the forward of '{self.path or type(self.module).__name__}' was replaced again after "
                "patch(); undo that change first (xpuruntime restores only its own swaps)"
            )
        if self.before is _MISSING:
            del self.module.__dict__["forward"]
        else:
            object.__setattr__(self.module, "forward", self.before)


def with_inner(func: Callable[..., Any], replace: Callable[[types.FunctionType], Callable[..., Any]]) -> Any:
    """A copy of `func` whose innermost function (followed through `__wrapped__`) is `replace(innermost)`; each
    wrapper is copied with the closure cell that held the function it wraps pointing at the new one. None when a
    wrapper keeps the function it wraps elsewhere than in a closure cell (it cannot be copied this way)."""
    inner = getattr(func, "__wrapped__", None)
    if inner is None:
        return replace(func)
    new_inner = with_inner(inner, replace)
    cells = func.__closure__ or ()
    if new_inner is None or not any(_holds(cell, inner) for cell in cells):
        return None
    closure = tuple(types.CellType(new_inner) if _holds(cell, inner) else cell for cell in cells)
    return _copy(func, func.__globals__, closure, wrapped=new_inner)


def with_globals(func: types.FunctionType, replacements: Mapping[str, Any]) -> types.FunctionType:
    """A copy of `func` that sees `replacements` instead of its module's globals of those names (its own snapshot
    of the module's globals: the module itself is untouched). The snapshot has no `__name__`: torch.compile
    reaches a function's globals through the module of that name, which would be the original's."""
    snapshot = {**func.__globals__, **replacements}
    snapshot.pop("__name__", None)
    return _copy(func, snapshot, func.__closure__)


def _holds(cell: types.CellType, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _copy(func: Any, globals_: dict, closure: tuple | None, wrapped: Any = None) -> types.FunctionType:
    copy = types.FunctionType(func.__code__, globals_, func.__name__, func.__defaults__, closure)
    copy.__kwdefaults__ = func.__kwdefaults__
    functools.update_wrapper(copy, func, updated=())
    copy.__dict__.update(func.__dict__)
    if wrapped is not None:
        copy.__wrapped__ = wrapped
    else:
        copy.__dict__.pop("__wrapped__", None)
    return copy
