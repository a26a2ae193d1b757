"""Fused ops' kernels traced into compiled graphs (custom_ops.inline): with static shapes the kernel the policy
chooses is decided while AOTAutograd traces the graph and its launch is traced into it (PyTorch operations here,
Triton launches on a GPU), forward and backward; the op stays one opaque node where the kernel cannot be traced,
with symbolic shapes, and for torch.export. Results and gradients match eager PyTorch either way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from pytorch_cpu_routing import CALLS, routed_registry
from torch._dynamo.testing import AotEagerAndRecordGraphs

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.registry import kernel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")


def _tensors(args) -> tuple:
    """Inputs and output as tensors: NumPy views when the dispatcher runs the kernel on CPU tensors, the
    tracer's tensors when it is traced into a graph."""
    return (*(torch.as_tensor(a) for a in args.inputs), torch.as_tensor(args.out))


def _swiglu(args):
    CALLS["swiglu"] += 1
    gate, up, out = _tensors(args)
    out.copy_(F.silu(gate) * up)


def _swiglu_backward(args):
    CALLS["swiglu_backward"] += 1
    dy, gate, up, out = _tensors(args)
    s = torch.sigmoid(gate)
    out.copy_(torch.stack([dy * up * s * (1 + gate * (1 - s)), dy * F.silu(gate)]))


@pytest.fixture(params=[True, False], ids=["traceable", "opaque"])
def swiglu_kernels(request):
    """The CPU routing registry with a swiglu kernel pair made of PyTorch operations, declared traceable or not."""
    for registry in routed_registry():
        hints = dict(backend="torchcpu", traceable=request.param)
        registry.register_kernel(kernel("swiglu", "test_swiglu", **hints)(_swiglu))
        registry.register_kernel(kernel("swiglu_backward", "test_swiglu", **hints)(_swiglu_backward))
        policy = xrt.KernelPolicy({"swiglu": "test_swiglu", "swiglu_backward": "test_swiglu"}, validate=registry)
        with xrt.kernel_policy(policy):
            yield request.param


def _loss(gate, up):
    return (xtorch.ops.swiglu(gate, up).sin() * 1.5).sum()


@contextlib.contextmanager
def _dispatch_log() -> Iterator[list]:
    """The dispatch records made inside the block: the log cleared and on, off after."""
    records: list = []
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    try:
        yield records
    finally:
        records.extend(xrt.get_dispatch_logs())
        xrt.disable_dispatch_logging()


def _calls(graph) -> list[str]:
    return [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]


def _targets(graph) -> set[str]:
    return set(_calls(graph))


def _inputs(*shape):
    torch._dynamo.reset()  # a frame compiled again for new shapes gets symbolic ones (which keep the op opaque)
    torch.manual_seed(0)
    return [torch.randn(*shape, dtype=torch.float64, requires_grad=True) for _ in range(2)]


def test_a_traceable_kernel_is_traced_into_the_forward_and_backward_graphs(swiglu_kernels):
    CALLS.clear()
    gate, up = _inputs(6, 10)
    backend = AotEagerAndRecordGraphs()
    with _dispatch_log() as log:
        loss = torch.compile(_loss, backend=backend, fullgraph=True)(gate, up)
        calls_while_compiling = dict(CALLS)
        loss.backward()
    grads = [gate.grad, up.grad]
    gate.grad = up.grad = None
    expected = (F.silu(gate) * up).sin().mul(1.5).sum()
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, (gate.grad, up.grad)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    forward, backward = _targets(backend.fw_graphs[0]), _targets(backend.bw_graphs[0])
    records = {(r.op_name, r.selected_kernel, r.origin) for r in log}
    if swiglu_kernels:  # the kernel's operations are in the graphs; it ran while they were traced, never after
        assert "xpuruntime.swiglu.default" not in forward and "aten.silu.default" in forward
        assert "xpuruntime.swiglu_backward.default" not in backward and "aten.sigmoid.default" in backward
        assert set(calls_while_compiling) == {"swiglu", "swiglu_backward"}  # both traced with the joint graph
        assert dict(CALLS) == calls_while_compiling  # and never called again: the graphs run their operations
        assert {("swiglu", "test_swiglu", "compile"), ("swiglu_backward", "test_swiglu", "compile")} <= records
        decided = [e for e in xtorch.compiled_decisions() if e.ctx.op == "swiglu"]
        assert decided and decided[-1].decision.kernel.name == "test_swiglu"
    else:  # one opaque node each, dispatched when the graph runs
        assert "xpuruntime.swiglu.default" in forward
        assert "xpuruntime.swiglu_backward.default" in backward
        assert ("swiglu", "test_swiglu", "graph") in records


