"""Backends: one package per kernel family. Each package's __init__ defines BACKEND (a registry.Backend);
every KernelSpec declared at module level in its modules is registered (registry.load_backend)."""
