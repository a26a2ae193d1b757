"""The policy inside torch.compile (issue 29), on the CPU through the tests' CPU routing: under aot_eager and
inductor, fullgraph or with a graph break, static or dynamic shapes, the routed ops of a small model dispatch
through xpuruntime exactly as in eager mode (same ops, same kernels, same counts, forward and backward);
decisions made while compiling are logged and explained; a policy change after compiling recompiles; strict
policies fail the compilation with the candidates' reasons; autotune keeps PyTorch's code where it wins.

Inductor compiles on the CPU are slow (C++ kernels): the tests share one module-wide CPU routing and keep the
inductor cases few. Tiny Hugging Face models: test_pytorch_compile_hf.py."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_cpu_routing import CALLS, fake_timings, forget_warnings, policy, routed_registry

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.registry import Backend, kernel

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")
POLICY_OPS = ("matmul", "attention", "layer_norm", "rms_norm")


@pytest.fixture(scope="module")
def cpu_routing():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(compile_threads=1):  # no worker pool to start on a 2-core machine
        for registry in routed_registry():
            registry.register_backend(Backend("torch", "cpu", empty=lambda s, d, dev, st: np.full(s, np.nan, d)))
            registry.register_kernel(kernel("layer_norm", "torch_ln", backend="torch", dtypes={"float32"})(_torch_ln))
            registry.register_kernel(
                kernel("layer_norm", "ln_half_only", backend="torchcpu", dtypes={"float16"})(_torch_ln)
            )
            yield registry


@pytest.fixture(autouse=True)
def _fresh(cpu_routing):
    torch._dynamo.reset()
    forget_warnings()
    CALLS.clear()
    yield
    xtorch.clear_kernel_policy()


def _torch_ln(args):
    """Stands in for the `torch` backend's layer_norm (and for a kernel that takes float16 only)."""
    CALLS["torch_ln"] += 1
    x, w, b = (None if t is None else torch.from_numpy(np.asarray(t)) for t in args.inputs)
    dims = list(args.attrs["normalized_shape"])
    torch.from_numpy(args.out).copy_(F.layer_norm(x, dims, w, b, args.attrs["eps"]))


class Block(torch.nn.Module):
    """Linear (addmm), LayerNorm, causal SDPA (bmm-free: our attention), Linear, RMSNorm; a graph break
    between attention and the output projection on request."""

    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.ln, self.qkv, self.out = torch.nn.LayerNorm(16), torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 16)
        if self.graph_break:
            torch._dynamo.graph_break()
        return F.rms_norm(self.out(y) @ self.out.weight, (16,))


def step(fn, x: torch.Tensor) -> tuple[collections.Counter, torch.Tensor, list[torch.Tensor]]:
    """One forward and backward: the calls dispatched while running ((op, kernel) -> count, decisions made
    while compiling left out), the output and the input's and parameters' gradients."""
    module = getattr(fn, "_orig_mod", fn)
    module.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    try:
        y = fn(x)
        y.square().sum().backward()
    finally:
        xrt.disable_dispatch_logging()
    calls = collections.Counter(
        (r.op_name, r.selected_kernel) for r in xrt.get_dispatch_logs() if r.origin != "compile"
    )
    return calls, y.detach(), [x.grad, *(p.grad for p in module.parameters())]


def _routing_policy(registry, **options):
    return policy(*POLICY_OPS, registry=registry, **options)


@pytest.mark.parametrize(
    ("backend", "fullgraph", "dynamic"),
    [("aot_eager", True, False), ("aot_eager", False, True), ("inductor", True, False), ("inductor", False, True)],
)
def test_small_model_dispatches_as_in_eager(cpu_routing, backend, fullgraph, dynamic):
    torch.manual_seed(0)
    model, x = Block(graph_break=not fullgraph), torch.randn(2, 5, 16)
    xtorch.set_kernel_policy(_routing_policy(cpu_routing))
    eager, y_eager, grads_eager = step(model, x)
    assert {op for op, _ in eager} >= {"matmul", "linear", "attention_forward", "attention_backward", "layer_norm",
                                       "layer_norm_backward", "rms_norm"}  # fmt: skip
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    for _ in range(2):  # the first call compiles, the second runs the compiled code only
        calls, y, grads = step(compiled, x)
        if backend == "aot_eager":  # its matrix products run eagerly: through the backend-key overrides
            assert calls == eager
        else:
            assert calls == eager, f"compiled {dict(calls)} != eager {dict(eager)}"
        torch.testing.assert_close(y, y_eager, rtol=1e-5, atol=1e-5)
        for g, e in zip(grads, grads_eager):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    origins = {r.origin for r in xrt.get_dispatch_logs()}
    assert "graph" in origins and "compile" not in origins  # the second call: no decision left to make


