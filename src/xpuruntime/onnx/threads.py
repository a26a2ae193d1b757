"""Thread pools sized as SessionOptions say while a session runs: the BLAS library's (through threadpoolctl) and
PyTorch's intra-op pool for `intra_op_num_threads`, PyTorch's inter-op pool for `inter_op_num_threads`."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any


class ThreadLimits:
    """A context manager for each run; with both options 0 it does nothing."""

    def __init__(self, intra: int, inter: int) -> None:
        self.intra = intra
        self._blas: Any = None
        if intra:
            from threadpoolctl import ThreadpoolController

            self._blas = ThreadpoolController().select(user_api="blas")  # found once: a lookup costs milliseconds
        if inter:
            _set_interop(inter)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if not self.intra:
            yield
            return
        torch = sys.modules.get("torch")  # PyTorch's pool matters only where PyTorch is already in use
        before = torch.get_num_threads() if torch is not None else None
        with self._blas.limit(limits=self.intra):
            if before is not None and before != self.intra:
                torch.set_num_threads(self.intra)
            try:
                yield
            finally:
                if before is not None and before != self.intra:
                    torch.set_num_threads(before)


def _set_interop(threads: int) -> None:
    torch = sys.modules.get("torch")
    if torch is None or torch.get_num_interop_threads() == threads:
        return
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError as exc:  # PyTorch allows it once, before any inter-op work
        warnings.warn(f"inter_op_num_threads={threads} not applied to PyTorch: {exc}", RuntimeWarning, stacklevel=3)
