"""Backends: one package per kernel family. Each exposes BACKEND (a registry.Backend) and KERNELS."""
