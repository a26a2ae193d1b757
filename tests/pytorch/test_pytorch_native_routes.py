"""Native (C++) matrix-product routes on CPU (test-only CPU routing): what they learn, when they forget,
and that every call still ends where the Python route would send it."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import warnings

import numpy as np
import pytest
import torch
from pytorch_cpu_routing import CALLS, fake_timings, policy, routed_registry, run_without_extension

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.errors import UnsupportedByPolicyError
from xpuruntime.pytorch import install
from xpuruntime.pytorch import native as native_routes
from xpuruntime.pytorch import tuner as handback
from xpuruntime.registry import Backend, kernel

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:torch"),
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler: the native routes cannot build"
    ),
]


def _pytorch_mm(args) -> None:
    """A CPU stand-in for the `torch` backend's matmul kernel: aten's own mm / bmm into the output."""
    CALLS["pytorch_own"] += 1
    a, b = (torch.from_numpy(np.asarray(x)) for x in args.inputs)
    (torch.mm if a.dim() == 2 else torch.bmm)(a, b, out=torch.from_numpy(args.out))


def _pytorch_linear(args) -> None:
    """A CPU stand-in for the `torch` backend's linear kernel with a bias: aten's own addmm."""
    CALLS["pytorch_linear"] += 1
    x, w, b = (torch.from_numpy(np.asarray(t)) for t in args.inputs)
    torch.addmm(b, x, w.t(), out=torch.from_numpy(args.out))


@pytest.fixture
def cpu_routing():
    for registry in routed_registry():
        registry.register_backend(
            Backend("torch", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype))
        )
        registry.register_kernel(kernel("matmul", "torch", backend="torch", dtypes={"float32"})(_pytorch_mm))
        registry.register_kernel(kernel("linear", "torch", backend="torch", dtypes={"float32"})(_pytorch_linear))
        assert native_routes.load() is not None, native_routes.status()
        yield registry


def _stats() -> dict[str, int]:
    return native_routes.stats()


def _calls(n: int, a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    return [torch.mm(a, b) for _ in range(n)]


def test_the_extension_builds_and_overrides_natively(cpu_routing):
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    dump = torch._C._dispatch_dump("aten::mm")
    assert any(line.startswith("CPU: registered at") and "native_routes.cpp" in line for line in dump.splitlines())
    assert _stats()["enabled"] == 1


def test_a_call_that_runs_pytorch_kernel_is_learned_then_skips_python(cpu_routing):
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    rng = np.random.default_rng(0)
    a, b = (torch.tensor(rng.standard_normal(s), dtype=torch.float32) for s in ((5, 7), (7, 3)))
    before = _stats()
    outs = _calls(5, a, b)
    after = _stats()
    assert CALLS["pytorch_own"] == 1  # the first call went through the dispatcher, the rest never entered Python
    assert after["learned"] == before["learned"] + 1
    assert after["native_calls"] - before["native_calls"] == 4
    expected = a.double().numpy() @ b.double().numpy()
    for out in outs:
        assert out.dtype == torch.float32 and out.shape == (5, 3)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(out, outs[0])
    # another signature (transposed operand: other strides) is a new decision
    _calls(2, a, b.t().contiguous().t())
    assert CALLS["pytorch_own"] == 2


def test_bmm_is_learned_too(cpu_routing):
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 2)
    outs = [torch.bmm(a, b) for _ in range(3)]
    assert CALLS["pytorch_own"] == 1
    expected = a.double().numpy() @ b.double().numpy()
    for out in outs:
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_a_call_routed_to_our_kernel_keeps_the_python_route(cpu_routing):
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    before = _stats()
    outs = _calls(4, a, b)
    assert CALLS["matmul"] == 4  # every call reached our kernel
    assert _stats()["native_calls"] == before["native_calls"]
    assert _stats()["learned"] == before["learned"] + 1  # learned once: 'Python route', no more learning
    for out in outs:
        np.testing.assert_allclose(out.numpy(), a.double().numpy() @ b.double().numpy(), rtol=1e-5, atol=1e-6)


def test_declined_calls_run_pytorch_natively(cpu_routing):
    """int64 is no dtype the op's kernels take: the Python route hands it back, the native one learns that."""
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    a, b = torch.arange(12).reshape(3, 4), torch.arange(8).reshape(4, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = _calls(3, a, b)
    assert CALLS["matmul"] == 0
    assert _stats()["native_calls"] >= 2
    for out in outs:
        assert np.array_equal(out.numpy(), a.numpy() @ b.numpy())


def test_a_strict_refusal_is_never_learned(cpu_routing):
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing, strict=True))
    a, b = torch.arange(12).reshape(3, 4), torch.arange(8).reshape(4, 2)
    for _ in range(3):
        with pytest.raises(UnsupportedByPolicyError):
            torch.mm(a, b)


