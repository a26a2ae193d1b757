"""Test helpers for the Triton backend. The same tests run two ways:

- on a CUDA machine: CUDA tensors at full size, the Triton kernels compiled for the GPU;
- elsewhere: in a subprocess with TRITON_INTERPRET=1 (the backend then serves NumPy arrays on the CPU
  through Triton's interpreter), on tiny shapes. The parent process only starts that subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import xpuruntime as xrt  # noqa: E402  (after the skips: without torch and triton nothing here runs)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ON_GPU = not INTERPRET and torch.cuda.is_available()
ACTIVE = INTERPRET or ON_GPU  # the kernel tests run in this process

kernel_test = pytest.mark.skipif(
    not ACTIVE, reason="no CUDA device: these tests run in the TRITON_INTERPRET=1 subprocess instead"
)

DTYPES = ["float32", "float16", *(["bfloat16"] if ON_GPU else [])]
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
POLICY_ALL = dict(
    sin_affine="triton", sum="triton", softmax="triton", layer_norm="triton", rms_norm="triton",
    layer_norm_backward="triton", rms_norm_backward="triton",
)  # fmt: skip


def strict(**prefs: str) -> Any:
    """A strict policy scope: the named kernels run, or the call raises (never a quiet fallback)."""
    return xrt.kernel_policy(strict=True, **prefs)


def size(gpu: Any, interpreter: Any) -> Any:
    """Full size on the GPU, tiny under the interpreter."""
    return gpu if ON_GPU else interpreter


def make(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, view: Callable | None = None,
         scale: float = 1.0, shift: float = 0.0) -> Any:  # fmt: skip
    """Random data (never zeros) on the test device, optionally as a view (strided, offset...)."""
    base = rng.standard_normal(shape) * scale + shift
    if ON_GPU:
        array = torch.tensor(base, dtype=TORCH_DTYPES[dtype], device="cuda")
    else:
        array = base.astype(dtype)
    return view(array) if view is not None else array


def f64(x: Any) -> Any:
    """float64 NumPy copy (numbers pass through)."""
    if isinstance(x, float | int):
        return x
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, np.float64)


def poisoned(shape: tuple[int, ...], dtype: str) -> Any:
    """An output buffer filled with NaN, so elements a kernel fails to write show up."""
    if ON_GPU:
        return torch.full(shape, float("nan"), dtype=TORCH_DTYPES[dtype], device="cuda")
    return np.full(shape, np.nan, dtype)


def assert_close(out: Any, ref: np.ndarray, dtype: str, tol: float | None = None) -> None:
    """max |out - ref| / max |ref| within the dtype's tolerance; NaN only where the reference has NaN."""
    got = f64(out)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if ref.size == 0:
        return
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"NaN at {np.argwhere(np.isnan(got) != np.isnan(ref))[:5]}"
    finite = ~np.isnan(ref)
    scale = max(float(np.abs(ref[finite]).max(initial=0.0)), 1e-30)
    err = float(np.abs(got[finite] - ref[finite]).max(initial=0.0)) / scale
    assert err <= (tol or TOL[dtype]), f"relative error {err:.3e} > {tol or TOL[dtype]:.1e} ({dtype})"


def rerun_under_interpreter(test_file: str) -> None:
    """Run `test_file`'s kernel tests in a child process with TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"interpreter run failed:\n{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout, proc.stdout[-2000:]
