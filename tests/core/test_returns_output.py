"""Kernels declared `returns_output=True` (CPU): without out= nothing is allocated and the returned object
is the result; with out= they write into it; returning None is a clear error. Also the autotune timing,
the op attention_backward (a tuple or the packed array) and its PyTorch front ends with such a kernel."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import autotune
from xpuruntime.abi import ArgPack
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import LaunchError, RegistrationError
from xpuruntime.ops.attention_backward import gradients_reference, unpack
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import Backend, KernelSpec, Registry, kernel

rng = np.random.default_rng(7)


class Recorder:
    """The toy op on a backend that counts allocations, with a returns_output kernel 'own' (x * 2, returned
    when args.out is None, else written) and, optionally, a plain kernel 'plain' (x + 1)."""

    def __init__(self, returns: str = "array", plain: bool = False) -> None:
        self.allocations = 0
        self.outs: list = []  # args.out of each launch of 'own'
        self.returned: list = []  # what 'own' returned
        self.returns = returns
        self.registry = Registry()
        self.registry.register_op(make_toy_registry().ops["toy"])
        self.registry.register_backend(Backend("cpu", "cpu", empty=self._empty))
        if plain:
            add_one = kernel("toy", "plain", backend="cpu", priority=-1)(
                lambda args: np.add(*args.inputs, 1, out=args.out)
            )
            self.registry.register_kernel(add_one)

        def own(args: ArgPack):
            self.outs.append(args.out)
            y = args.inputs[0] * 2
            if args.out is not None:
                np.copyto(args.out, y)
                return None
            result = None if self.returns == "none" else y
            self.returned.append(result)
            return result

        self.registry.register_kernel(kernel("toy", "own", backend="cpu", returns_output=True)(own))
        self.dispatcher = Dispatcher(self.registry)

    def _empty(self, shape, dtype, device, stream):
        self.allocations += 1
        return np.full(shape, np.nan, dtype)


def test_without_out_the_returned_object_is_the_result_and_nothing_is_allocated() -> None:
    rec = Recorder()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    for hit in (False, True):  # a plan-cache miss, then a hit
        y = rec.dispatcher.run("toy", (x,))
        assert y is rec.returned[-1] and rec.outs[-1] is None
        np.testing.assert_array_equal(y, x * 2)
        assert rec.dispatcher.plans.stats().hits == int(hit)
    assert rec.allocations == 0
    assert rec.dispatcher.plan("toy", x).returns_output


def test_with_out_the_kernel_writes_into_it() -> None:
    rec = Recorder()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    out = np.full((3, 4), np.nan, np.float32)
    assert rec.dispatcher.run("toy", (x,), out=out) is out
    assert rec.outs == [out] and rec.returned == [] and rec.allocations == 0
    np.testing.assert_array_equal(out, x * 2)


def test_returning_none_without_out_is_a_clear_error() -> None:
    rec = Recorder(returns="none")
    with pytest.raises(LaunchError, match=r"toy: kernel 'own' \[cpu\] declares returns_output=True but returned None"):
        rec.dispatcher.run("toy", (np.ones(3, np.float32),))
    out = np.empty(3, np.float32)  # with out= it writes and returns None, as any kernel
    assert rec.dispatcher.run("toy", (np.ones(3, np.float32),), out=out) is out


def test_the_flag_is_validated_and_off_by_default() -> None:
    with pytest.raises(RegistrationError, match="field 'returns_output' expected True or False"):
        kernel("toy", "k", backend="cpu", returns_output="yes")(lambda args: None)
    with pytest.raises(RegistrationError, match="field 'returns_output'"):
        KernelSpec("toy", "k", "cpu", lambda args: None, returns_output=1)
    assert not kernel("toy", "k", backend="cpu")(lambda args: None).returns_output


def test_plain_kernels_are_unchanged_and_logging_sees_both() -> None:
    rec = Recorder(plain=True)
    x = np.ones(5, np.float32)
    xrt.enable_dispatch_logging()
    with xrt.kernel_policy(KernelPolicy(toy="plain", validate=False)):
        np.testing.assert_array_equal(rec.dispatcher.run("toy", (x,)), x + 1)
    assert rec.allocations == 1
    np.testing.assert_array_equal(rec.dispatcher.run("toy", (x,)), x * 2)
    assert [r.selected_kernel for r in xrt.get_dispatch_logs()] == ["plain", "own"]


def test_autotune_times_a_returns_output_kernel_as_dispatch_runs_it() -> None:
    """No out= buffer for it (so its timing has no copy into one); the plain kernel still gets one."""
    rec = Recorder(plain=True)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    policy = KernelPolicy()
    decision = rec.dispatcher.decide("toy", (x,), (), None, policy)
    supported = [c for c in decision.candidates if c.supported]
    times = autotune.time_candidates(rec.dispatcher, decision, supported, (x,), policy)
    assert set(times) == {"own", "plain"}
    assert rec.outs and all(out is None for out in rec.outs)
    assert rec.allocations == 1  # the plain kernel's buffer


def test_cpu_tensors_get_tensors_back_from_a_returned_tuple() -> None:
    torch = pytest.importorskip("torch")
    registry = make_toy_registry()
    pair = dataclasses.replace(registry.ops["toy"], returned_parts=lambda ctx: ((ctx.out_shape, ctx.out_dtype),) * 2)
    registry.ops["toy"] = pair  # a toy op whose returns_output kernels may return a pair

    def halves(args: ArgPack):
        x = args.inputs[0]
        return (x * 0.5, x * 0.25) if args.out is None else np.copyto(args.out, x)

    registry.register_kernel(kernel("toy", "halves", backend="cpu", priority=5, returns_output=True)(halves))
    a, b = Dispatcher(registry).run("toy", (torch.ones(3),))
    assert (
        isinstance(a, torch.Tensor) and torch.equal(a, torch.full((3,), 0.5)) and torch.equal(b, torch.full((3,), 0.25))
    )


# -- attention_backward with a kernel that returns (dq, dk, dv) ----------------------------------------------

RETURNED: list = []


def _tuple_backward(args: ArgPack):
    """The CPU math backward, returning fresh (dq, dk, dv) when given no out= (as PyTorch's fused ones do)."""
    math_kernel = xrt.default_registry().kernel("attention_backward", "math")
    if args.out is not None:
        return math_kernel.launch(args)
    _, q, k, v, *_ = args.inputs
    packed = np.empty(sum(args.attrs["sizes"]), q.dtype)
    math_kernel.launch(ArgPack(args.inputs, packed, args.attrs, args.config))
    grads = tuple(g.copy() for g in unpack(packed, q.shape, k.shape, v.shape))
    RETURNED.append(grads)
    return grads


@pytest.fixture
def tuple_kernel():
    """'test_tuple' (returns_output) for attention_backward in the process-wide registry, removed after."""
    registry = xrt.default_registry()
    spec = kernel("attention_backward", "test_tuple", backend="cpu", priority=-100, returns_output=True)(
        _tuple_backward
    )
    registry.register_kernel(spec)
    RETURNED.clear()
    try:
        yield spec
    finally:
        registry.unregister_kernel(spec.op, spec.name)
        RETURNED.clear()


def _attention_case(dtype=np.float64):
    q = rng.standard_normal((2, 3, 5, 8)).astype(dtype)
    k, v = rng.standard_normal((2, 3, 7, 8)).astype(dtype), rng.standard_normal((2, 3, 7, 4)).astype(dtype)
    out, lse = xrt.ops.attention_forward(q, k, v)
    do = rng.standard_normal(out.shape).astype(dtype)
    return do, q, k, v, out, lse


def test_attention_backward_returns_the_kernels_tuple_or_views_of_grads_out(tuple_kernel) -> None:
    do, q, k, v, out, lse = _attention_case()
    want = gradients_reference(do, q, k, v)
    with xrt.kernel_policy(attention_backward="test_tuple", strict=True):
        grads = xrt.ops.attention_backward(do, q, k, v, out, lse)
        assert len(RETURNED) == 1 and all(g is r for g, r in zip(grads, RETURNED[0]))  # no copy, no packing
        packed = np.full(q.size + k.size + v.size, np.nan)
        into = xrt.ops.attention_backward(do, q, k, v, out, lse, grads_out=packed)
        assert len(RETURNED) == 1 and all(g.base is packed for g in into)  # written into the caller's buffer
    for got, also, ref in zip(grads, into, want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)  # lse is float32
        np.testing.assert_array_equal(got, also)
    assert unpack(grads, q.shape, k.shape, v.shape) == grads


def _torch_grads(torch, q, k, v, dout, causal):
    import torch.nn.functional as F

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    return torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=causal), leaves, dout)


