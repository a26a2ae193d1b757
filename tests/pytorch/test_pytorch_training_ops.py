"""The fused training ops on PyTorch tensors (`xtorch.ops.rms_norm` with Hugging Face's casting, add_rms_norm,
add_layer_norm, swiglu, geglu, rotary_embedding, linear, linear_cross_entropy) and their custom ops: results and
gradients against the PyTorch code they replace in float64, the dispatch log (the CPU kernels, forward and
backward, eager and compiled), torch.library.opcheck, torch.compile (aot_eager and inductor, fullgraph, static and
dynamic shapes), a policy pinned to the calls, the PyTorch fallback where no kernel runs (bf16 on the CPU), and
argument errors."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import NewGELUActivation
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch.custom_ops import glu, norm
from xpuruntime.pytorch.router import pin

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")

NUMPY = xrt.KernelPolicy(
    {
        op: "numpy"
        for op in (
            "rms_norm",
            "add_rms_norm",
            "add_layer_norm",
            "swiglu",
            "geglu",
            "rotary_embedding",
            "linear",
            "linear_cross_entropy",
        )
    }
)  # the CPU kernels; each op's family (its backward ops) follows


def _hf_rms_norm(x, w):
    """LlamaRMSNorm's forward with `w` as its weight (the module's own code, run on a stand-in)."""
    return LlamaRMSNorm.forward(type("Norm", (), {"weight": w, "variance_epsilon": 1e-6})(), x)


def _shifted(labels):
    return F.pad(labels, (0, 1), value=-100)[..., 1:]


def _cases():
    """name -> (inputs, our function, PyTorch's code, ops expected in the log)."""
    g = torch.Generator().manual_seed(0)

    def t(*shape, grad=True):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)

    x, res, w, b = t(3, 5, 8), t(3, 5, 8), t(8), t(8)
    q, k = t(2, 4, 5, 8).transpose(1, 2), t(2, 2, 5, 8).transpose(1, 2)  # (B, S, H, D) views, HF's layout
    cos, sin = t(2, 5, 8, grad=False), t(2, 5, 8, grad=False)
    hidden, head, head_bias = t(2, 5, 8), t(11, 8), t(11)
    target = torch.randint(0, 11, (2, 5), generator=g)
    target[0, 1] = -100
    conv_w = t(8, 12)  # a Conv1D's (in, out) weight: linear takes its transpose
    return {
        "rms_norm": ((x, w), lambda x, w: xtorch.ops.rms_norm(x, 8, w, 1e-6, casting="llama"), _hf_rms_norm,
                     {"rms_norm", "rms_norm_backward"}),
        "add_rms_norm": ((x, res, w), lambda x, r, w: xtorch.ops.add_rms_norm(x, r, w, 1e-6, casting="llama"),
                         lambda x, r, w: (_hf_rms_norm(x + r, w), x + r), {"add_rms_norm", "add_rms_norm_backward"}),
        "add_layer_norm": ((x, res, w, b), lambda x, r, w, b: xtorch.ops.add_layer_norm(x, r, w, b),
                           lambda x, r, w, b: (F.layer_norm(x + r, (8,), w, b), x + r),
                           {"add_layer_norm", "add_layer_norm_backward"}),
        "swiglu": ((x, res), xtorch.ops.swiglu, lambda a, u: F.silu(a) * u, {"swiglu", "swiglu_backward"}),
        "geglu_packed": ((x,), lambda p: xtorch.ops.geglu(p, None, "tanh"),
                         lambda p: F.gelu(p[..., :4], approximate="tanh") * p[..., 4:], {"geglu", "geglu_backward"}),
        "rotary_embedding": ((q, k), lambda q, k: xtorch.ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim=2),
                             lambda q, k: apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2),
                             {"rotary_embedding", "rotary_embedding_backward"}),
        "linear_gelu": ((x, conv_w, t(12)), lambda x, w, b: xtorch.ops.linear(x, w.t(), b, "gelu"),
                        lambda x, w, b: NewGELUActivation()(x @ w + b),
                        {"linear", "linear_grad_input", "linear_grad_weight"}),
        "linear_cross_entropy": (
            (hidden, head, head_bias), lambda h, w, b: xtorch.ops.linear_cross_entropy(h, w, target, b),
            lambda h, w, b: F.cross_entropy(F.linear(h, w, b).reshape(-1, 11), target.reshape(-1)),
            {"linear_cross_entropy"},  # its forward makes the gradients: the backward only scales them
        ),
        "linear_cross_entropy_none": (
            (hidden, head, head_bias),
            lambda h, w, b: xtorch.ops.linear_cross_entropy(h, w, target, b, label_smoothing=0.1, reduction="none"),
            lambda h, w, b: F.cross_entropy(F.linear(h, w, b).reshape(-1, 11), target.reshape(-1), reduction="none",
                                            label_smoothing=0.1).reshape(2, 5),
            {"linear_cross_entropy", "linear_cross_entropy_backward"},
        ),
    }  # fmt: skip


