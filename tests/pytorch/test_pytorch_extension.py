"""xpuruntime.pytorch without a GPU: the import guard, the environment policy, autocast, profiling and the
errors of the GPU-only pieces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

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
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
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
