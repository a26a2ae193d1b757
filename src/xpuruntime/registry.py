"""The kernel registry: a list of kernels and the conditions under which each can run.

The registry makes no decisions. It stores op schemas, backends and kernel declarations, and answers
"why can this kernel not run this call?" with reason strings (empty list = supported), in the manner
of xformers' `not_supported_reasons`. The selector decides.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import numbers
import pkgutil
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .abi import DTYPES, ArgPack, LaunchConfig
from .errors import RegistrationError, UnknownKernelError, UnknownNameError, UnknownOpError, clip, cut, unknown_name

if TYPE_CHECKING:
    from .context import DispatchContext
    from .schema import OpSchema

# A condition returns the reasons it fails: None, "" or [] when the kernel supports the call. It may look
# only at what the plan-cache key fixes (op, attributes, dtypes, shapes, strides, devices, policy): a
# decision is reused for every later call with the same key. (Pointer alignment is not in the key.)
Condition = Callable[["DispatchContext"], "str | Iterable[str] | None"]
LaunchFn = Callable[[ArgPack], Any]  # returns None, or its output when declared returns_output=True

BACKENDS_PACKAGE = "xpuruntime.backends"  # each subpackage is a backend: BACKEND in __init__, kernels in modules
OPS_PACKAGE = "xpuruntime.ops"  # each module's OpSchema objects are ops

RESERVED_KERNEL_NAMES = frozenset({"auto", "autotune"})  # policy values that name no kernel
_FORBIDDEN_IN_NAMES = ",=/ \t\n"  # policy strings split on ',' and '='; qualified names use '/'

EmptyFn = Callable[[tuple[int, ...], str, str, Any], Any]  # (shape, dtype, device, stream) -> array


def no_stream(device: str) -> None:
    return None


def _nothing_to_wait_for(device: str, stream: Any) -> None:
    return None


@dataclass(frozen=True)
class Backend:
    """A family of kernels sharing a device type and a dependency (NumPy, Triton, nvmath, ...).

    `probe` returns why the backend cannot run here (None when it can); it runs once, lazily.
    `empty(shape, dtype, device, stream)` allocates outputs and workspaces for use on `stream`;
    `current_stream(device)` is the stream a launch uses (the caller's current one; None on the CPU);
    `synchronize(device, stream)` backs SyncPolicy.FULL_SYNC and `record_event(device, stream)`
    SyncPolicy.EVENT_RECORD (None: the backend cannot record events, so that policy is rejected).
    An `ambient_stream` backend's kernels and allocations follow the framework's current stream by
    themselves (PyTorch ops, Triton launches): its launches skip the stream lookup (ArgPack.stream is
    None) unless the plan lends a workspace or syncs. An `explicit_only` backend's kernels are
    candidates only where the policy names them.
    """

    name: str
    device_type: str
    empty: EmptyFn
    probe: Callable[[], str | None] = lambda: None
    current_stream: Callable[[str], Any] = no_stream
    synchronize: Callable[[str, Any], None] = _nothing_to_wait_for
    record_event: Callable[[str, Any], Any] | None = None
    ambient_stream: bool = False
    explicit_only: bool = False
    doc: str = ""

    @functools.cached_property
    def unavailable_reason(self) -> str | None:
        try:
            return self.probe()
        except Exception as exc:  # a probe that crashes means "unavailable", never a crash here
            return f"probe failed: {exc!r}"


def _default_launch_config(ctx: DispatchContext) -> LaunchConfig:
    return LaunchConfig()


def _no_workspace(ctx: DispatchContext) -> int:
    return 0


@dataclass(frozen=True)
class KernelSpec:
    """One kernel, declared once: what it computes, where it can run, how to launch it."""

    op: str
    name: str
    backend: str
    launch: LaunchFn
    dtypes: frozenset[str] | None = None  # the call's dtype (first tensor's; schemas tie the others to it)
    conditions: tuple[Condition, ...] = ()
    priority: int = 0
    fused: bool = False
    tensor_cores: bool = False
    deterministic: bool = True
    min_compute_capability: tuple[int, int] | None = None
    launch_config: Callable[[DispatchContext], LaunchConfig] = _default_launch_config
    workspace_bytes: Callable[[DispatchContext], int] = _no_workspace
    # True: called with args.out None (the caller gave no out=), the kernel allocates and returns its output
    # (e.g. a library call that returns fresh tensors), so nothing is allocated for it or copied; given an
    # out=, it writes into it as every kernel does
    returns_output: bool = False
    # True: the launch uses PyTorch operations and `backends.triton.common.launch` only (no host reads of tensor
    # data, no library handles, no stream of its own), so torch.compile can trace it into a graph
    # (runtime.traced: inductor then launches its Triton kernels from the code it generates)
    traceable: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def qualified_name(self) -> str:
        """'op/name', how messages name the kernel."""
        return f"{self.op}/{self.name}"

    def not_supported_reasons(self, ctx: DispatchContext) -> list[str]:
        """Every reason this kernel cannot run `ctx`, from its declared limits and its conditions."""
        reasons = []
        if self.dtypes is not None and ctx.tensors and ctx.dtype not in self.dtypes:
            reasons.append(f"dtype {ctx.dtype} not in {{{', '.join(sorted(self.dtypes))}}}")
        if self.min_compute_capability is not None:
            cc = ctx.compute_capability
            if cc is None or cc < self.min_compute_capability:
                have = "no compute capability" if cc is None else _sm(cc)
                reasons.append(f"needs {_sm(self.min_compute_capability)}+, device has {have}")
        if ctx.deterministic and not self.deterministic:
            reasons.append("not deterministic (policy asks for deterministic=True)")
        for condition in self.conditions:
            reasons.extend(_ask(condition, ctx))
        return reasons


def _ask(condition: Condition, ctx: DispatchContext) -> list[str]:
    """A condition's reasons. A condition that raises or answers something other than reason strings
    rejects its kernel with a reason saying so, instead of breaking every call of the op."""
    name = getattr(condition, "__name__", repr(condition))
    try:
        answer = condition(ctx)
    except Exception as exc:
        return [f"condition {name} raised {exc!r}"]
    if not answer:
        return []
    if isinstance(answer, str):
        return [answer]
    if isinstance(answer, list | tuple) and all(isinstance(a, str) for a in answer):
        return list(answer)
    return [f"condition {name} answered {answer!r}; expected None, a reason string or a list of them"]


def _bad(spec: KernelSpec, field_name: str, expected: str, got: Any) -> RegistrationError:
    return RegistrationError(
        f"kernel {clip(spec.op, 60)}/{clip(spec.name, 60)}: field '{field_name}' expected {expected}, got {clip(got)}"
    )


def _validate(spec: KernelSpec) -> None:
    """Refuse a declaration that would break every call of its op later, naming the field at fault."""
    for field_name in ("op", "name", "backend"):
        value = getattr(spec, field_name)
        if not isinstance(value, str) or not value or any(c in _FORBIDDEN_IN_NAMES for c in value):
            raise _bad(spec, field_name, f"a non-empty name without any of {_FORBIDDEN_IN_NAMES!r}", value)
    if spec.name.lower() in RESERVED_KERNEL_NAMES:
        raise _bad(spec, "name", f"a name other than the reserved policy values {sorted(RESERVED_KERNEL_NAMES)}",
                   spec.name)  # fmt: skip
    for field_name in ("launch", "launch_config", "workspace_bytes"):
        if not callable(getattr(spec, field_name)):
            raise _bad(spec, field_name, "a callable", getattr(spec, field_name))
    if spec.dtypes is not None and (
        not isinstance(spec.dtypes, frozenset) or not all(isinstance(d, str) and d for d in spec.dtypes)
    ):
        raise _bad(spec, "dtypes", "None or a set of dtype names like {'float32', 'float16'}", spec.dtypes)
    for dtype in sorted(spec.dtypes or ()):
        if dtype not in DTYPES:  # a misspelt dtype would make the kernel silently never run
            raise unknown_name(RegistrationError, "dtype", dtype, DTYPES, where=f" in field 'dtypes' of kernel "
                               f"{_label(spec.op, spec.name)}")  # fmt: skip
    if not isinstance(spec.conditions, tuple) or not all(callable(c) for c in spec.conditions):
        raise _bad(spec, "conditions", "a tuple of callables, like conditions=(my_condition,)", spec.conditions)
    priority = spec.priority
    if not isinstance(priority, numbers.Real) or isinstance(priority, bool) or priority != priority:
        raise _bad(spec, "priority", "a number", priority)
    for field_name in ("fused", "tensor_cores", "deterministic", "returns_output", "traceable"):
        if not isinstance(getattr(spec, field_name), bool):
            raise _bad(spec, field_name, "True or False", getattr(spec, field_name))
    cc = spec.min_compute_capability
    if cc is not None and not (
        isinstance(cc, tuple) and len(cc) == 2 and all(type(v) is int and v >= 0 for v in cc)
    ):  # fmt: skip
        raise _bad(spec, "min_compute_capability", "None or a (major, minor) tuple of ints, like (8, 0)", cc)
    if not isinstance(spec.doc, str):
        raise _bad(spec, "doc", "a string", spec.doc)


def _sm(cc: tuple[int, int]) -> str:
    return f"sm{cc[0]}{cc[1]}"


def _label(op: Any, name: Any) -> str:
    """'op/name' for errors about a kernel being declared, whatever op and name turn out to be."""
    return "/".join(cut(x, 60) if isinstance(x, str) else clip(x, 60) for x in (op, name))


def first_paragraph(doc: Any) -> str:
    """A docstring's first paragraph on one line: what `xpuruntime kernels` shows for a kernel (whole
    sentences, never a first line cut mid-sentence)."""
    text = doc.strip() if isinstance(doc, str) else ""
    return " ".join(text.split("\n\n")[0].split())


def kernel(op: str, name: str, *, backend: str, **hints: Any) -> Callable[[LaunchFn], KernelSpec]:
    """Decorator declaring a launch function as a kernel; register the result with a Registry."""

    known = {f.name for f in dataclasses.fields(KernelSpec)} - {"op", "name", "backend", "launch"}
    for hint in hints:
        if hint not in known:
            raise unknown_name(RegistrationError, "hint", hint, known, where=f" for kernel '{_label(op, name)}'")

    dtypes = hints.get("dtypes")
    if dtypes is not None and not isinstance(dtypes, str | bytes):  # a str stays a str and is refused
        try:
            hints["dtypes"] = frozenset(dtypes)
        except Exception:  # not iterable, unhashable items, or an iterator that raises
            raise RegistrationError(
                f"kernel {clip(op, 60)}/{clip(name, 60)}: field 'dtypes' expected a collection of "
                f"dtype names, got {type(dtypes).__name__}"
            ) from None
    if isinstance(hints.get("conditions"), list):
        hints["conditions"] = tuple(hints["conditions"])

    def declare(launch: LaunchFn) -> KernelSpec:
        spec_hints = {"doc": first_paragraph(getattr(launch, "__doc__", None)), **hints}
        return KernelSpec(op=op, name=name, backend=backend, launch=launch, **spec_hints)

    return declare


@dataclass
class Registry:
    """Op schemas, backends and kernels. Listeners hear the op name whenever that op's kernels change."""

    ops: dict[str, OpSchema] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    kernels: dict[str, dict[str, KernelSpec]] = field(default_factory=dict)
    missing_backends: dict[str, str] = field(default_factory=dict)  # module -> why it did not load
    generation: int = 0  # bumped on every kernel change; a plan made across a change is not cached
    _listeners: list[Callable[[], Callable[[str], None] | None]] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def register_op(self, schema: OpSchema) -> OpSchema:
        """Add an op's schema; registering a name twice is a RegistrationError."""
        with self._lock:
            if schema.name in self.ops:
                raise RegistrationError(f"op '{schema.name}' is already registered")
            self.ops[schema.name] = schema
            self.kernels[schema.name] = {}
        return schema

    def register_backend(self, backend: Backend) -> Backend:
        """Add a backend; registering a name twice is a RegistrationError."""
        with self._lock:
            if backend.name in self.backends:
                raise RegistrationError(f"backend '{backend.name}' is already registered")
            self.backends[backend.name] = backend
        return backend

    def register_kernel(self, spec: KernelSpec) -> KernelSpec:
        """Add a kernel; a second kernel with the same name for the same op is an error."""
        if not isinstance(spec, KernelSpec):
            raise RegistrationError(f"register_kernel: expected a KernelSpec (from @kernel(...)), got {clip(spec)}")
        with self._lock:
            table = self.kernels.get(spec.op)
            if table is None:
                raise unknown_name(UnknownOpError, "op", spec.op, self.ops)
            if spec.backend not in self.backends:
                raise unknown_name(UnknownNameError, "backend", spec.backend, self.backends)
            if spec.name in table:
                raise RegistrationError(f"{spec.op}: a kernel named '{spec.name}' is already registered")
            table[spec.name] = spec
            self._changed(spec.op)
        return spec

    def unregister_kernel(self, op: str, name: str) -> None:
        """Remove a kernel (plans that chose it are dropped); an unknown name is an error with suggestions."""
        with self._lock:
            self.kernel(op, name)
            del self.kernels[op][name]
            self._changed(op)

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call `listener(op)` after that op's kernels change. Bound methods are held weakly, so a
        Dispatcher that is dropped does not stay alive through its registry."""
        ref = weakref.WeakMethod(listener) if inspect.ismethod(listener) else (lambda: listener)
        with self._lock:  # drop the references of dropped listeners here too, not only on a change
            self._listeners = [r for r in self._listeners if r() is not None]
            self._listeners.append(ref)

    def _changed(self, op: str) -> None:
        self.generation += 1
        alive = [(ref, ref()) for ref in self._listeners]
        self._listeners = [ref for ref, listener in alive if listener is not None]
        for _, listener in alive:
            if listener is not None:
                listener(op)

    def op(self, name: str) -> OpSchema:
        """The schema of op `name`; an unknown name is an UnknownOpError listing the known ones."""
        schema = self.ops.get(name) if isinstance(name, str) else None
        if schema is None:
            raise unknown_name(UnknownOpError, "op", name, self.ops)
        return schema

    def kernels_for(self, op: str) -> list[KernelSpec]:
        """Every kernel registered for `op`, in registration order."""
        self.op(op)
        return list(self.kernels[op].values())

    def kernel(self, op: str, name: str) -> KernelSpec:
        """The kernel `name` of `op`; unknown names are errors with suggestions."""
        table = self.kernels.get(op) if isinstance(op, str) else None
        if table is None:
            raise unknown_name(UnknownOpError, "op", op, self.ops)
        try:
            if not isinstance(name, str):
                raise KeyError(name)
            return table[name]
        except KeyError:
            raise unknown_name(UnknownKernelError, "kernel", name, table, where=f" for op '{op}'") from None

    def not_supported_reasons(self, spec: KernelSpec, ctx: DispatchContext, preferred: str | None = None) -> list[str]:
        """Backend availability and device type first, then the kernel's own conditions. An explicit-only
        backend's kernel is a candidate only when it is the `preferred` one."""
        backend = self.backends[spec.backend]
        if backend.unavailable_reason:
            return [f"backend '{backend.name}' unavailable: {backend.unavailable_reason}"]
        if backend.explicit_only and spec.name != preferred:
            return [f"backend '{backend.name}' runs a kernel only where the policy names it ({backend.doc})"]
        device_type = ctx.device.split(":")[0]
        if device_type != backend.device_type:
            return [f"runs on {backend.device_type}, arguments are on {ctx.device}"]
        return spec.not_supported_reasons(ctx)

    def load_builtins(self) -> None:
        """Register every op module's schemas, then every backend package whose dependencies import."""
        for schema in _declared(_submodules(importlib.import_module(OPS_PACKAGE)), _op_schema_type()):
            self.register_op(schema)
        for info in sorted(pkgutil.iter_modules(importlib.import_module(BACKENDS_PACKAGE).__path__)):
            if info.ispkg:
                self.load_backend(f"{BACKENDS_PACKAGE}.{info.name}")

    def load_backend(self, package_name: str) -> None:
        """Register a backend package: BACKEND from its __init__, every KernelSpec in its modules.
        A package whose dependency is missing (ImportError) is recorded with the reason instead."""
        try:
            package = importlib.import_module(package_name)
            modules = _submodules(package)
        except ImportError as exc:
            self.missing_backends[package_name] = str(exc)
            return
        backend = getattr(package, "BACKEND", None)
        if not isinstance(backend, Backend):
            raise RegistrationError(f"backend package {package_name} defines no BACKEND = Backend(...)")
        self.register_backend(backend)
        for spec in _declared(modules, KernelSpec):
            self.register_kernel(spec)


