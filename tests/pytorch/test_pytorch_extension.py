"""xpuruntime.pytorch without a GPU: the import guard, custom ops (opcheck, torch.compile), autocast,
profiling and the errors of the GPU-only pieces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch

_BLOCK_TORCH = textwrap.dedent(
    """
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}")
    sys.meta_path.insert(0, _NoTorch())
    """
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    environ = {**os.environ, "PYTHONPATH": os.path.abspath(src), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=120)


def test_import_without_torch_names_the_extra():
    code = _BLOCK_TORCH + textwrap.dedent(
        """
        import numpy as np
        import xpuruntime as xrt
        print(xrt.ops.matmul(np.ones((2, 3)), np.ones((3, 2))).sum())
        try:
            import xpuruntime.pytorch
        except ImportError as exc:
            print(type(exc).__name__ + ": " + str(exc))
        """
    )
    result = _python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "12.0"
    assert lines[1] == ("ImportError: xpuruntime.pytorch requires PyTorch. Install with: pip install xpuruntime[torch]")


def test_environment_policy_installs_overrides_at_import():
    code = "import xpuruntime.pytorch as t; print(sorted(t.installed_overrides()['matmul']))"
    result = _python(code, XPURUNTIME_POLICY="matmul=blocked")
    assert result.returncode == 0, result.stderr
    assert "mm@CUDA" in result.stdout and "addmm@CUDA" in result.stdout


def _attention_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(2, 3, 5, 8, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 3, 7, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 3, 7, 4, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention_matches_sdpa_forward_and_backward(causal):
    q, k, v = _attention_inputs()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    out = xtorch.ops.fused_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_fused_attention_with_mask_goes_through_the_selector():
    q, k, v = _attention_inputs()
    mask = torch.rand(5, 7) > 0.3
    mask[:, 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(xtorch.ops.fused_attention(q, k, v, attn_mask=mask), ref, rtol=1e-5, atol=1e-5)
    xrt.enable_dispatch_logging()
    xtorch.ops.fused_attention(q, k, v, attn_mask=mask)
    training = "attention_forward" in xrt.default_registry().ops
    assert [r.op_name for r in xrt.get_dispatch_logs()] == ["attention_forward" if training else "attention"]


def test_fused_attention_rejects_dropout():
    q, k, v = _attention_inputs()
    with pytest.raises(xrt.ArgumentError, match="dropout_p"):
        xtorch.ops.fused_attention(q, k, v, dropout_p=0.1)


def test_fused_layernorm_matches_layer_norm():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 10, requires_grad=True)
    w, b = torch.randn(10, requires_grad=True), torch.randn(10, requires_grad=True)
    ref = F.layer_norm(x, (10,), w, b, 1e-5)
    dy = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (x, w, b), dy)
    out = xtorch.ops.fused_layernorm(x, 10, w, b)
    grads = torch.autograd.grad(out, (x, w, b), dy)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    x2 = torch.randn(5, 6, requires_grad=True)
    (g2,) = torch.autograd.grad(xtorch.ops.fused_layernorm(x2, [6]).sum(), (x2,))
    torch.testing.assert_close(g2, torch.autograd.grad(F.layer_norm(x2, (6,)).sum(), (x2,))[0], atol=1e-5, rtol=1e-4)


def test_custom_ops_compile_fullgraph():
    torch._dynamo.reset()

    def block(x, w, b, q, k, v):
        y = xtorch.ops.fused_layernorm(x, [x.shape[-1]], w, b)
        return y.sum() + xtorch.ops.fused_attention(q, k, v, is_causal=True).sum()

    q, k, v = _attention_inputs()
    x = torch.randn(4, 8, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got = compiled(x, w, b, q, k, v)
    expected = block(x, w, b, q, k, v)
    torch.testing.assert_close(got, expected)
    grads = torch.autograd.grad(got, (x, q))
    ref = torch.autograd.grad(expected, (x, q))
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_custom_ops_under_autocast_take_the_autocast_dtype():
    q, k, v = _attention_inputs()
    with xtorch.autocast(dtype=torch.bfloat16, device_type="cpu"):
        out = xtorch.ops.fused_attention(q, k, v)
        y = xtorch.ops.fused_layernorm(torch.randn(3, 8), 8)
    assert out.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32


def test_autocast_sets_math_mode_and_restores():
    before = xrt.get_kernel_policy()
    with xtorch.autocast(dtype=torch.bfloat16, device_type="cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert xrt.get_kernel_policy().math_mode is xrt.MathMode.BF16
    with xtorch.autocast(dtype=torch.bfloat16, device_type="cpu", enabled=False):
        assert not torch.is_autocast_enabled("cpu")
        assert xrt.get_kernel_policy() is before
    assert xrt.get_kernel_policy() is before
    with pytest.raises(xrt.ArgumentError, match="dtype"), xtorch.autocast(dtype=torch.float32):
        pass


def test_profile_merges_dispatch_decisions(tmp_path):
    path = tmp_path / "trace.json"
    q, k, v = _attention_inputs()
    with xtorch.profile(export_chrome_trace=str(path)) as prof:
        xtorch.ops.fused_attention(q, k, v)
    assert prof.xpuruntime.ops, "xpuruntime's profiler saw no dispatch"
    trace = json.loads(path.read_text())
    names = [e.get("name", "") for e in trace["traceEvents"]]
    assert any(n.startswith("xrt::attention") and "(auto)" in n for n in names)
    assert any(str(e.get("pid", "")).startswith("xpuruntime") for e in trace["traceEvents"])
    assert (tmp_path / "trace.xpuruntime.json").exists()
    with (
        pytest.raises(xrt.ArgumentError, match="export_chrome_trace"),
        xtorch.profile(export_chrome_trace=str(tmp_path)),
    ):
        pass


def test_graph_and_allocator_errors_without_a_gpu():
    wrapper = xtorch.CUDAGraphWrapper()
    with pytest.raises(xrt.XpuRuntimeError, match="nothing captured"):
        wrapper.replay()
    assert xtorch.allocator_stats() == {"enabled": False}
    if not torch.cuda.is_available():
        with pytest.raises(xrt.XpuRuntimeError, match="CUDA"):
            xtorch.set_allocator()
        with pytest.raises(xrt.XpuRuntimeError, match="CUDA"):
            wrapper.capture(lambda: None)
    xtorch.reset_allocator()  # harmless when nothing was set