CASES = _cases()


def _run(fn, inputs, dtype):
    """(outputs, gradients of every input) of fn on copies of `inputs` in `dtype`, for fixed random weights."""
    leaves = [x.detach().to(dtype).requires_grad_(x.requires_grad) for x in inputs]
    outputs = fn(*leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outputs]
    sum(((o * w).sum() for o, w in zip(outputs, weights)), torch.zeros((), dtype=dtype)).backward()
    return [o.detach() for o in outputs], [x.grad for x in leaves if x.requires_grad]


def _logged() -> collections.Counter:
    return collections.Counter((r.op_name, r.selected_kernel, r.origin) for r in xrt.get_dispatch_logs())


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_the_pytorch_code_it_replaces_forward_and_backward(name):
    inputs, ours, theirs, ops = CASES[name]
    expected = _run(theirs, inputs, torch.float64)
    xrt.enable_dispatch_logging()
    try:
        with xtorch.kernel_policy(NUMPY):
            got = _run(ours, inputs, torch.float32)
    finally:
        xrt.disable_dispatch_logging()
    for a, e in zip([*got[0], *got[1]], [*expected[0], *expected[1]]):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), e, rtol=2e-5, atol=2e-5)
    assert {op for op, _, _ in _logged()} == ops
    assert all(kernel == "numpy" and origin == "eager" for _, kernel, origin in _logged())
    xrt.clear_dispatch_logs()


def test_opcheck_every_fused_custom_op():
    """Schema, fakes, autograd registration and AOT dispatch (static and dynamic) of every forward and backward op."""
    torch.manual_seed(3)
    o = torch.ops.xpuruntime
    x, r, w = torch.randn(3, 5, 8, requires_grad=True), torch.randn(3, 5, 8), torch.randn(8, requires_grad=True)
    q, k = torch.randn(2, 4, 5, 8, requires_grad=True), torch.randn(2, 2, 5, 8, requires_grad=True)
    cos, sin = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    h, hw, target = torch.randn(2, 5, 8, requires_grad=True), torch.randn(11, 8, requires_grad=True), torch.zeros(
        2, 5, dtype=torch.long)  # fmt: skip
    d = torch.randn(3, 5, 8)
    cases = [
        (o.rms_norm.default, (x, [8], w, 1e-6, 0.0, "llama", "")),
        (o.rms_norm_backward.default, (d, x.detach(), [8], w.detach(), 1e-6, 0.0, "llama", "")),
        (o.add_rms_norm.default, (x, r, w, 1e-6, 0.0, "llama", "")),
        (o.add_rms_norm_backward.default, (d, d, x.detach(), w.detach(), 1e-6, 0.0, "llama", "")),
        (o.add_layer_norm.default, (x, r, w, w, 1e-5, "")),
        (o.add_layer_norm_backward.default, (d, None, x.detach(), w.detach(), None, 1e-5, "")),
        (o.swiglu.default, (x, r, "")),
        (o.swiglu_backward.default, (d[..., :4], x.detach(), None, "")),
        (o.geglu.default, (x, None, "tanh", "")),
        (o.geglu_backward.default, (d, x.detach(), r, "none", "")),
        (o.rotary_embedding.default, (q, k, cos, sin, None, 1, False, "")),
        (o.rotary_embedding_backward.default, (q.detach(), k.detach(), cos, sin, None, 1, False, "")),
        (o.linear.default, (x, torch.randn(12, 8, requires_grad=True), None, "gelu", "")),
        (o.linear_backward.default, (torch.randn(3, 5, 12), x.detach(), torch.randn(12, 8), None, "gelu", True, True,
                                     "")),
        (o.linear_cross_entropy.default, (h, hw, target, None, -100, 0.0, "mean", 0.0, True, True, "")),
        (o.linear_cross_entropy.default, (h, hw, target, None, -100, 0.1, "none", 1e-4, False, False, "")),
        (o.linear_cross_entropy_backward.default, (torch.rand(2, 5), h.detach(), hw.detach(), target, None, -100, 0.0,
                                                   "none", 0.0, True, "")),
    ]  # fmt: skip
    for op, args in cases:
        torch.library.opcheck(op, args)


