"""KernelPolicy: the user's say in which kernel runs.

Precedence, highest first: a scoped `kernel_policy(...)` block (per thread and per asyncio task, via
contextvars), the global `set_kernel_policy(...)`, the environment (`XPURUNTIME_POLICY`,
`XPURUNTIME_POLICY_FILE`), and the empty policy (automatic selection everywhere).
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import itertools
import json
import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from .abi import MathMode, SyncPolicy
from .errors import FileError, PolicyError, UnknownOpError, XpuRuntimeError, clip, cut, unknown_name
from .files import read_bytes

if TYPE_CHECKING:
    from .registry import Registry

ENV_POLICY = "XPURUNTIME_POLICY"
ENV_POLICY_FILE = "XPURUNTIME_POLICY_FILE"
AUTO = "auto"  # a preference of "auto" means: no preference for this op
AUTOTUNE = "autotune"  # a preference of "autotune": time the supported kernels once per call signature
_OPTIONS = ("strict", "math_mode", "deterministic", "sync", "autotune")
MAX_NESTING = 32  # deeper policy files are refused before the parser recurses into them
MAX_POLICY_FILE_BYTES = 1 << 20  # a policy is a few lines: anything this large is not one


class Fingerprint:
    """Identity of a policy's content: equal content shares one object while any policy or plan-cache
    key holds it; it is forgotten (never reused) once nothing does, so the table stays bounded."""

    __slots__ = ("__weakref__", "serial")

    def __init__(self, serial: int) -> None:
        self.serial = serial

    def __repr__(self) -> str:
        return f"Fingerprint({self.serial})"


_fingerprints: weakref.WeakValueDictionary[tuple, Fingerprint] = weakref.WeakValueDictionary()
_serials = itertools.count()
_fingerprint_lock = threading.Lock()


def _intern(key: tuple) -> Fingerprint:
    """The fingerprint of a policy content: cheap to hash and compare inside plan-cache keys."""
    with _fingerprint_lock:
        fingerprint = _fingerprints.get(key)
        if fingerprint is None:
            fingerprint = _fingerprints[key] = Fingerprint(next(_serials))
        return fingerprint


def _check_keys(prefs: Mapping[Any, Any]) -> None:
    """Op names are strings, and a name that looks like a misspelt option is not taken for an op."""
    for op in prefs:
        if not isinstance(op, str) or not op:
            raise PolicyError(f"policy keys must be op or option names (non-empty strings), got {clip(op)}")
        if _looks_like_an_option(op):
            raise unknown_name(PolicyError, "policy option", op, _OPTIONS)


@functools.lru_cache(maxsize=1024)
def _looks_like_an_option(name: str) -> bool:
    """A name close to, but not, an option name: a misspelt option rather than an op (cached: policies
    are built per call in some code)."""
    return name not in _OPTIONS and bool(difflib.get_close_matches(name.lower(), _OPTIONS, n=1, cutoff=0.75))


def _check_names(prefs: Mapping[str, str], registry: Registry | None, kernels: bool = True) -> None:
    """Unknown op names raise UnknownOpError (suggesting ops and options), unknown kernel names
    UnknownKernelError, each with the closest known name."""
    from .registry import default_registry

    registry = registry or default_registry()
    for op, name in prefs.items():
        if op in _OPTIONS:
            raise PolicyError(f"'{op}' is a policy option, not an op: pass it as an option ({op}=...)")
        if op not in registry.ops:
            raise unknown_name(UnknownOpError, "op or policy option", op, [*registry.ops, *_OPTIONS])
        if kernels and name not in (AUTO, AUTOTUNE):
            registry.kernel(op, name)


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    text = value.strip().lower() if isinstance(value, str) else ""
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise PolicyError(f"policy option '{name}' expects true/false, got {clip(value)}")


class KernelPolicy:
    """Preferred kernel per op, plus strictness, math mode, determinism and sync behaviour.

    >>> KernelPolicy(matmul="cublasLt", attention="flash_v2", strict=False)

    A preferred kernel that supports a call wins (reason "policy"). One that does not gives a warning
    (once per call signature) and automatic selection (reason "fallback"), or in strict mode an
    `UnsupportedByPolicyError` listing every candidate's reasons. Op and kernel names are checked
    against the default registry when the policy is built (`validate=some_registry` checks another
    one, `validate=False` none); the selector checks them again at dispatch.
    """

    __slots__ = (
        "autotune", "autotune_ops", "deterministic", "fingerprint", "math_mode", "preferences", "source", "strict",
        "sync",
    )  # fmt: skip

    def __init__(
        self,
        preferences: Mapping[str, str] | None = None,
        *,
        strict: bool = False,
        math_mode: MathMode | str | None = None,
        deterministic: bool = False,
        sync: SyncPolicy | str = SyncPolicy.NO_SYNC,
        autotune: bool = False,
        validate: bool | Registry = True,
        source: str = "",
        **op_preferences: str,
    ) -> None:
        if preferences is not None and not isinstance(preferences, Mapping):
            raise PolicyError(f"policy preferences must be a mapping of op to kernel name, got {clip(preferences)}")
        prefs = {**(preferences or {}), **op_preferences}
        _check_keys(prefs)
        for op, name in prefs.items():
            if not isinstance(name, str) or not name:
                raise PolicyError(f"policy preference for '{op}' must be a kernel name, got {clip(name)}")
        prefs = {op: name for op, name in prefs.items() if name != AUTO}
        self.autotune_ops = frozenset(op for op, name in prefs.items() if name == AUTOTUNE)
        if not isinstance(validate, bool) and type(validate).__name__ != "Registry":
            raise PolicyError(f"KernelPolicy: argument 'validate' expected a bool or a Registry, got {clip(validate)}")
        if validate is not False:
            _check_names(prefs, None if validate is True else validate)
        prefs = {op: name for op, name in prefs.items() if name != AUTOTUNE}
        self.preferences: Mapping[str, str] = MappingProxyType(dict(sorted(prefs.items())))
        self.autotune = _parse_bool("autotune", autotune)
        self.strict = _parse_bool("strict", strict)
        self.math_mode = None if math_mode is None else MathMode.parse(math_mode)
        self.deterministic = _parse_bool("deterministic", deterministic)
        self.sync = SyncPolicy.parse(sync)
        self.source = source  # where the policy came from ("$XPURUNTIME_POLICY", a file), for messages
        self.fingerprint = _intern(self._content())  # equal for equal content; in every plan-cache key

    def _content(self) -> tuple:
        mode = self.math_mode.value if self.math_mode else None
        return (tuple(self.preferences.items()), self.strict, mode, self.deterministic, self.sync.value,
                self.autotune, tuple(sorted(self.autotune_ops)))  # fmt: skip

    def tunes(self, op: str) -> bool:
        """Whether calls of `op` pick their kernel by timing the candidates (reason "autotune")."""
        return self.autotune or op in self.autotune_ops

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelPolicy) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        parts = [f"{op}={name!r}" for op, name in self.preferences.items()]
        parts += [f"{op}={AUTOTUNE!r}" for op in sorted(self.autotune_ops)]
        if self.autotune:
            parts.append("autotune=True")
        if self.strict:
            parts.append("strict=True")
        if self.math_mode:
            parts.append(f"math_mode={self.math_mode.value!r}")
        if self.deterministic:
            parts.append("deterministic=True")
        if self.sync is not SyncPolicy.NO_SYNC:
            parts.append(f"sync={self.sync.value!r}")
        return f"KernelPolicy({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """The policy as a mapping `KernelPolicy.from_dict` reads back: op = kernel pairs and the options that differ
        from the defaults."""
        return {
            **self.preferences,
            **{op: AUTOTUNE for op in sorted(self.autotune_ops)},
            "autotune": self.autotune,
            "strict": self.strict,
            "math_mode": self.math_mode.value if self.math_mode else None,
            "deterministic": self.deterministic,
            "sync": self.sync.value,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "dict", validate: bool = True) -> KernelPolicy:
        """Options (strict, math_mode, deterministic, sync) and op=kernel pairs, flat or under 'preferences'."""
        if not isinstance(data, Mapping):
            raise PolicyError(f"{source}: expected a mapping of options and op=kernel pairs, got {clip(data)}")
        data = dict(data)
        prefs = data.pop("preferences", None)
        prefs = {} if prefs is None else prefs
        if not isinstance(prefs, Mapping):
            raise PolicyError(f"{source}: 'preferences' must be a mapping of op to kernel name, got {clip(prefs)}")
        prefs = dict(prefs)
        options = {k: data.pop(k) for k in _OPTIONS if k in data and data[k] is not None}
        data = {k: v for k, v in data.items() if k not in _OPTIONS}
        try:
            return cls({**prefs, **data}, **options, validate=validate, source=source)
        except XpuRuntimeError as exc:  # same error class, message says where the spec came from
            raise type(exc)(f"{source}: {exc}") from None

    @classmethod
    def from_string(cls, spec: str, source: str = "policy string", validate: bool = True) -> KernelPolicy:
        """Parse 'matmul=cublasLt,attention=flash_v2,strict=true'."""
        if not isinstance(spec, str):
            raise PolicyError(f"{source}: expected a string like 'matmul=blocked,strict=true', got {clip(spec)}")
        data: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise PolicyError(f"{source}: expected 'op=kernel' items separated by commas, got {clip(item)}")
            data[key.strip()] = value.strip()
        return cls.from_dict(data, source, validate)

    @classmethod
    def from_file(cls, path: str | os.PathLike, validate: bool = True) -> KernelPolicy:
        """Load a TOML (.toml, any case) or JSON (any other suffix) file with the keys `from_dict` takes; a
        regular file of at most MAX_POLICY_FILE_BYTES (a FIFO or a device is refused, not read)."""
        try:
            path = Path(path)
        except TypeError:
            raise PolicyError(f"policy file: expected a path, got {clip(path)}") from None
        try:
            text = read_bytes(path, "policy file", limit=MAX_POLICY_FILE_BYTES).decode("utf-8-sig")
        except FileError as exc:  # missing, unreadable, a FIFO or device, too large
            raise PolicyError(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise PolicyError(f"policy file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if _nesting(text) > MAX_NESTING:
            raise PolicyError(f"policy file {path} is nested more than {MAX_NESTING} levels deep")
        try:
            data = _toml().loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
        except (ValueError, RecursionError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
            raise PolicyError(f"policy file {path} is malformed: {cut(str(exc), 200)}") from None
        if not isinstance(data, dict):
            raise PolicyError(f"policy file {path}: expected a table/object at the top level")
        return cls.from_dict(data, f"policy file {path}", validate)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KernelPolicy | None:
        """The policy named by XPURUNTIME_POLICY (inline) or XPURUNTIME_POLICY_FILE, or None.

        Names are not checked against the registry here: the environment is read before user kernels
        are registered. A name still unknown when its op is dispatched raises then, with a suggestion.
        """
        environ = os.environ if environ is None else environ
        if environ.get(ENV_POLICY):
            return cls.from_string(environ[ENV_POLICY], f"${ENV_POLICY}", validate=False)
        if environ.get(ENV_POLICY_FILE):
            return cls.from_file(environ[ENV_POLICY_FILE], validate=False)
        return None


def _nesting(text: str) -> int:
    """How deep brackets nest in a JSON or TOML text (an upper bound: brackets inside strings count)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _toml() -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib


