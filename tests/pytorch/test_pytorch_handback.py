"""Autotune handing an op family back to PyTorch when routing cannot pay for its host cost (CPU routing)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from pytorch_cpu_routing import CALLS, fake_timings, routed_registry

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import router
from xpuruntime.pytorch import tuner as handback
from xpuruntime.registry import Backend, kernel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


def _torch_mm(args):
    """Stands in for the `torch` backend's matmul (PyTorch's own kernel)."""
    CALLS["torch_mm"] += 1
    a, b = (torch.from_numpy(np.asarray(t)) for t in args.inputs)
    torch.from_numpy(args.out).copy_(torch.matmul(a.double(), b.double()))


@pytest.fixture
def registry():
    for registry in routed_registry():
        registry.register_backend(
            Backend("torch", "cpu", empty=lambda shape, dtype, device, stream: np.full(shape, np.nan, dtype))
        )
        registry.register_kernel(kernel("matmul", "torch_mm", backend="torch", dtypes={"float32"})(_torch_mm))
        registry.register_kernel(kernel("layer_norm", "torch_ln", backend="torch", dtypes={"float32"})(_torch_ln))
        yield registry


def _torch_ln(args):
    """Stands in for the `torch` backend's layer_norm."""
    CALLS["torch_ln"] += 1
    x, w, b = (None if t is None else torch.from_numpy(np.asarray(t)).double() for t in args.inputs)
    dims = list(args.attrs["normalized_shape"])
    torch.from_numpy(args.out).copy_(torch.nn.functional.layer_norm(x, dims, w, b, args.attrs["eps"]))


@pytest.fixture
def timed(monkeypatch):
    return fake_timings(monkeypatch)


def _train(steps: int) -> list[torch.Tensor]:
    """A few steps of a two-matmul chain; returns the last gradients."""
    torch.manual_seed(0)
    x = torch.randn(5, 7)
    w1 = torch.randn(7, 6, requires_grad=True)
    w2 = torch.randn(6, 3, requires_grad=True)
    for _ in range(steps):
        w1.grad = w2.grad = None
        ((x @ w1) @ w2).square().sum().backward()
    return [w1.grad, w2.grad]


def _routed_calls() -> int:
    return CALLS["matmul"] + CALLS["torch_mm"]


def test_family_handed_back_when_pytorch_wins_within_the_routing_cost(registry, timed):
    timed.update(test_mm=5.0, torch_mm=5.0 + handback.ROUTING_COST_US["matmul"] / 2)
    expected = _train(1)  # no policy: PyTorch's kernels
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    assert "matmul" in xtorch.installed_overrides()
    grads = _train(12)
    assert "matmul" in xtorch.handed_back() and "routing cost" in xtorch.handed_back()["matmul"]
    assert "matmul" not in xtorch.installed_overrides() and "linear" not in xtorch.installed_overrides()
    before = _routed_calls()
    assert before > 0  # the first steps were routed (and tuned)
    grads = _train(3)
    assert _routed_calls() == before  # handed back: PyTorch runs every product now
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_forward_under_autocast_shares_the_verdicts_of_the_backward(registry, timed):
    """autocast scopes a policy with another math mode in the forward only: one hand-back covers both."""
    timed.update(test_mm=5.0, torch_mm=5.0)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    x, w = torch.randn(5, 7), torch.randn(7, 3, requires_grad=True)
    for _ in range(handback.QUIET_CALLS):  # two products per step
        with xrt.kernel_policy(math_mode="tf32"):
            y = x @ w
        y.sum().backward()
    assert "matmul" in xtorch.handed_back()
    before = _routed_calls()
    with xrt.kernel_policy(math_mode="tf32"):
        y = x @ w
    y.sum().backward()
    assert _routed_calls() == before


def test_family_keeps_routing_when_ours_beats_pytorch_by_more_than_the_cost(registry, timed):
    timed.update(test_mm=5.0, torch_mm=5.0 + 3 * handback.ROUTING_COST_US["matmul"])
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    _train(12)
    calls = CALLS["matmul"]
    _train(2)
    assert xtorch.handed_back() == {} and "matmul" in xtorch.installed_overrides()
    assert CALLS["matmul"] == calls + 10  # 2 forward and 3 backward products per step, all ours


def test_a_signature_gaining_less_than_the_routing_cost_runs_pytorch_kernel(registry, timed):
    """Before any hand-back, each tuned signature whose gain is under the routing cost runs PyTorch's."""
    timed.update(test_mm=5.0, torch_mm=5.0 + handback.ROUTING_COST_US["matmul"] / 2)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    with torch.no_grad():
        out = torch.mm(a, b)
    assert CALLS["torch_mm"] == 1 and CALLS["matmul"] == 0
    torch.testing.assert_close(out, (a.double() @ b.double()).float())


@pytest.mark.parametrize("routed_first", [True, False])
def test_direct_and_routed_calls_keep_their_own_plans(registry, timed, routed_first):
    """The routing cost is charged to the calls the overrides route, not to direct dispatcher calls, in
    whichever order the two come (they share the dispatcher's plan cache, not its plans)."""
    timed.update(test_mm=5.0, torch_mm=5.0 + handback.ROUTING_COST_US["matmul"] / 2)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    want = a.double().numpy() @ b.double().numpy()
    calls = [lambda: torch.mm(a, b).numpy(), lambda: router.get_dispatcher().run("matmul", (a.numpy(), b.numpy()))]
    with torch.no_grad():
        for call in calls if routed_first else calls[::-1]:
            np.testing.assert_allclose(call(), want, rtol=1e-5)
    assert CALLS["torch_mm"] == 1 and CALLS["matmul"] == 1  # routed: PyTorch's; direct: the fastest, ours
    assert len(handback.verdicts()["matmul"]) == 1