def _all_ops(x, r, w, q, k, cos, sin, head, target):
    """Every fused op once, as a patched decoder block would call them."""
    pinned = PINNED
    y = norm.rms_norm(x, [8], w, 1e-6, casting="llama", pinned=pinned)
    y, h = xtorch.ops.add_rms_norm(y, r, w, 1e-6, casting="llama")
    y = glu.swiglu(y, h, pinned)
    qe, ke = xtorch.ops.rotary_embedding(q, k, cos, sin)
    z = xtorch.ops.linear(y, head[:, :8], None, "gelu")
    loss = xtorch.ops.linear_cross_entropy(y, head, target)
    return loss + z.square().mean() + qe.square().mean() + ke.mean()


PINNED = pin(NUMPY)


def _all_inputs(seq: int = 5):
    g = torch.Generator().manual_seed(5)
    x, r = (torch.randn(2, seq, 8, generator=g, requires_grad=True) for _ in range(2))
    q, k = torch.randn(2, 4, seq, 8, generator=g, requires_grad=True), torch.randn(2, 2, seq, 8, generator=g)
    cos, sin = torch.randn(2, seq, 8, generator=g), torch.randn(2, seq, 8, generator=g)
    return (x, r, torch.randn(8, generator=g, requires_grad=True), q, k.requires_grad_(), cos, sin,
            torch.randn(11, 8, generator=g, requires_grad=True), torch.randint(0, 11, (2, seq), generator=g))  # fmt: skip


def _loss_and_grads(fn, inputs):
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    loss = fn(*leaves)
    loss.backward()
    return loss.detach(), [t.grad for t in leaves if t.requires_grad]


@pytest.mark.parametrize(("backend", "dynamic"), [("aot_eager", False), ("aot_eager", True), ("inductor", False)])
def test_compiled_calls_dispatch_as_eager_forward_and_backward(backend, dynamic):
    torch._dynamo.reset()
    inputs = _all_inputs()
    xrt.enable_dispatch_logging()
    try:
        with xtorch.kernel_policy(NUMPY):
            xrt.clear_dispatch_logs()
            eager_loss, eager_grads = _loss_and_grads(_all_ops, inputs)
            eager = collections.Counter((op, kernel) for op, kernel, _ in _logged())
            compiled = torch.compile(_all_ops, backend=backend, fullgraph=True, dynamic=dynamic)
            for seq in (5, 7) if dynamic else (5,):
                xrt.clear_dispatch_logs()
                loss, grads = _loss_and_grads(compiled, _all_inputs(seq))
                calls = _logged()
                assert collections.Counter((op, kernel) for op, kernel, _ in calls) == eager
                assert {origin for _, _, origin in calls} == {"graph"}
            loss, grads = _loss_and_grads(compiled, inputs)
    finally:
        xrt.disable_dispatch_logging()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    assert {"rms_norm_backward", "add_rms_norm_backward", "swiglu_backward", "rotary_embedding_backward",
            "linear_grad_weight"} <= {op for op, _ in eager}  # fmt: skip


def test_a_pinned_policy_wins_over_the_policy_in_force():
    """The policy in force names a kernel that cannot run on the CPU, strictly; the pinned one names numpy."""
    gate, up = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8, requires_grad=True)
    strict = xrt.KernelPolicy(swiglu="torch", strict=True)
    with xtorch.kernel_policy(strict), pytest.raises(xrt.UnsupportedByPolicyError, match="swiglu"):
        glu.swiglu(gate, up)
    xrt.enable_dispatch_logging()
    try:
        with xtorch.kernel_policy(strict):
            glu.swiglu(gate, up, PINNED).sum().backward()
    finally:
        xrt.disable_dispatch_logging()
    assert [(r.op_name, r.selected_kernel, r.reason) for r in xrt.get_dispatch_logs()] == [
        ("swiglu", "numpy", "policy"), ("swiglu_backward", "numpy", "policy")]  # fmt: skip
    xrt.clear_dispatch_logs()


