"""Execution providers as onnxruntime takes them: names, or (name, options) tuples, in order of preference.

Unknown names are dropped with a warning naming the closest known one; a provider this machine cannot run (CUDA
without a CUDA device) is dropped with a warning, and the session runs on the next one, as onnxruntime does. The CPU
provider is always the last fallback. CUDAExecutionProvider's `device_id` option picks the device.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ArgumentError

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
KNOWN = (CUDA, CPU)


class ProviderFallbackWarning(UserWarning):
    """A provider asked for cannot be used here; the session runs on the next one."""


def cuda_available() -> bool:
    """Whether a CUDA device can run the GPU path (PyTorch with CUDA)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def get_available_providers() -> list[str]:
    """The providers this machine can run, best first (onnxruntime.get_available_providers())."""
    return [CUDA, CPU] if cuda_available() else [CPU]


def _entries(providers: Sequence[Any], provider_options: Sequence[Mapping] | None) -> list[tuple[str, dict]]:
    if isinstance(providers, str) or not isinstance(providers, Sequence):
        raise ArgumentError(
            f"InferenceSession: 'providers' expected a list of names or (name, options), got {providers!r}"
        )
    if provider_options is not None and len(provider_options) != len(providers):
        raise ArgumentError(
            f"InferenceSession: 'provider_options' has {len(provider_options)} entries for {len(providers)} providers"
        )
    entries = []
    for index, entry in enumerate(providers):
        name, options = (entry, {}) if isinstance(entry, str) else (None, None)
        if isinstance(entry, tuple) and len(entry) == 2:
            name, options = entry
        if not isinstance(name, str) or not isinstance(options, Mapping):
            raise ArgumentError(f"InferenceSession: providers[{index}] expected a name or (name, dict), got {entry!r}")
        extra = provider_options[index] if provider_options is not None else {}
        entries.append((name, {**dict(options), **dict(extra)}))
    return entries


def resolve(
    providers: Sequence[Any] | None, provider_options: Sequence[Mapping] | None, device: str | None, quiet: bool
) -> tuple[str, list[tuple[str, dict]]]:
    """(device, [(provider, options)] in use) for the session's arguments; `device` is ours ('cpu', 'cuda[:N]')
    and wins when given; otherwise the first usable provider decides."""
    if providers is None:
        device = device or "cpu"
        name = CPU if device == "cpu" else CUDA
        return device, [(name, {})] + ([(CPU, {})] if name != CPU else [])
    used: list[tuple[str, dict]] = []
    for name, options in _entries(providers, provider_options):
        if name not in KNOWN:
            close = difflib.get_close_matches(name, KNOWN, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            _warn(quiet, f"provider '{name}' is unknown; {hint}known providers: {', '.join(KNOWN)}")
        elif name == CUDA and not cuda_available():
            _warn(quiet, f"{CUDA} is not available on this machine (no CUDA device); falling back to {CPU}")
        elif name not in (n for n, _ in used):
            used.append((name, {str(k): str(v) for k, v in options.items()}))
    if CPU not in (n for n, _ in used):
        used.append((CPU, {}))
    if device is None:
        first, options = used[0]
        device = "cpu" if first == CPU else f"cuda:{int(options.get('device_id', 0))}"
    return device, used


def _warn(quiet: bool, message: str) -> None:
    if not quiet:
        warnings.warn(message, ProviderFallbackWarning, stacklevel=4)
