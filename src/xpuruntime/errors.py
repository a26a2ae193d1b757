"""One exception hierarchy for everything the runtime rejects.

Every message names the op, the argument and what was expected, so a user can fix the call
without reading our source.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class XpuRuntimeError(Exception):
    """Base class of every error raised by xpuruntime."""


class ArgumentError(XpuRuntimeError, ValueError):
    """An argument has a value the op does not accept (conflicting flags, bad attribute)."""


class ShapeError(XpuRuntimeError, ValueError):
    """Shapes do not fit together (or an axis is out of range)."""


class DTypeError(XpuRuntimeError, TypeError):
    """An argument has a dtype the op does not accept."""


class LayoutError(XpuRuntimeError, ValueError):
    """Memory layout is not allowed, e.g. an output that overlaps an input."""


class DeviceMismatchError(XpuRuntimeError, ValueError):
    """Arguments of one call live on different devices."""


class UnknownNameError(XpuRuntimeError, LookupError):
    """An op, kernel or backend name that the registry does not know."""


class UnknownOpError(UnknownNameError):
    """No op of that name is registered."""


class UnknownKernelError(UnknownNameError):
    """No kernel of that name is registered for the op."""


class RegistrationError(XpuRuntimeError):
    """A kernel or op declaration is invalid (e.g. a duplicate name)."""


class PolicyError(XpuRuntimeError, ValueError):
    """A kernel policy spec (string, file, environment variable) is malformed."""


class NoKernelError(XpuRuntimeError):
    """No registered kernel supports the call; the message lists each kernel's reasons."""


class UnsupportedByPolicyError(NoKernelError):
    """Strict policy: the preferred kernel cannot run this call."""


class UnsupportedModelError(XpuRuntimeError, ValueError):
    """A model that `xpuruntime.pytorch.patch` cannot patch (an unknown architecture, a module that does not
    have the structure its architecture's patterns expect) or unpatch; nothing was changed."""


class LaunchError(XpuRuntimeError, RuntimeError):
    """A kernel failed while running; the message names op, kernel and launch config."""


class OutOfMemoryError(XpuRuntimeError, MemoryError):
    """A call's output or workspace cannot fit in its device's memory; the message names the op, the shape
    and the bytes. Raised when the plan is made, before anything is allocated."""


class FileError(XpuRuntimeError, OSError):
    """A file cannot be read as asked: missing, unreadable, not a regular file (a FIFO, a device, a folder),
    larger than its kind allows, or a link inside the cache folder."""


MAX_ECHO = 120  # characters of a user's value that a message repeats


def clip(value: object, limit: int = MAX_ECHO) -> str:
    """`repr(value)` cut to `limit` characters with the full length noted, so an error never echoes a
    100k-character argument."""
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__} object>"
    return cut(text, limit)


def cut(text: str, limit: int = MAX_ECHO) -> str:
    """`text` cut to `limit` characters, with the full length noted."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def argument_error(cls: type[XpuRuntimeError], op: str, arg: str, expected: str, got: object) -> XpuRuntimeError:
    """Build `cls` with the standard message `op: argument 'arg' expected ..., got ...`."""
    return cls(f"{op}: argument '{arg}' expected {expected}, got {cut(str(got))}")


def unknown_name(
    cls: type[XpuRuntimeError], what: str, name: str, known: Iterable[str], where: str = ""
) -> XpuRuntimeError:
    """Build an unknown-name error that lists the known names and suggests the closest one.

    `unknown_name(UnknownKernelError, "kernel", "blockd", [...], where=" for op 'matmul'")`
    -> "unknown kernel 'blockd' for op 'matmul'. Did you mean 'blocked'? Known: ..."
    """
    known = sorted(set(known))
    if not isinstance(name, str):
        return cls(f"{what} names are strings, got {clip(name)}{where}. Known: {', '.join(known) or '(none)'}")
    lowered = {k.lower(): k for k in known}  # case-insensitive: "cublaslt" -> "cublasLt"
    close = []
    if len(name) <= 2 * max(map(len, known), default=0):  # difflib is quadratic: no hint for huge names
        close = [lowered[m] for m in difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)]
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return cls(f"unknown {what} '{cut(name, 60)}'{where}.{hint} Known: {', '.join(known) or '(none)'}")


class KernelFallbackWarning(UserWarning):
    """The policy's preferred kernel cannot run a call; another kernel runs instead."""