def _submodules(package: Any) -> list[Any]:
    """The package's modules (not subpackages), imported, in name order."""
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.ispkg)
    return [importlib.import_module(f"{package.__name__}.{name}") for name in names]


def _declared(modules: list[Any], kind: type) -> list[Any]:
    """Module-level objects of `kind`, in module and definition order, each once (also when imported
    into a second module)."""
    found: dict[int, Any] = {}
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, kind):
                found.setdefault(id(value), value)
    return list(found.values())


def _op_schema_type() -> type:
    from .schema import OpSchema

    return OpSchema


_default: Registry | None = None
_default_ready = False
_default_lock = threading.RLock()


def default_registry() -> Registry:
    """The process-wide registry, with built-in ops and backends loaded on first use.

    While the built-ins load, other threads wait; the loading thread itself (a backend module that
    looks at the registry while it is imported) gets the registry as loaded so far instead of a deadlock.
    """
    global _default, _default_ready
    if _default_ready:
        return _default
    with _default_lock:
        if _default is None:
            _default = Registry()
            try:
                _default.load_builtins()
            except BaseException:
                _default = None
                raise
            _default_ready = True
    return _default


def register_kernel(op: str, name: str, *, backend: str, **hints: Any) -> Callable[[LaunchFn], KernelSpec]:
    """Decorator: declare a kernel and add it to the default registry (invalidating that op's plans)."""

    declare = kernel(op, name, backend=backend, **hints)  # bad hint names fail here, at the decorator line

    def declare_and_register(launch: LaunchFn) -> KernelSpec:
        return default_registry().register_kernel(declare(launch))

    return declare_and_register
