"""Build hook: generate the kubelet APIs' gRPC code (pod-resources, device plugin) before hatchling
packages the wheel.

The generated ``api_pb2*`` modules are git-ignored build outputs, so a clean clone or an
sdist has only the ``api.proto`` files. This hook runs the project's one generator
(``devheal.kubelet.codegen``, also what ``scripts/bootstrap`` runs), and the
wheel target's ``artifacts`` setting packages what it wrote. The generator is loaded from
its file, not imported as ``devheal...``: importing the package would need its runtime
dependencies, which a build environment does not have. It needs ``grpcio-tools``, a
build requirement in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

CODEGEN = Path("src/devheal/kubelet/codegen.py")


class KubeletCodegenHook(BuildHookInterface):
    """Generates ``api_pb2*.py(i)`` next to each ``api.proto`` (skipped when they are current)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        path = Path(self.root) / CODEGEN
        if not path.is_file():
            raise RuntimeError(f"build hook: the kubelet APIs' generator {path} is missing from the source tree")
        spec = importlib.util.spec_from_file_location("_devheal_kubelet_codegen", path)
        if spec is None or spec.loader is None:
            raise RuntimeError(f"build hook: cannot load {path} as a module")
        codegen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(codegen)
        try:
            wrote = codegen.generate()
        except ModuleNotFoundError as exc:
            raise RuntimeError(
                f"build hook: generating the kubelet APIs' gRPC code needs {exc.name!r}; "
                "build with build isolation, or install the build requirements of pyproject.toml first"
            ) from exc
        if wrote:
            self.app.display_info(f"generated {', '.join(str(p) for p in codegen.outputs())}")