def test_decisions_made_while_compiling_are_logged_and_explained(cpu_routing):
    torch.manual_seed(1)
    model, x = Block(), torch.randn(2, 5, 16)
    xtorch.set_kernel_policy(_routing_policy(cpu_routing))
    xrt.enable_dispatch_logging()
    torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    decided = {(r.op_name, r.selected_kernel, r.reason) for r in xrt.get_dispatch_logs() if r.origin == "compile"}
    # rms_norm's backward has no kernel here: its body traces PyTorch's formula, for inductor (custom_ops.inline)
    assert decided == {("layer_norm", "test_ln", "policy"), ("attention_forward", "test_attention", "policy"),
                       ("rms_norm", "test_rms", "policy"), ("rms_norm_backward", "inductor", "fallback")}  # fmt: skip
    explained = {e.ctx.op: e for e in xtorch.compiled_decisions()}
    assert explained["layer_norm"].origin == "compile" and explained["layer_norm"].selected == "test_ln"
    assert "decided while compiling a graph" in explained["layer_norm"].headline()
    assert any(
        row["kernel"] == "ln_half_only" and row["verdict"] == "rejected" for row in explained["layer_norm"].rows()
    )


def test_products_replaced_in_the_inductor_graphs_are_decided_at_compile_time(cpu_routing):
    """(A graph served from inductor's caches was decided when first compiled, under the same routing: the
    passes' uuid carries it. This test compiles afresh to see the decisions made.)"""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    torch.manual_seed(2)
    lin, x = torch.nn.Linear(16, 8), torch.randn(4, 16)
    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    xrt.enable_dispatch_logging()
    fn = torch.compile(lambda t: lin(t) @ lin.weight, backend="inductor", fullgraph=True)
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        y = fn(x.requires_grad_())
        y.sum().backward()
    records = [(r.op_name, r.selected_kernel, r.origin) for r in xrt.get_dispatch_logs()]
    assert ("linear", "test_mm", "compile") in records and ("matmul", "test_mm", "compile") in records
    assert {(op, k) for op, k, origin in records if origin == "graph"} == {("linear", "test_mm"), ("matmul", "test_mm")}
    torch.testing.assert_close(y, lin(x) @ lin.weight, rtol=1e-5, atol=1e-5)


def _counting(counter: list[int]):
    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        counter.append(1)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    return backend


def test_a_policy_change_after_compiling_recompiles_and_each_routing_keeps_its_graph(cpu_routing):
    cpu_routing.register_kernel(kernel("layer_norm", "other_ln", backend="torchcpu", dtypes={"float32"})(_torch_ln))
    x, compiles = torch.randn(3, 8), []
    fn = torch.compile(lambda t: F.layer_norm(t, (8,)), backend=_counting(compiles), fullgraph=True)
    ran = []
    for name in ("test_ln", "other_ln", "test_ln", "other_ln"):
        xtorch.set_kernel_policy(xrt.KernelPolicy({"layer_norm": name}, validate=cpu_routing))
        xrt.clear_dispatch_logs()
        xrt.enable_dispatch_logging()
        torch.testing.assert_close(fn(x), F.layer_norm(x, (8,)), rtol=1e-5, atol=1e-5)
        ran.append({r.selected_kernel for r in xrt.get_dispatch_logs() if r.origin == "graph"})
        xrt.disable_dispatch_logging()
    assert ran == [{"test_ln"}, {"other_ln"}, {"test_ln"}, {"other_ln"}]
    assert len(compiles) == 2  # one graph per routing, each reused when its routing returns


def test_a_graph_compiled_without_a_policy_recompiles_once_a_policy_routes_its_ops(cpu_routing):
    """inductor's pre-grad pass guards every frame, also one whose trace met no routed op."""
    torch.manual_seed(3)
    w, x = torch.randn(8), torch.randn(3, 8)
    fn = torch.compile(lambda t: F.layer_norm(t, (8,), w), backend="inductor", fullgraph=True)
    expected = F.layer_norm(x, (8,), w)
    torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
    assert CALLS["layer_norm"] == 0
    xtorch.set_kernel_policy(policy("layer_norm", registry=cpu_routing))
    torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
    assert CALLS["layer_norm"] == 1