def test_a_policy_change_forgets_what_was_learned(cpu_routing):
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    _calls(3, a, b)
    assert CALLS["pytorch_own"] == 1
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))  # the same ops: no rebuild, still a reset
    _calls(3, a, b)
    assert CALLS["matmul"] == 3 and CALLS["pytorch_own"] == 1


def test_a_scoped_policy_is_followed_on_its_thread_only(cpu_routing):
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    _calls(2, a, b)  # learned: PyTorch's kernel
    with xtorch.kernel_policy(policy("matmul", registry=cpu_routing)):
        _calls(3, a, b)
        assert CALLS["matmul"] == 3
        other = threading.Thread(target=_calls, args=(3, a, b))
        other.start()
        other.join()
        assert CALLS["matmul"] == 3  # the other thread follows the process policy, natively
    _calls(2, a, b)
    assert CALLS["matmul"] == 3 and CALLS["pytorch_own"] == 1


def test_dispatch_logging_sees_every_call(cpu_routing):
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    _calls(2, a, b)
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    try:
        assert _stats()["enabled"] == 0
        _calls(3, a, b)
        assert CALLS["pytorch_own"] == 4
        assert sum(1 for r in xrt.get_dispatch_logs() if r.op_name == "matmul" and r.selected_kernel == "torch") == 3
    finally:
        xrt.disable_dispatch_logging()
    assert _stats()["enabled"] == 1


def test_logging_switched_to_what_it_already_is_keeps_the_learned_decisions(cpu_routing):
    """Found in review: the example turned logging off before every step, and each time the native routes
    forgot everything they had learned."""
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    xrt.disable_dispatch_logging()
    _calls(2, a, b)
    learned, epoch = _stats()["learned"], _stats()["epoch"]
    xrt.disable_dispatch_logging()
    assert (_stats()["learned"], _stats()["epoch"]) == (learned, epoch) and learned > 0
    xrt.enable_dispatch_logging()
    try:
        xrt.enable_dispatch_logging()
        assert _stats()["epoch"] == epoch + 1  # one change: one reset
    finally:
        xrt.disable_dispatch_logging()
    assert _stats()["epoch"] == epoch + 2


def test_a_new_kernel_forgets_what_was_learned(cpu_routing):
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    _calls(2, a, b)
    epoch = _stats()["epoch"]

    def faster(args) -> None:
        CALLS["faster"] += 1
        args.out[...] = np.asarray(args.inputs[0]) @ np.asarray(args.inputs[1])

    cpu_routing.register_kernel(kernel("matmul", "faster", backend="torchcpu", dtypes={"float32"}, priority=99)(faster))
    assert _stats()["epoch"] > epoch and _stats()["learned"] == 0


def test_a_rebuild_never_lets_a_call_reach_aten_directly(cpu_routing):
    """Switching between policies that both route matmul rebuilds the overrides each time; a call racing
    the rebuild must still reach our kernel."""
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    first = policy("matmul", registry=cpu_routing)
    second = policy("matmul", "layer_norm", registry=cpu_routing)
    xtorch.set_kernel_policy(first)
    stop, made = threading.Event(), [0]

    def caller() -> None:
        while not stop.is_set():
            torch.mm(a, b)
            made[0] += 1

    worker = threading.Thread(target=caller)
    worker.start()
    try:
        for i in range(60):
            xtorch.set_kernel_policy(second if i % 2 == 0 else first)
    finally:
        stop.set()
        worker.join()
    assert made[0] > 0 and CALLS["matmul"] == made[0]


def test_without_the_extension_the_python_route_serves():
    code = (
        "import torch, xpuruntime.pytorch as xt\n"
        "from xpuruntime.pytorch import install, native as native_routes\n"
        "install.route_devices(('cpu',))\n"
        "xt.set_kernel_policy(matmul='numpy_blas')\n"
        "a = torch.randn(3, 4); b = torch.randn(4, 2)\n"
        "assert torch.allclose(torch.mm(a, b), (a.double() @ b.double()).float(), atol=1e-5)\n"
        "print(native_routes.status())\n"
    )
    assert "disabled by XPURUNTIME_NATIVE=0" in run_without_extension(code)


def test_overrides_are_removed_with_the_policy(cpu_routing):
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    xtorch.clear_kernel_policy()
    assert install.installed_overrides() == {}
    dump = torch._C._dispatch_dump("aten::mm")
    assert not any(line.startswith("CPU: registered at") and "xpuruntime" in line for line in dump.splitlines())
    assert _stats()["enabled"] == 0


def test_decisions_are_kept_per_scoped_policy(cpu_routing):
    """A scope's calls are learned under that scope's policy: inside a scope naming PyTorch's kernel they
    run natively after the first, while the process policy's calls keep reaching our kernel."""
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    pytorch_own = xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing)
    _calls(2, a, b)
    with xtorch.kernel_policy(pytorch_own):
        before = _stats()["native_calls"]
        _calls(4, a, b)
        assert CALLS["pytorch_own"] == 1 and _stats()["native_calls"] - before == 3
        with xtorch.kernel_policy(policy("matmul", registry=cpu_routing)):  # nested: its own decisions
            _calls(2, a, b)
            assert CALLS["matmul"] == 4
        _calls(2, a, b)
        assert CALLS["pytorch_own"] == 1 and CALLS["matmul"] == 4
    _calls(2, a, b)
    assert CALLS["matmul"] == 6