@pytest.mark.filterwarnings("ignore::UserWarning:torch")
@pytest.mark.parametrize("front_end", ["sdpa", "fused_attention"])
def test_pytorch_front_ends_take_the_tuple(front_end) -> None:
    """Both routes of attention_backward (the SDPA override's autograd Function, the custom op) give the
    kernel's tuple back as the gradients, through a private routed registry on the CPU."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from pytorch_cpu_routing import policy, routed_registry

    import xpuruntime.pytorch as xtorch

    routing = routed_registry()
    registry = next(routing)
    try:
        registry.unregister_kernel("attention_backward", "test_attention")  # the name the policy gives
        registry.register_kernel(
            kernel("attention_backward", "test_attention", backend="torchcpu", dtypes={"float64"},
                   returns_output=True)(_tuple_backward)
        )  # fmt: skip
        RETURNED.clear()
        q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        dout = torch.randn(2, 3, 5, 8, dtype=torch.float64)
        xtorch.set_kernel_policy(policy("attention", registry=registry))
        if front_end == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = xtorch.ops.fused_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        assert len(RETURNED) == 1  # dispatched once, without out=
        assert all(g.data_ptr() == r.ctypes.data for g, r in zip(grads, RETURNED[0]))  # its arrays, no copy
        xtorch.clear_kernel_policy()
        for got, want in zip(grads, _torch_grads(torch, q, k, v, dout, True)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # the logsumexp is float32
    finally:
        routing.close()
        RETURNED.clear()