def test_where_no_kernel_runs_the_pytorch_formula_does():
    """bf16 on the CPU (NumPy has no bfloat16): the ops compute PyTorch's code in bf16, gradients by autograd, and
    the dispatch log says so (kernel "torch", reason "fallback")."""
    inputs = [t.detach().bfloat16().requires_grad_(t.requires_grad) if t.is_floating_point() else t
              for t in _all_inputs()]  # fmt: skip
    xrt.enable_dispatch_logging()
    try:
        loss, grads = _loss_and_grads(_all_ops, inputs)
    finally:
        xrt.disable_dispatch_logging()
    logged = {(r.op_name, r.selected_kernel, r.reason) for r in xrt.get_dispatch_logs()}
    xrt.clear_dispatch_logs()
    assert {
        ("swiglu", "torch", "fallback"),
        ("swiglu_backward", "torch", "fallback"),
        ("linear_cross_entropy", "torch", "fallback"),
        ("rotary_embedding_backward", "torch", "fallback"),
    } <= logged
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in grads)
    reference, _ = _loss_and_grads(_all_ops, [t.float() if t.is_floating_point() else t for t in inputs])
    torch.testing.assert_close(loss, reference, rtol=3e-2, atol=3e-2)


def test_bf16_autocast_follows_what_the_replaced_code_gets():
    """linear_cross_entropy and linear cast to the autocast dtype (as F.linear); the norms and gated and rotary
    ops keep their inputs' dtypes (autocast leaves PyTorch's versions alone)."""
    x, w = torch.randn(2, 5, 8), torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert xtorch.ops.linear(x, torch.randn(12, 8)).dtype == torch.bfloat16
        assert xtorch.ops.rms_norm(x, 8, w, casting="llama").dtype == torch.float32
        assert xtorch.ops.swiglu(x, x).dtype == torch.float32
        loss = xtorch.ops.linear_cross_entropy(x, torch.randn(11, 8), torch.randint(0, 11, (2, 5)))
    assert loss.dtype == torch.float32