@pytest.mark.parametrize("scoped", [False, True])
def test_autotune_learns_a_signature_once_tuned_to_pytorch_kernel(cpu_routing, monkeypatch, scoped):
    """Ours gains less than the routing cost: the plan runs PyTorch's kernel, learned after the first call
    (under the process policy or a scoped one)."""
    fake_timings(monkeypatch).update(test_mm=5.0, torch=5.0 + handback.ROUTING_COST_US["matmul"] / 2)
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    expected = (a.double() @ b.double()).float()
    tuned = xrt.KernelPolicy({"matmul": "autotune"}, validate=cpu_routing)
    with contextlib.ExitStack() as stack:
        if scoped:
            xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
            stack.enter_context(xtorch.kernel_policy(tuned))
        else:
            xtorch.set_kernel_policy(tuned)
        before = _stats()
        outs = _calls(4, a, b)
        after = _stats()
    assert CALLS["pytorch_own"] == 1 and CALLS["matmul"] == 0
    assert after["native_calls"] - before["native_calls"] == 3 and after["learned"] == before["learned"] + 1
    for out in outs:
        torch.testing.assert_close(out, expected)


def test_autotune_keeps_the_python_route_where_ours_pays_for_it(cpu_routing, monkeypatch):
    fake_timings(monkeypatch).update(test_mm=5.0, torch=5.0 + 3 * handback.ROUTING_COST_US["matmul"])
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=cpu_routing))
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    before = _stats()
    _calls(4, a, b)
    assert CALLS["matmul"] == 4 and CALLS["pytorch_own"] == 0
    assert _stats()["native_calls"] == before["native_calls"]


def test_linear_with_bias_through_pytorch_linear_kernel_is_learned(cpu_routing):
    """matmul=torch names linear's `torch` kernel too (its family): nn.Linear's addmm is aten's own addmm,
    learned on the first call; a scaled addmm (beta, alpha) keeps its own decisions."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    x = torch.randn(4, 6)
    expected = x.double().numpy() @ lin.weight.double().detach().numpy().T + lin.bias.double().detach().numpy()
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    with torch.no_grad():
        outs = [lin(x) for _ in range(3)]
    assert CALLS["pytorch_linear"] == 1
    for out in outs:
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
    scaled = torch.addmm(lin.bias.detach(), x, lin.weight.detach().t(), beta=0.5, alpha=2.0)
    np.testing.assert_allclose(
        scaled.numpy(),
        2.0 * (expected - lin.bias.detach().numpy()) + 0.5 * lin.bias.detach().numpy(),
        rtol=1e-5,
        atol=1e-5,
    )


def test_autotune_hands_back_a_matmul_family_that_the_native_routes_serve(cpu_routing, monkeypatch):
    """Every signature tuned to PyTorch's kernel runs from C++ once learned; those calls count toward the
    quiet rule, so the family is handed back and its overrides removed (no per-call cost is left)."""
    fake_timings(monkeypatch).update(test_mm=5.0, torch=5.0 + handback.ROUTING_COST_US["matmul"] / 2)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=cpu_routing))
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(5, 7), torch.randn(7, 6, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    for _ in range(40):
        ((x @ w1) @ w2).square().sum().backward()
        if "matmul" in xtorch.handed_back():
            break
    assert _stats()["native_calls"] > 0
    assert "matmul" in xtorch.handed_back() and "matmul" not in xtorch.installed_overrides()
    native = _stats()["native_calls"]
    ((x @ w1) @ w2).square().sum().backward()
    assert _stats()["native_calls"] == native  # PyTorch's own dispatch now: no override left


def test_native_call_reports_come_in_batches_and_a_failing_listener_never_breaks_a_call(cpu_routing):
    a, b = torch.randn(4, 6), torch.randn(6, 5)
    expected = (a.double() @ b.double()).float()
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}, validate=cpu_routing))
    heard, unraisable = [], []

    def listener(calls):
        heard.append(calls)
        raise RuntimeError("listener failed")

    with pytest.raises(TypeError, match="callable or None"):
        native_routes.report_native_calls(3, 4)
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        native_routes.report_native_calls(listener, 4)
        _calls(1, a, b)  # learned: the rest are native
        outs = _calls(12, a, b)
    finally:
        native_routes.report_native_calls(None)
        sys.unraisablehook = old_hook
    assert heard and set(heard) == {4} and len(heard) == len(unraisable)
    assert all("listener failed" in str(u.exc_value) for u in unraisable)
    for out in outs:
        torch.testing.assert_close(out, expected)
    _calls(8, a, b)
    assert len(heard) == len(unraisable)  # stopped
