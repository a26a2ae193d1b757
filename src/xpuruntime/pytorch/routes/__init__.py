"""The aten overrides, one file per op family: ROUTES maps each xpuruntime op to the (aten op, dispatch level,
override function) triples that route it; `install` registers those the policies in force need."""

from . import attention, matmul, norm

ROUTES: dict[str, tuple] = {}
for _module in (matmul, attention, norm):
    for _op, _routes in _module.ROUTES.items():
        ROUTES[_op] = ROUTES.get(_op, ()) + _routes

__all__ = ["ROUTES"]
