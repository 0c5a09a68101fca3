"""Kubelet APIs that devheal both serves (the lab's simulated kubelets) and consumes (the node agent).

Each API's package loads the modules that need its generated ``api_pb2`` code on first use
(``lazy_exports``): ``python -m devheal.kubelet.codegen`` imports the packages before that code exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, str], exported: list[str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` that import ``name`` from ``package.modules[name]`` when first
    asked for, and keep it in the package's ``namespace``."""

    def getattr_(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(exported))

    return getattr_, dir_