def test_strict_policy_fails_the_compilation_with_the_candidates_reasons(cpu_routing):
    x = torch.randn(3, 8)
    strict = xrt.KernelPolicy({"layer_norm": "ln_half_only"}, strict=True, validate=cpu_routing)
    xtorch.set_kernel_policy(strict)
    fn = torch.compile(lambda t: F.layer_norm(t, (8,)), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as caught:
        fn(x)
    chain, error = [], caught.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    refusal = next(e for e in chain if isinstance(e, xrt.UnsupportedByPolicyError))
    assert "while compiling a graph" in str(refusal) and "ln_half_only" in str(refusal)
    assert "float32" in str(refusal)  # its reason: a dtype it does not take


def test_a_kernel_that_cannot_run_a_call_site_warns_once_and_keeps_pytorchs_code(cpu_routing):
    x = torch.randn(3, 8)
    xtorch.set_kernel_policy(xrt.KernelPolicy({"layer_norm": "ln_half_only"}, validate=cpu_routing))
    fn = torch.compile(lambda t: F.layer_norm(t, (8,)) + F.layer_norm(t * 2, (8,)), backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fn(x)
        fn(x)
    fallbacks = [w for w in caught if issubclass(w.category, xrt.KernelFallbackWarning)]
    assert len(fallbacks) == 1 and "layer_norm" in str(fallbacks[0].message)
    assert "ln_half_only" in str(fallbacks[0].message) and "while compiling a graph" in str(fallbacks[0].message)
    assert CALLS["torch_ln"] == 0  # PyTorch's own layer norm, inside the graph
    torch.testing.assert_close(y, F.layer_norm(x, (8,)) + F.layer_norm(x * 2, (8,)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_attention_dropout_runs_pytorchs_sdpa_with_one_warning_a_log_entry_or_a_strict_error(cpu_routing, compiled):
    """GPT-2 trains with attention dropout, which no kernel of ours takes: never silently (issue 25 item 3)."""
    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)

    fn = torch.compile(sdpa, backend="aot_eager") if compiled else sdpa
    xtorch.set_kernel_policy(policy("attention", registry=cpu_routing))
    xrt.enable_dispatch_logging()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            fn(q, k, v).sum().backward()
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, xrt.KernelFallbackWarning)]
    assert len(fallbacks) == 1 and "dropout_p=0.25" in fallbacks[0] and "test_attention" in fallbacks[0]
    assert CALLS["attention_forward"] + CALLS["attention"] == 0
    logged = [r for r in xrt.get_dispatch_logs() if r.op_name == "attention"]
    assert logged and {(r.selected_kernel, r.reason) for r in logged} == {("torch", "fallback")}
    torch._dynamo.reset()
    xtorch.set_kernel_policy(policy("attention", registry=cpu_routing, strict=True))
    fn = torch.compile(sdpa, backend="aot_eager") if compiled else sdpa
    with pytest.raises(Exception, match=r"dropout_p=0\.25"):
        fn(q, k, v)


@pytest.mark.parametrize("ours_faster", [True, False])
def test_autotune_under_compile_puts_our_op_in_only_where_it_beats_pytorchs_kernel(
    cpu_routing, monkeypatch, ours_faster
):
    timed = fake_timings(monkeypatch)
    timed.update(test_ln=5.0 if ours_faster else 50.0, torch_ln=20.0, ln_half_only=1.0, other_ln=99.0)
    x = torch.randn(3, 8)
    expected = F.layer_norm(x, (8,))
    xtorch.set_kernel_policy(xrt.KernelPolicy({"layer_norm": "autotune"}, validate=cpu_routing))
    xrt.enable_dispatch_logging()
    fn = torch.compile(lambda t: F.layer_norm(t, (8,)), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(fn(x), expected, rtol=1e-5, atol=1e-5)
    graph_calls = [(r.selected_kernel, r.reason) for r in xrt.get_dispatch_logs() if r.origin == "graph"]
    assert graph_calls == ([("test_ln", "autotune")] if ours_faster else [])
    assert CALLS["torch_ln"] == 0  # PyTorch's kernel was timed (faked here), and otherwise left to the graph


def test_opcheck_every_custom_op():
    """torch.library.opcheck: schema, fake kernel, autograd registration, AOT dispatch (static and dynamic)."""
    torch.manual_seed(4)
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k, v = torch.randn(2, 2, 7, 8, requires_grad=True), torch.randn(2, 2, 7, 4, requires_grad=True)
    mask = torch.rand(5, 7) > 0.3
    mask[:, 0] = True
    kf, vf = k.detach().repeat_interleave(2, 1).requires_grad_(), v.detach().repeat_interleave(2, 1).requires_grad_()
    ops = torch.ops.xpuruntime
    cases = [
        (ops.attention.default, (q, kf, vf, None, False, None, False)),
        (ops.attention.default, (q, kf, vf, mask, False, 0.3, False)),
        (ops.attention.default, (q, k, v, None, True, None, True)),
    ]
    out, lse = ops.attention(q.detach(), kf.detach(), vf.detach(), None, True, None, False)
    dout = torch.randn_like(out)
    # the backward ops run inside backward graphs, on tensors that need no gradient (no double backward)
    plain = [t.detach() for t in (q, kf, vf)]
    cases.append((ops.attention_backward.default, (dout, *plain, out, lse, None, True, None, False)))
    x = torch.randn(3, 5, 6, requires_grad=True).transpose(0, 1)
    w, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    dy = torch.randn(5, 3, 6)
    cases += [
        (ops.layer_norm.default, (x, [6], w, b, 1e-5)),
        (ops.layer_norm.default, (x, [3, 6], None, None, 1e-5)),
        (ops.layer_norm_backward.default, (dy, x.detach(), [6], w.detach(), b.detach(), 1e-5)),
        (ops.rms_norm.default, (x, [6], w, 1e-6)),
        (ops.rms_norm.default, (x, [6], None, None)),
        (ops.rms_norm_backward.default, (dy, x.detach(), [6], w.detach(), 1e-6)),
    ]
    a, m = torch.randn(4, 6, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    cases += [
        (ops.mm.default, (a, m)),
        (ops.mm.default, (a.detach().t().contiguous().t().requires_grad_(), m)),
        (ops.bmm.default, (torch.randn(2, 4, 6, requires_grad=True), torch.randn(2, 6, 3, requires_grad=True))),
        (ops.addmm.default, (torch.randn(3, requires_grad=True), a, m, 1.0, 1.0)),
        (ops.addmm.default, (torch.randn(4, 3, requires_grad=True), a, m, 0.5, 2.0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_the_inductor_passes_pickle_by_name_for_the_fx_graph_cache_key(cpu_routing):
    """Inductor pickles its config into its FX graph cache's key (PyTorch 2.11 with the pre-grad pass in it):
    a pass it cannot pickle bypasses the cache on every compile. Ours pickle and keep their uuid."""
    import pickle

    import torch._inductor.config as inductor_config

    xtorch.set_kernel_policy(policy("matmul", registry=cpu_routing))
    for slot in ("pre_grad_custom_pass", "post_grad_custom_pre_pass"):
        installed = getattr(inductor_config, slot)
        copy = pickle.loads(pickle.dumps(installed))
        assert type(copy) is type(installed) and copy.uuid() == installed.uuid(), slot


def test_a_graphs_kernel_keeps_no_workspace_past_its_call(cpu_routing):
    """Inside a custom op (a compiled graph's call) a kernel's workspace is fresh and freed with the call:
    inductor's CUDA graph pools must hold nothing of ours once a graph returns (reduce-overhead)."""
    import gc
    import weakref

    lent = []

    def scratchy_ln(args):
        lent.append(weakref.ref(args.workspace))
        _torch_ln(args)

    cpu_routing.register_kernel(
        kernel("layer_norm", "scratchy_ln", backend="torchcpu", dtypes={"float32"},
               workspace_bytes=lambda ctx: 256)(scratchy_ln)
    )  # fmt: skip
    x = torch.randn(3, 8)
    expected = F.layer_norm(x, (8,))
    xtorch.set_kernel_policy(xrt.KernelPolicy({"layer_norm": "scratchy_ln"}, validate=cpu_routing))
    for _ in range(2):
        out = torch.ops.xpuruntime.layer_norm(x, [8], None, None, 1e-5)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    gc.collect()
    assert len(lent) == 2 and all(ref() is None for ref in lent)
