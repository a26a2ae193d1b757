"""The kernel registry: declarations validated at registration (every bad field named), backends loaded by
package, and change listeners that neither leak nor go deaf."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import registry
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    RegistrationError,
)  # fmt: skip
from xpuruntime.registry import Backend, KernelSpec, Registry, kernel


def noop(args) -> None:
    """A launch that does nothing."""


@pytest.mark.parametrize(
    ("hints", "field"),
    [
        ({"conditions": lambda ctx: None}, "conditions"),
        ({"conditions": (None,)}, "conditions"),
        ({"priority": "high"}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": float("nan")}, "priority"),
        ({"dtypes": "float32"}, "dtypes"),
        ({"dtypes": 32}, "dtypes"),
        ({"dtypes": (np.float32,)}, "dtypes"),
        ({"fused": "yes"}, "fused"),
        ({"deterministic": None}, "deterministic"),
        ({"min_compute_capability": 8}, "min_compute_capability"),
        ({"min_compute_capability": (8, "0")}, "min_compute_capability"),
        ({"launch_config": 3}, "launch_config"),
        ({"workspace_bytes": 1024}, "workspace_bytes"),
        ({"doc": 5}, "doc"),
    ],
)
def test_bad_kernel_hint_is_refused_naming_the_field(hints, field):
    registry = make_toy_registry()
    with pytest.raises(RegistrationError, match=f"field '{field}'"):
        registry.register_kernel(kernel("toy", "k", backend="cpu", **hints)(noop))
    assert registry.kernels_for("toy") == []


@pytest.mark.parametrize("name", ["", "auto", "autotune", "AUTO", "a,b", "a=b", "a/b", " k", 42, None])
def test_bad_or_reserved_kernel_name_is_refused(name):
    with pytest.raises(RegistrationError, match="field 'name'"):
        kernel("toy", name, backend="cpu")(noop)


def test_non_callable_launch_is_refused():
    with pytest.raises(RegistrationError, match="field 'launch'"):
        kernel("toy", "k", backend="cpu")(42)
    with pytest.raises(RegistrationError, match="field 'launch'"):
        xrt.register_kernel("matmul", "my_kernel", backend="cpu")("not a function")
    assert "my_kernel" not in xrt.default_registry().kernels["matmul"]


def test_register_kernel_refuses_what_is_not_a_kernel_spec():
    with pytest.raises(RegistrationError, match="expected a KernelSpec"):
        make_toy_registry().register_kernel(noop)


def test_kernel_spec_made_directly_is_validated_too():
    with pytest.raises(RegistrationError, match="field 'dtypes'"):
        KernelSpec("toy", "k", "cpu", noop, dtypes="float32")


def test_a_list_of_conditions_and_a_list_of_dtypes_are_taken_as_a_tuple_and_a_set():
    spec = kernel("toy", "k", backend="cpu", conditions=[lambda ctx: None], dtypes=["float32"])(noop)
    assert isinstance(spec.conditions, tuple) and spec.dtypes == frozenset({"float32"})


def test_kernel_dtypes_that_cannot_be_iterated_give_a_registration_error():
    class Hostile:
        def __iter__(self):
            raise ValueError("hostile object")

    with pytest.raises(
        xrt.RegistrationError,
        match=r"kernel 'attention'/'k': field 'dtypes' expected a collection of dtype names, got Hostile",
    ):
        xrt.kernel("attention", "k", backend="cpu", dtypes=Hostile())
    with pytest.raises(xrt.RegistrationError, match="'dtypes'"):
        xrt.kernel("attention", "k", backend="cpu", dtypes=[["float32"]])  # unhashable items


def test_declaring_a_kernel_whose_op_name_cannot_be_printed_still_names_the_problem():
    """Found by the API fuzz on the H100: an op whose str() raises, with an unknown hint."""

    class Unprintable:
        def __str__(self) -> str:
            raise TypeError("no str")

    with pytest.raises(RegistrationError, match="unknown hint 'dtypess'"):
        xrt.kernel(Unprintable(), "k", backend="cpu", dtypess={"float32"})


def test_unknown_kernel_hints_are_caught_at_the_decorator():
    with pytest.raises(
        xrt.RegistrationError, match=r"unknown hint 'prio' for kernel 'matmul/x'. Did you mean 'priority'"
    ):
        xrt.register_kernel("matmul", "x", backend="cpu", prio=3)


def test_loading_a_backend_that_looks_at_the_registry_does_not_deadlock(tmp_path, monkeypatch):
    (tmp_path / "selfish_backend").mkdir()
    (tmp_path / "selfish_backend" / "__init__.py").write_text(
        "import numpy as np\n"
        "from xpuruntime.registry import Backend, default_registry\n"
        "assert 'matmul' in default_registry().ops  # re-entrant: sees the registry loaded so far\n"
        "BACKEND = Backend('selfish', 'cpu', empty=lambda s, d, dev, stream: np.empty(s, d))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    load_builtins = registry.Registry.load_builtins

    def load_builtins_and_selfish(self):
        load_builtins(self)
        self.load_backend("selfish_backend")

    monkeypatch.setattr(registry.Registry, "load_builtins", load_builtins_and_selfish)
    monkeypatch.setattr(registry, "_default", None)
    monkeypatch.setattr(registry, "_default_ready", False)
    loaded = []
    worker = threading.Thread(target=lambda: loaded.append(registry.default_registry()), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert loaded, "default_registry() deadlocked while a backend module used it"
    assert "selfish" in loaded[0].backends


def test_dropped_dispatchers_do_not_stay_registered():
    reg = make_toy_registry({"name": "a"})
    for _ in range(50):
        Dispatcher(reg)
    gc.collect()
    reg.register_kernel(kernel("toy", "b", backend="cpu")(lambda a: None))
    assert len(reg._listeners) == 0


def test_dropped_dispatchers_leave_no_listener_references_even_without_registry_changes():
    registry = make_toy_registry({"name": "a"})
    for _ in range(2_000):
        xrt.Dispatcher(registry)
    gc.collect()
    xrt.Dispatcher(registry)  # registering a listener prunes the dead ones
    assert len(registry._listeners) <= 2


def test_listeners_still_hear_changes():
    registry = Registry()
    registry.register_backend(Backend("cpu", "cpu", empty=lambda *a: None))
    heard = []
    registry.on_change(heard.append)
    registry.register_op(make_toy_registry().ops["toy"])
    registry.register_kernel(kernel("toy", "k", backend="cpu")(noop))
    assert heard == ["toy"]


def test_a_kernels_description_is_its_docstrings_whole_first_paragraph():
    def launch(args) -> None:
        """Mean, then variance of the centered values, computed in `out`
        when it has the compute dtype. In-place safe.

        Details that `xpuruntime kernels` leaves out."""

    spec = kernel("toy", "k", backend="cpu")(launch)
    assert (
        spec.doc
        == "Mean, then variance of the centered values, computed in `out` when it has the compute dtype. In-place safe."
    )
    assert kernel("toy", "k", backend="cpu", doc="Given.")(launch).doc == "Given."


def test_every_registered_kernel_is_described_in_whole_sentences():
    cut = [f"{k.qualified_name}: {k.doc!r}" for op in xrt.default_registry().ops
           for k in xrt.default_registry().kernels_for(op) if not k.doc.rstrip().endswith((".", ")", "!", "?"))]  # fmt: skip
    assert not cut, cut
