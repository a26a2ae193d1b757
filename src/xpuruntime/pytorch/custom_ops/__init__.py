"""torch.library custom ops in the `xpuruntime` namespace, one file per op family: each op's forward and
backward through the selector, with fake kernels for tracing and autograd formulas. The routes run their
bodies in eager mode and emit them into graphs that torch.compile traces; a new fused op costs one file
here (its forward and backward ops) and one line in `families` (see `norm.py` for the pattern)."""

from . import add_norm, attention, glu, linear, linear_cross_entropy, matmul, norm, rotary

__all__ = ["add_norm", "attention", "glu", "linear", "linear_cross_entropy", "matmul", "norm", "rotary"]
