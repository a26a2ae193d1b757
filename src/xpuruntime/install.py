"""Install hints that work for how xpuruntime itself was installed.

From a source checkout (the usual way today) the hint installs the checkout again with the extra that brings
what is missing; otherwise it names the packages of that extra, as xpuruntime's own metadata lists them.
Arguments are in double quotes, which every shell takes (bash, zsh, fish, PowerShell, cmd).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]


def checkout() -> Path | None:
    """The source checkout this package runs from (src layout), or None for an installed copy."""
    pyproject = _CHECKOUT / "pyproject.toml"
    if pyproject.is_file() and (_CHECKOUT / "src" / "xpuruntime").is_dir():
        return _CHECKOUT
    return None


def extra_requirements(extra: str) -> list[str]:
    """The requirements of one of xpuruntime's extras, from its installed metadata ([] when unknown)."""
    try:
        requires = importlib.metadata.requires("xpuruntime") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    return [r.split(";")[0].strip() for r in requires if ";" in r and marker.search(r.split(";", 1)[1])]


def pip_hint(extra: str) -> str:
    """The pip command that installs xpuruntime's `extra` here, e.g. `pip install -e "/src/xpuruntime[torch]"`."""
    root = checkout()
    if root is not None:
        return f'pip install -e "{root}[{extra}]"'
    packages = extra_requirements(extra)
    if packages:
        return "pip install " + " ".join(f'"{p}"' for p in packages)
    return f'pip install "xpuruntime[{extra}]"'