def test_autocast_linear_cross_entropy_takes_the_fp32_weight_and_returns_its_gradient_in_fp32():
    """Under autocast the head's fp32 weight enters the op uncast (cast inside it), so its gradient is made in fp32
    and becomes .grad directly: no cast node between the weight and the loss, no half-precision gradient."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16, requires_grad=True)
    weight = torch.randn(37, 16, requires_grad=True)
    target = torch.randint(0, 37, (3, 7))
    target[0, :3] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = xtorch.ops.linear_cross_entropy(x, weight, target)
    assert [type(f[0]).__name__ for f in loss.grad_fn.next_functions if f[0] is not None].count("AccumulateGrad") == 1
    loss.backward()
    assert weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
    xr, wr = (t.detach().bfloat16().double().requires_grad_() for t in (x, weight))
    reference = F.cross_entropy((xr @ wr.t()).reshape(-1, 37), target.reshape(-1))
    reference.backward()
    torch.testing.assert_close(loss.double(), reference, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(weight.grad.double(), wr.grad, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=2e-2, atol=2e-3)


def _owns_its_memory(t: torch.Tensor) -> bool:
    return t._base is None and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def test_norm_parameter_gradients_do_not_keep_the_packed_backward_buffer_alive():
    """The norm backward ops pack [dx rows; dweight; dbias] in one buffer: a parameter's .grad must be a tensor of
    its own, not a row of that (rows x N) buffer kept alive until the next step (0.53 GiB in a Llama step)."""
    x, r = torch.randn(2, 9, 16, requires_grad=True), torch.randn(2, 9, 16, requires_grad=True)
    w, b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    calls = [
        lambda: xtorch.ops.rms_norm(x, (16,), w, 1e-6, casting="llama"),
        lambda: xtorch.ops.fused_layernorm(x, (16,), w, b, 1e-5),
        lambda: sum(t.sum() for t in xtorch.ops.add_rms_norm(x, r, w, 1e-6)),
        lambda: sum(t.sum() for t in xtorch.ops.add_layer_norm(x, r, w, b, 1e-5)),
    ]
    for call in calls:
        w.grad = b.grad = None
        call().sum().backward()
        for p in (w, b):
            assert p.grad is None or _owns_its_memory(p.grad)
        assert w.grad is not None


def test_unused_outputs_get_zero_gradients():
    q, k = torch.randn(2, 4, 5, 8, requires_grad=True), torch.randn(2, 2, 5, 8, requires_grad=True)
    cos, sin = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    xtorch.ops.rotary_embedding(q, k, cos, sin)[0].sum().backward()
    assert q.grad is not None and not k.grad.any()
    x, w = torch.randn(3, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    _, h = xtorch.ops.add_rms_norm(x, x.detach(), w)
    h.sum().backward()  # y unused: x's gradient is h's alone
    torch.testing.assert_close(x.grad, torch.ones(3, 8))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: xtorch.ops.swiglu(torch.randn(3, 8), torch.randn(3, 7)), "swiglu: argument 'up' expected shape"),
        (lambda: xtorch.ops.geglu(torch.randn(3, 8), approximate="fast"), "geglu: argument 'approximate'"),
        (lambda: xtorch.ops.rotary_embedding(torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 6), torch.randn(2, 5, 8),
                                             torch.randn(2, 5, 8)), "rotary_embedding: argument 'k'"),
        (lambda: xtorch.ops.rotary_embedding(torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8),
                                             torch.randn(2, 5, 8, requires_grad=True), torch.randn(2, 5, 8)),
         "rotary_embedding: argument 'cos' expected a tensor that does not require grad"),
        (lambda: xtorch.ops.linear(torch.randn(3, 8), torch.randn(5, 7)), "linear: argument 'x'"),
        (lambda: xtorch.ops.linear(torch.randn(3, 8), torch.randn(5, 8), activation="tanh"), "argument 'activation'"),
        (lambda: xtorch.ops.linear_cross_entropy(torch.randn(2, 5, 8), torch.randn(11, 8), torch.zeros(2, 4).long()),
         "linear_cross_entropy: argument 'target' expected shape"),
        (lambda: xtorch.ops.linear_cross_entropy(torch.randn(2, 8), torch.randn(11, 8), torch.zeros(2).long(),
                                                 reduction="avg"), "argument 'reduction'"),
        (lambda: xtorch.ops.linear_cross_entropy(torch.randn(2, 8), torch.randn(11, 8).double(),
                                                 torch.zeros(2).long()), "linear_cross_entropy: argument 'weight'"),
        (lambda: xtorch.ops.rms_norm(torch.randn(3, 8), 8, casting="gemma"), "rms_norm: argument 'casting'"),
        (lambda: xtorch.ops.add_layer_norm(torch.randn(3, 8), torch.randn(3, 6)), "add_layer_norm: argument 'residual'"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_errors_naming_them(call, match):
    with pytest.raises(xrt.XpuRuntimeError, match=match):
        call()


def test_only_compiled_calls_take_fresh_workspaces(monkeypatch):
    """A custom op's body lends fresh workspaces (inductor's CUDA graph pools keep none of ours); the same body run
    eagerly lends them as any eager call does."""
    from xpuruntime.pytorch.router import get_dispatcher

    workspaces, fresh = get_dispatcher().workspaces, []
    per_call = workspaces.per_call
    monkeypatch.setattr(workspaces, "per_call", lambda: fresh.append(1) or per_call())
    gate, up = torch.randn(3, 8, requires_grad=True), torch.randn(3, 8)
    xtorch.ops.swiglu(gate, up).sum().backward()
    assert fresh == []
    torch.ops.xpuruntime.swiglu(gate.detach(), up, "")
    assert fresh == [1]


@pytest.mark.parametrize("activation", ["silu", "none", "tanh"])
@pytest.mark.parametrize("packed", [False, True])
def test_glu_backward_formula_is_autograds(activation, packed):
    """The fallback backward of swiglu / geglu (aten's activation backward kernels, traceable into graphs) equals
    autograd through the forward formula, packed [gate | up] or not."""
    from xpuruntime.pytorch.custom_ops import glu

    torch.manual_seed(3)
    gate = torch.randn(5, 14 if packed else 7, dtype=torch.float64)
    up = None if packed else torch.randn(5, 7, dtype=torch.float64)
    dy = torch.randn(5, 7, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (gate, up) if t is not None]
    expected = torch.autograd.grad(
        glu.formula(leaves[0], leaves[1] if up is not None else None, activation), leaves, dy
    )
    got = glu.formula_backward(dy, gate, up, activation)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
    if up is None:
        assert got[1] is None
    else:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-12, atol=1e-12)