def test_an_op_without_a_pytorch_candidate_does_not_keep_its_family_routed(registry, timed):
    """layer_norm_backward has only our kernel: layer_norm's verdict decides for the family."""
    timed.update(test_ln=5.0, torch_ln=5.0)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"layer_norm": "autotune"}, validate=registry))
    x = torch.randn(6, 10, requires_grad=True)
    for _ in range(handback.QUIET_CALLS):
        torch.nn.functional.layer_norm(x, (10,)).square().sum().backward()
    assert CALLS["layer_norm_backward"] > 0
    assert "layer_norm" in xtorch.handed_back() and "no PyTorch kernel" in xtorch.handed_back()["layer_norm"]
    assert "layer_norm" not in xtorch.installed_overrides()
    calls = CALLS["layer_norm"] + CALLS["torch_ln"] + CALLS["layer_norm_backward"]
    x.grad = None
    torch.nn.functional.layer_norm(x, (10,)).square().sum().backward()
    assert CALLS["layer_norm"] + CALLS["torch_ln"] + CALLS["layer_norm_backward"] == calls
    expected = torch.autograd.grad(torch.nn.functional.layer_norm(x, (10,)).square().sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize("in_graph", [False, True])
def test_signatures_tuned_for_a_cuda_graph_charge_no_routing_cost(registry, timed, in_graph):
    """A graph's warm-up (CUDAGraphWrapper.capture) tunes for replays, which cost no host time: a gain under
    the routing cost keeps our kernel and the family routed; the same gain in eager hands it back."""
    timed.update(test_mm=5.0, torch_mm=5.0 + handback.ROUTING_COST_US["matmul"] / 2)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    with handback.for_graph() if in_graph else contextlib.nullcontext():
        _train(12)
    found = handback.verdicts()["matmul"]
    assert {route for route, _ in found} == {in_graph}
    assert all(("CUDA graph" in why) is in_graph for _, why in found)
    assert ("matmul" in xtorch.handed_back()) is not in_graph
    assert (CALLS["torch_mm"] == 0) is in_graph and (CALLS["matmul"] > 0) is in_graph
    _train(1)  # outside the warm-up the tuned plans stay as they are
    assert ("matmul" in xtorch.installed_overrides()) is in_graph


def test_a_gain_within_the_timing_noise_runs_pytorch_kernel_in_a_graph_too(registry, timed):
    timed.update(test_mm=100.0, torch_mm=100.0 + 100 * handback.TIMING_NOISE / 2)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    with handback.for_graph():
        _train(12)
    assert "matmul" in xtorch.handed_back() and CALLS["matmul"] == 0


def test_explicit_kernel_names_are_never_handed_back(registry, timed):
    timed.update(test_mm=5.0, torch_mm=1.0)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "test_mm"}, validate=registry))
    _train(12)
    assert xtorch.handed_back() == {} and "matmul" in xtorch.installed_overrides()


def test_no_hand_back_outside_a_backward_pass(registry, timed):
    """Overrides are only removed at the end of a backward (never while one is running)."""
    timed.update(test_mm=5.0, torch_mm=5.0)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "autotune"}, validate=registry))
    a, b = torch.randn(4, 6), torch.randn(6, 3)
    with torch.no_grad():
        for _ in range(4 * handback.QUIET_CALLS):
            torch.mm(a, b)
    assert xtorch.handed_back() == {} and "matmul" in xtorch.installed_overrides()


def test_a_new_policy_routes_again_and_reset_forgets(registry, timed):
    timed.update(test_mm=5.0, torch_mm=5.0)
    tuned = xrt.KernelPolicy({"matmul": "autotune"}, validate=registry)
    xtorch.set_kernel_policy(tuned)
    _train(12)
    assert "matmul" not in xtorch.installed_overrides()
    xtorch.set_kernel_policy(xrt.KernelPolicy(autotune=True, validate=registry))  # another fingerprint
    assert "matmul" in xtorch.installed_overrides()
    xtorch.set_kernel_policy(tuned)
    assert "matmul" not in xtorch.installed_overrides()
    handback.reset()
    assert xtorch.handed_back() == {} and "matmul" in xtorch.installed_overrides()


@pytest.mark.parametrize(
    ("times", "backends", "route"),
    [
        ({"ours": 10.0, "pt": 100.0}, {"ours": "triton", "pt": "torch"}, True),
        ({"ours": 10.0, "pt": 25.0}, {"ours": "triton", "pt": "torch"}, False),
        ({"ours": 30.0, "pt": 25.0}, {"ours": "triton", "pt": "torch"}, False),
        ({"pt": 25.0}, {"pt": "torch"}, False),
        ({"ours": 10.0}, {"ours": "triton"}, None),
        ({"a": 50.0, "b": 10.0, "pt": 40.0, "pt2": 45.0}, {"a": "x", "b": "y", "pt": "torch", "pt2": "torch"}, True),
    ],
)
def test_verdict_charges_the_routing_cost(times, backends, route):
    got, why = handback.verdict("matmul", times, backends, 20.0)
    assert got is route and why.startswith("matmul: ")
