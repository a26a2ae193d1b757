"""The core works without PyTorch or Triton, and importing it is cheap."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(code: str, tmp_path, block_torch: bool) -> subprocess.CompletedProcess:
    env_path = []
    if block_torch:  # shadow torch and triton with packages whose import fails loudly
        for name in ("torch", "triton"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
        env_path.append(str(tmp_path))
    prelude = f"import sys; sys.path[:0] = {env_path!r}\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_core_runs_with_torch_and_triton_unimportable(tmp_path):
    result = run_python(
        """
        import numpy as np
        import xpuruntime as xrt
        from xpuruntime.cli import main
        a = np.ones((4, 4), np.float32)
        assert np.allclose(xrt.ops.matmul(a, a), 4)
        xrt.explain("attention", a, a, a, show=False)
        xrt.devices()
        assert main(["info"]) == 0 and main(["kernels"]) == 0
        assert "torch" not in sys.modules and "triton" not in sys.modules
        print("ok")
        """,
        tmp_path,
        block_torch=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")


def test_import_is_cheap(tmp_path):
    result = run_python(
        """
        import xpuruntime
        heavy = [m for m in ("numpy", "rich", "torch", "triton") if m in sys.modules]
        print(heavy)
        """,
        tmp_path,
        block_torch=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
