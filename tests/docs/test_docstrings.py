"""Every public name has a docstring: the names each front end exports (`__all__` of xpuruntime, xpuruntime.ops,
xpuruntime.onnx, xpuruntime.pytorch, xpuruntime.bench) and the public methods and properties their classes
define. The API reference of the documentation site is built from these docstrings."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

# Methods of modules their owners were rewriting when this test was written (pytorch/): they get their
# docstrings with that rewrite. Nothing else may join this list.
PENDING: set[str] = set()  # public names allowed without a docstring for now: none
PACKAGES = ["xpuruntime", "xpuruntime.ops", "xpuruntime.onnx", "xpuruntime.pytorch", "xpuruntime.bench"]


def public_names(package: str) -> list[tuple[str, object]]:
    if package == "xpuruntime.pytorch":
        pytest.importorskip("torch")
    module = importlib.import_module(package)
    return [(f"{package}.{name}", getattr(module, name)) for name in module.__all__]


def _own_doc(obj: object) -> str:
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def undocumented(qualname: str, obj: object) -> list[str]:
    """`qualname` if it lacks a docstring, and every public method / property of a class that lacks one."""
    missing = [] if _own_doc(obj) else [qualname]
    if not isinstance(obj, type) or not obj.__module__.startswith("xpuruntime"):
        return missing
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    fields |= set(getattr(obj, "_fields", ()))  # NamedTuple fields
    for name, member in vars(obj).items():
        if name.startswith("_") or name in fields:  # a field's default callable is documented with the class
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member) and not _own_doc(member):
            missing.append(f"{qualname}.{name}")
    return missing


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_has_a_docstring(package):
    missing = [m for qualname, obj in public_names(package) if not inspect.ismodule(obj)
               for m in undocumented(qualname, obj) if ".".join(m.split(".")[-2:]) not in PENDING]  # fmt: skip
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"