class _ProcessPolicy:
    """The process-wide policy: set_kernel_policy's, else the environment's, else the empty one.
    `resolved` caches that answer, so the dispatch hot path reads it with one attribute access."""

    __slots__ = ("explicit", "resolved")

    def __init__(self) -> None:
        self.explicit: KernelPolicy | None = None
        self.resolved: KernelPolicy | None = None


_EMPTY: KernelPolicy | None = None
_scoped: contextvars.ContextVar[KernelPolicy | None] = contextvars.ContextVar("xpuruntime_policy", default=None)
_process = _ProcessPolicy()
_process_lock = threading.RLock()
_environment: KernelPolicy | XpuRuntimeError | None = None
_environment_read = False


def as_policy(
    policy: KernelPolicy | str | Mapping | None, prefs: Mapping[str, Any] | None = None
) -> KernelPolicy | None:
    """A KernelPolicy from a policy, a spec string, a mapping or keyword preferences (None if none)."""
    if policy is None:
        return KernelPolicy(**prefs) if prefs else None
    if prefs:
        raise PolicyError("pass either a KernelPolicy or keyword preferences, not both")
    if isinstance(policy, KernelPolicy):
        return policy
    if isinstance(policy, str):
        return KernelPolicy.from_string(policy)
    if isinstance(policy, Mapping):
        return KernelPolicy.from_dict(policy)
    raise PolicyError(f"expected a KernelPolicy, a policy string, a mapping or None, got {clip(policy)}")


