"""IOBinding as onnxruntime has it: inputs and outputs bound to buffers once, then runs that move nothing through the
host. On the GPU, inputs bound on the device go straight to the runner (no host copy), and results are written into
outputs bound in advance (a device-to-device copy into the caller's buffer, no allocation) or kept on the device.

    binding = session.io_binding()
    binding.bind_input("x", "cuda", 0, np.float32, [8, 128], x_ptr)     # or bind_input("x", tensor)
    binding.bind_output("y", "cuda", 0, np.float32, [8, 10], y_ptr)     # or bind_output("y", "cuda"): allocated
    session.run_with_iobinding(binding)
    binding.copy_outputs_to_cpu()                                       # NumPy arrays
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ArgumentError

if TYPE_CHECKING:
    from .session import InferenceSession


class _CudaBuffer:
    """A device pointer described with __cuda_array_interface__, so PyTorch can view it without a copy."""

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": dtype.str, "data": (pointer, False), "version": 3}


def _view(device_type: str, device_id: int, element_type: Any, shape: Any, pointer: int) -> Any:
    """An array (CPU) or tensor (CUDA) over memory the caller owns."""
    dtype, dims = np.dtype(element_type), tuple(int(d) for d in shape)
    if device_type == "cpu":
        size = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        return np.frombuffer((ctypes.c_char * size).from_address(pointer), dtype).reshape(dims)
    if device_type == "cuda":
        import torch

        return torch.as_tensor(_CudaBuffer(pointer, dims, dtype), device=f"cuda:{device_id}")
    raise ArgumentError(f"IOBinding: device_type expected 'cpu' or 'cuda', got {device_type!r}")


class IOBinding:
    """Bound inputs and outputs of one session (see the module docstring)."""

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, tuple[str, Any]] = {}  # name -> (device type, bound buffer or None)
        self._results: list[Any] = []

    def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
        """Bind an input to a host array."""
        self._inputs[self._check(name, "input")] = np.asarray(array)

    def bind_input(self, name: str, device_type: Any, device_id: int = 0, element_type: Any = None,
                   shape: Any = None, buffer_ptr: int | None = None) -> None:  # fmt: skip
        """Bind an input: onnxruntime's (name, device_type, device_id, element_type, shape, buffer_ptr), or
        (name, array_or_tensor)."""
        name = self._check(name, "input")
        if not isinstance(device_type, str):  # an array or a tensor
            self._inputs[name] = device_type
            return
        if buffer_ptr is None or element_type is None or shape is None:
            raise ArgumentError(f"IOBinding.bind_input('{name}'): element_type, shape and buffer_ptr are required")
        self._inputs[name] = _view(device_type, device_id, element_type, shape, buffer_ptr)

    def bind_output(self, name: str, device_type: Any = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Any = None, buffer_ptr: int | None = None) -> None:  # fmt: skip
        """Bind an output to a buffer of the caller (element_type, shape, buffer_ptr, or an array or tensor as
        `device_type`), or to a device ('cpu', 'cuda') where the session leaves the result."""
        name = self._check(name, "output")
        if not isinstance(device_type, str):
            buffer = device_type
            self._outputs[name] = ("cpu" if isinstance(buffer, np.ndarray) else str(buffer.device.type), buffer)
        elif buffer_ptr is not None:
            if element_type is None or shape is None:
                raise ArgumentError(f"IOBinding.bind_output('{name}'): element_type and shape come with buffer_ptr")
            self._outputs[name] = (device_type, _view(device_type, device_id, element_type, shape, buffer_ptr))
        elif device_type in ("cpu", "cuda"):
            self._outputs[name] = (device_type, None)
        else:
            raise ArgumentError(f"IOBinding.bind_output('{name}'): device_type expected 'cpu' or 'cuda'")

    def clear_binding_inputs(self) -> None:
        """Forget every bound input."""
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        """Forget every bound output."""
        self._outputs.clear()

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound inputs are read on the caller's stream."""

    def synchronize_outputs(self) -> None:
        """Wait for the device work that writes the outputs."""
        if any(device == "cuda" for device, _ in self._outputs.values()):
            import torch

            torch.cuda.synchronize()

    def run(self, run_options: Any = None) -> None:
        """Run the session on the bound inputs (called by InferenceSession.run_with_iobinding)."""
        names = list(self._outputs) or [v.name for v in self._session.get_outputs()]
        results = self._session.run(names, self._inputs, run_options)
        self._results = []
        for name, result in zip(names, results):
            device, buffer = self._outputs.get(name, ("", None))
            if buffer is not None:
                if tuple(buffer.shape) != tuple(result.shape):
                    raise ArgumentError(f"IOBinding: output '{name}' is bound to shape {tuple(buffer.shape)}, "
                                        f"the run made {tuple(result.shape)}")  # fmt: skip
                buffer[...] = result if device != "cpu" or isinstance(result, np.ndarray) else result.cpu().numpy()
                result = buffer
            elif device == "cpu" and not isinstance(result, np.ndarray):
                result = result.cpu().numpy()
            elif device == "cuda" and isinstance(result, np.ndarray):
                import torch

                result = torch.from_numpy(result).cuda()
            self._results.append(result)

    def get_outputs(self) -> list[Any]:
        """The last run's outputs: the bound buffers, or arrays / tensors where the session left them."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """The last run's outputs as host arrays."""
        return [r if isinstance(r, np.ndarray) else r.detach().cpu().numpy() for r in self._results]

    def _check(self, name: str, kind: str) -> str:
        known = [v.name for v in (self._session.get_inputs() if kind == "input" else self._session.get_outputs())]
        if name not in known and not (kind == "input" and name in self._session.original.initializers):
            raise ArgumentError(f"IOBinding: unknown {kind} '{name}'; the model's {kind}s are {known}")
        return name
