"""The generator of the kubelet APIs' gRPC bindings: cheap when current, a relative import, no devheal imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devheal.kubelet import codegen


def test_codegen_skips_current_outputs() -> None:
    codegen.generate()  # a no-op unless an api.proto or codegen.py changed since the last run
    assert codegen.is_up_to_date()
    assert codegen.generate() is False
    for api in codegen.APIS:
        assert "from . import api_pb2 as" in api.pb2_grpc.read_text()


def test_an_edited_proto_makes_only_its_own_outputs_stale(tmp_path: Path) -> None:
    codegen.generate()
    copy = codegen.Api(tmp_path)
    for path in (codegen.PODRESOURCES.proto, *codegen.PODRESOURCES.outputs()):
        shutil.copy2(path, tmp_path / path.name)
    assert copy.is_up_to_date()
    future = copy.pb2.stat().st_mtime + 60
    os.utime(copy.proto, (future, future))
    assert not copy.is_up_to_date()
    assert codegen.PODRESOURCES.is_up_to_date() and codegen.DEVICEPLUGIN.is_up_to_date()


@pytest.mark.parametrize(
    "line",
    [
        "from devheal.kubelet.podresources import api_pb2 as devheal_dot_api__pb2",
        "from devheal.kubelet.deviceplugin import api_pb2 as devheal_dot_kubelet_dot_deviceplugin_dot_api__pb2",
        "import api_pb2 as api__pb2",
    ],
)
def test_codegen_relativizes_the_pb2_import(line: str) -> None:
    alias = line.rsplit(" ", 1)[1]
    out = codegen.relativize_pb2_import(f"import grpc\n{line}\n")
    assert out == f"import grpc\nfrom . import api_pb2 as {alias}\n"


def test_package_import_does_not_need_generated_code() -> None:
    # codegen runs as ``python -m devheal.kubelet.codegen``, which imports the packages
    # first; that must work before any api_pb2 exists.
    probe = (
        "import sys, devheal.kubelet.podresources as p, devheal.kubelet.deviceplugin, devheal.kubelet.codegen;"
        "assert not [m for m in sys.modules if m.endswith(('api_pb2', 'api_pb2_grpc'))], sys.modules;"
        "assert p.PodResources"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_the_generator_imports_nothing_of_devheal() -> None:
    # The build hook loads it from its file in an environment without devheal's dependencies.
    probe = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('cg', {str(codegen.__file__)!r});"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module);"
        "assert module.is_up_to_date() in (True, False);"
        "assert not [m for m in sys.modules if m.startswith('devheal')], sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-I", "-c", probe], check=True)