def environment_policy(reload: bool = False) -> KernelPolicy | None:
    """The policy from the environment, read once (or again with reload=True). A malformed one (bad
    syntax, unreadable file) raises the same error at every use until it is fixed."""
    global _environment, _environment_read
    if reload or not _environment_read:
        try:
            _environment = KernelPolicy.from_env()
            if _environment is not None:  # kernel names are checked at dispatch; op names now, tuned ones too
                ops = {**_environment.preferences, **dict.fromkeys(_environment.autotune_ops, AUTOTUNE)}
                _check_names(ops, None, kernels=False)
        except UnknownOpError as exc:
            _environment = type(exc)(f"{_environment.source}: {exc}")
        except XpuRuntimeError as exc:
            _environment = exc
        _environment_read = True
        _process.resolved = None
    if isinstance(_environment, XpuRuntimeError):
        raise _environment
    return _environment


def forget_environment() -> None:
    """Read XPURUNTIME_POLICY / XPURUNTIME_POLICY_FILE again at the next use (after changing os.environ)."""
    global _environment_read
    with _process_lock:
        _environment_read = False
        _process.resolved = None


def empty_policy() -> KernelPolicy:
    global _EMPTY
    if _EMPTY is None:
        _EMPTY = KernelPolicy(validate=False)
    return _EMPTY