def test_symbolic_shapes_keep_the_op_opaque(swiglu_kernels):
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(_loss, backend=backend, dynamic=True)
    for rows in (5, 7):
        gate, up = _inputs(rows, 4)
        torch.testing.assert_close(compiled(gate, up), (F.silu(gate) * up).sin().mul(1.5).sum())
    assert "xpuruntime.swiglu.default" in _targets(backend.fw_graphs[-1])


def test_export_keeps_the_op(swiglu_kernels):
    class Block(torch.nn.Module):
        def forward(self, gate, up):
            return xtorch.ops.swiglu(gate, up)

    gate, up = (t.detach() for t in _inputs(3, 8))
    exported = torch.export.export(Block(), (gate, up))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "xpuruntime.swiglu.default" in targets
    torch.testing.assert_close(exported.module()(gate, up), F.silu(gate) * up)


def test_a_backward_fallback_that_differentiates_a_formula_stays_opaque():
    """No kernel of ours for add_rms_norm's backward on the CPU routing registry: its body would differentiate
    PyTorch's formula with autograd, which is not traced into a graph; results still match."""
    for _ in routed_registry():
        torch.manual_seed(0)
        x, residual = (torch.randn(4, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
        weight = torch.randn(16, dtype=torch.float64, requires_grad=True)

        def loss(x, residual, weight):
            y, h = xtorch.ops.add_rms_norm(x, residual, weight, 1e-6)
            return (y * h).sum()

        backend = AotEagerAndRecordGraphs()
        got = torch.compile(loss, backend=backend, fullgraph=True)(x, residual, weight)
        grads = torch.autograd.grad(got, (x, residual, weight))
        expected = loss(x, residual, weight)
        for g, e in zip(grads, torch.autograd.grad(expected, (x, residual, weight))):
            torch.testing.assert_close(g, e)


def test_an_op_the_policy_does_not_name_is_left_to_inductor():
    """No kernel named for swiglu (only its backward's): the forward graph gets PyTorch's formula for inductor to
    fuse (logged as kernel "inductor"), the backward the named kernel's operations."""
    for registry in routed_registry():
        hints = dict(backend="torchcpu", traceable=True)
        registry.register_kernel(kernel("swiglu", "test_swiglu", **hints)(_swiglu))
        registry.register_kernel(kernel("swiglu_backward", "test_swiglu", **hints)(_swiglu_backward))
        policy = xrt.KernelPolicy({"swiglu_backward": "test_swiglu"}, validate=registry)
        gate, up = _inputs(5, 6)
        backend = AotEagerAndRecordGraphs()
        with _dispatch_log() as log, xrt.kernel_policy(policy):
            loss = torch.compile(_loss, backend=backend, fullgraph=True)(gate, up)
            grads = torch.autograd.grad(loss, (gate, up))
        expected = torch.autograd.grad((F.silu(gate) * up).sin().mul(1.5).sum(), (gate, up))
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        records = {(r.op_name, r.selected_kernel, r.origin) for r in log}
        assert {("swiglu", "inductor", "compile"), ("swiglu_backward", "test_swiglu", "compile")} <= records
        assert "xpuruntime.swiglu.default" not in _targets(backend.fw_graphs[0])
        assert "aten.silu.default" in _targets(backend.fw_graphs[0])


def test_a_kernel_that_fails_to_trace_leaves_the_op_opaque_with_a_warning():
    """A kernel declared traceable that reads tensor data on the host (here `.numpy()`, which the tracer's tensors
    refuse): the compilation still succeeds, with one KernelFallbackWarning; the op runs as one node."""

    def host_reading_swiglu(args):
        gate, up, out = _tensors(args)
        gate.numpy()  # a host read: fine at run time on CPU tensors, impossible while tracing
        out.copy_(F.silu(gate) * up)

    for registry in routed_registry():
        registry.register_kernel(
            kernel("swiglu", "test_swiglu", backend="torchcpu", traceable=True)(host_reading_swiglu)
        )
        policy = xrt.KernelPolicy({"swiglu": "test_swiglu"}, validate=registry)
        gate, up = _inputs(4, 6)
        backend = AotEagerAndRecordGraphs()
        with xrt.kernel_policy(policy), pytest.warns(xrt.KernelFallbackWarning, match="could not be traced"):
            got = torch.compile(_loss, backend=backend, fullgraph=True)(gate, up)
        torch.testing.assert_close(got, (F.silu(gate) * up).sin().mul(1.5).sum())
        assert "xpuruntime.swiglu.default" in _targets(backend.fw_graphs[0])


def test_a_named_kernel_that_cannot_run_the_call_warns_and_leaves_it_to_inductor():
    """The policy names a float32-only kernel for a float64 call that another kernel could take: one
    KernelFallbackWarning saying why, PyTorch's formula traced into the graph (logged as kernel "inductor", reason
    "fallback"), results unchanged."""
    for registry in routed_registry():
        hints = dict(backend="torchcpu", traceable=True)
        registry.register_kernel(kernel("swiglu", "test_swiglu", dtypes={"float32"}, **hints)(_swiglu))
        registry.register_kernel(kernel("swiglu", "other_swiglu", **hints)(_swiglu))
        policy = xrt.KernelPolicy({"swiglu": "test_swiglu"}, validate=registry)
        gate, up = _inputs(3, 5)
        backend = AotEagerAndRecordGraphs()
        warns = pytest.warns(xrt.KernelFallbackWarning, match="'test_swiglu' cannot run")
        with _dispatch_log() as log, xrt.kernel_policy(policy), warns:
            got = torch.compile(_loss, backend=backend, fullgraph=True)(gate, up)
        torch.testing.assert_close(got, (F.silu(gate) * up).sin().mul(1.5).sum())
        assert ("swiglu", "inductor", "fallback") in {(r.op_name, r.selected_kernel, r.reason) for r in log}
        assert "aten.silu.default" in _targets(backend.fw_graphs[0])


def _linear_inputs():
    torch._dynamo.reset()
    torch.manual_seed(0)
    return [torch.randn(*shape, requires_grad=True) for shape in ((5, 8), (6, 8), (6,))]


def test_linear_is_left_to_inductor_where_the_policy_names_no_kernel():
    """xpuruntime::linear (a patched GPT-2 MLP's c_fc + GELU, a BERT intermediate): with no kernel named for it,
    the compiled forward and backward hold PyTorch's GEMMs and GELU for inductor, not the op (run opaque, its
    Python dispatch made a compiled GPT-2 step host-bound); a pinned kernel that cannot be traced keeps it one
    node."""
    from xpuruntime.pytorch.custom_ops.linear import linear

    def loss(x, w, b):
        return linear(x, w, b, "gelu").sin().sum()

    for registry in routed_registry():
        x, w, b = _linear_inputs()
        backend = AotEagerAndRecordGraphs()
        with _dispatch_log() as log:
            got = torch.compile(loss, backend=backend, fullgraph=True)(x, w, b)
            grads = torch.autograd.grad(got, (x, w, b))
        expected = F.gelu(F.linear(x, w, b), approximate="tanh").sin().sum()
        torch.testing.assert_close(got, expected)
        for g, e in zip(grads, torch.autograd.grad(expected, (x, w, b))):
            torch.testing.assert_close(g, e)
        forward, backward = _targets(backend.fw_graphs[0]), _targets(backend.bw_graphs[0])
        assert not {t for t in forward | backward if t.startswith("xpuruntime.")}, forward | backward
        assert "aten.gelu.default" in forward and "aten.gelu_backward.default" in backward
        gemms = [t for t in _calls(backend.bw_graphs[0]) if "mm" in t]
        assert sorted(gemms) == ["aten.mm.default"] * 2, gemms  # dx and dW: the body's recomputed z is CSE'd away
        assert ("linear", "inductor", "compile") in {(r.op_name, r.selected_kernel, r.origin) for r in log}

        x, w, b = (t.detach() for t in _linear_inputs())
        backend = AotEagerAndRecordGraphs()
        with xrt.kernel_policy(xrt.KernelPolicy({"linear": "test_mm"}, validate=registry)):  # no activation
            got = torch.compile(lambda *a: linear(*a).sin().sum(), backend=backend, fullgraph=True)(x, w, b)
        torch.testing.assert_close(got, F.linear(x, w, b).sin().sum())
        assert "xpuruntime.linear.default" in _targets(backend.fw_graphs[0])