def process_policy() -> KernelPolicy:
    """The policy outside any scoped block: global, else environment, else empty."""
    with _process_lock:  # serialized with set_kernel_policy, so a stale answer is never cached
        policy = _process.resolved
        if policy is None:  # a malformed environment raises here at every use, and is never cached
            policy = _process.resolved = _process.explicit or environment_policy() or empty_policy()
        return policy


def current_policy() -> KernelPolicy:
    """The policy in force here: scoped, else global, else environment, else empty (hot path)."""
    return _scoped.get() or _process.resolved or process_policy()


class PolicyListener(Protocol):
    """Told about every policy change (the PyTorch front end installs and removes aten overrides)."""

    def process_policy_changed(self) -> None: ...
    def scope_entered(self, policy: KernelPolicy) -> None: ...
    def scope_exited(self, policy: KernelPolicy) -> None: ...


_listeners: list[PolicyListener] = []


def add_policy_listener(listener: PolicyListener) -> None:
    """Hear every `set_kernel_policy` / `clear_kernel_policy` and every scoped block's entry and exit."""
    if listener not in _listeners:
        _listeners.append(listener)


def remove_policy_listener(listener: PolicyListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def set_kernel_policy(policy: KernelPolicy | str | Mapping | None = None, **prefs: Any) -> None:
    """Set the process-wide policy: `set_kernel_policy(matmul="cublasLt")`; no arguments clears it."""
    new = as_policy(policy, prefs)
    with _process_lock:
        _process.explicit, _process.resolved = new, None
    for listener in list(_listeners):
        listener.process_policy_changed()


def get_kernel_policy() -> KernelPolicy:
    """The policy in force in this thread / task."""
    return current_policy()


def clear_kernel_policy() -> None:
    """Drop the global policy; the environment's policy (if any) applies again."""
    set_kernel_policy(None)


@contextlib.contextmanager
def kernel_policy(policy: KernelPolicy | str | Mapping | None = None, **prefs: Any) -> Iterator[KernelPolicy]:
    """Scoped policy for this thread / asyncio task.

    `kernel_policy(matmul="blocked")` layers its preferences and options over the policy in force;
    `kernel_policy(KernelPolicy(...))` (or a spec string / mapping) replaces it for the block.
    """
    if policy is not None:
        scoped = as_policy(policy, prefs)
    else:
        outer = current_policy()
        options = {k: prefs.pop(k) for k in _OPTIONS if k in prefs}
        _check_keys(prefs)
        _check_names(prefs, None)  # only the new preferences: the outer policy was checked when made
        scoped = KernelPolicy(
            {**dict.fromkeys(outer.autotune_ops, AUTOTUNE), **outer.preferences, **prefs},
            strict=options.get("strict", outer.strict),
            math_mode=options.get("math_mode", outer.math_mode),
            deterministic=options.get("deterministic", outer.deterministic),
            sync=options.get("sync", outer.sync),
            autotune=options.get("autotune", outer.autotune),
            validate=False,
        )
    token = _scoped.set(scoped)
    entered: list[PolicyListener] = []
    try:
        for listener in list(_listeners):
            listener.scope_entered(scoped)
            entered.append(listener)
        yield scoped
    finally:
        for listener in reversed(entered):
            listener.scope_exited(scoped)
        _scoped.reset(token)
