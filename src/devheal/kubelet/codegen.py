"""Generate the Python gRPC bindings of the kubelet APIs devheal speaks from their ``api.proto`` files.

One ``api.proto`` per API package (``APIS``): ``podresources`` (kubelet's pod-resources v1, which
the agent reads and the lab's simulated kubelets serve) and ``deviceplugin`` (the device plugin
v1beta1 API, which the lab's device plugin speaks to a real kubelet). The generated modules are
build outputs (git-ignored): the bootstrap script runs ``python -m devheal.kubelet.codegen`` on
every checkout, so this must be cheap when nothing changed (it compares modification times and
exits) and must never leave a half-written module behind (it generates into a temporary
directory and renames the results into place). It deliberately does not import the modules it
produces: they may not exist yet, or may be stale. It imports nothing of devheal either: the
build hook (hatch_build.py) loads it from its file, in an environment without devheal's
dependencies.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

KUBELET_DIR = Path(__file__).resolve().parent
# protoc runs with the import root above the top-level package, so each file is registered in
# protobuf's process-wide descriptor pool as "devheal/kubelet/<api>/api.proto" rather than a bare
# "api.proto" that two APIs would collide on.
IMPORT_ROOT = KUBELET_DIR.parents[1]

# grpc_tools writes "from devheal.kubelet.podresources import api_pb2 as api__pb2"
# (or "import api_pb2 as api__pb2" with a flat import root); a relative import keeps
# the package importable wherever it is installed.
_PB2_IMPORT = re.compile(
    r"^(?:from\s+[\w.]+\s+import\s+api_pb2|import\s+(?:[\w.]+\.)?api_pb2)\s+as\s+(\w+)[ \t]*$",
    re.MULTILINE,
)


class CodegenError(RuntimeError):
    """protoc failed or produced something unexpected."""


class Api:
    """One API package: ``api.proto`` and the modules generated next to it.

    A plain class, not a dataclass: the build hook executes this file as a module that is not in
    ``sys.modules``, where ``@dataclass`` cannot resolve its annotations."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def proto(self) -> Path:
        return self.directory / "api.proto"

    @property
    def pb2(self) -> Path:
        return self.directory / "api_pb2.py"

    @property
    def pb2_stub(self) -> Path:
        return self.directory / "api_pb2.pyi"

    @property
    def pb2_grpc(self) -> Path:
        return self.directory / "api_pb2_grpc.py"

    @property
    def pb2_grpc_stub(self) -> Path:
        return self.directory / "api_pb2_grpc.pyi"

    def outputs(self) -> tuple[Path, ...]:
        """The files a run produces (the grpc stub only when mypy-protobuf is available)."""
        if _mypy_plugin() is not None:
            return (self.pb2, self.pb2_stub, self.pb2_grpc, self.pb2_grpc_stub)
        return (self.pb2, self.pb2_stub, self.pb2_grpc)

    def is_up_to_date(self) -> bool:
        """True when every output exists and is newer than the proto and this generator."""
        source_mtime = max(self.proto.stat().st_mtime_ns, Path(__file__).stat().st_mtime_ns)
        try:
            return all(path.stat().st_mtime_ns >= source_mtime for path in self.outputs())
        except FileNotFoundError:
            return False


PODRESOURCES = Api(KUBELET_DIR / "podresources")
DEVICEPLUGIN = Api(KUBELET_DIR / "deviceplugin")
APIS = (PODRESOURCES, DEVICEPLUGIN)


def _mypy_plugin() -> Path | None:
    """Return mypy-protobuf's protoc plugins' directory, if installed next to this Python."""
    bindir = Path(sys.executable).parent
    if (bindir / "protoc-gen-mypy").exists() and (bindir / "protoc-gen-mypy_grpc").exists():
        return bindir
    found = shutil.which("protoc-gen-mypy")
    if found and shutil.which("protoc-gen-mypy_grpc"):
        return Path(found).parent
    return None


def outputs() -> tuple[Path, ...]:
    """Every file a run produces, for every API."""
    return tuple(path for api in APIS for path in api.outputs())


def is_up_to_date() -> bool:
    return all(api.is_up_to_date() for api in APIS)


def relativize_pb2_import(text: str) -> str:
    """Rewrite the generated absolute import of ``api_pb2`` into a relative one."""
    new_text, count = _PB2_IMPORT.subn(r"from . import api_pb2 as \1", text)
    if count != 1:
        raise CodegenError(f"expected exactly one api_pb2 import in the generated grpc module, found {count}")
    return new_text


def _run_protoc(api: Api, out_dir: Path) -> None:
    # Imported here so that the up-to-date check (the common case) stays import-free.
    import importlib.resources

    from grpc_tools import protoc

    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={IMPORT_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ]
    plugin_dir = _mypy_plugin()
    if plugin_dir is not None:
        # mypy-protobuf's stubs are stricter than protoc's --pyi_out and also cover the
        # grpc module, so prefer them when they are installed.
        args += [
            f"--plugin=protoc-gen-mypy={plugin_dir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={plugin_dir / 'protoc-gen-mypy_grpc'}",
            f"--mypy_out=quiet:{out_dir}",
            f"--mypy_grpc_out=quiet:{out_dir}",
        ]
    else:
        args.append(f"--pyi_out={out_dir}")
    args.append(str(api.proto.relative_to(IMPORT_ROOT)))
    status = protoc.main(args)
    if status != 0:
        raise CodegenError(f"protoc exited with status {status} for {api.proto}")


def generate_api(api: Api, force: bool = False) -> bool:
    """Regenerate one API's bindings unless they are current; return whether anything was written."""
    if not force and api.is_up_to_date():
        return False
    with tempfile.TemporaryDirectory(prefix=".codegen-", dir=api.directory) as tmp:
        out_dir = Path(tmp)
        _run_protoc(api, out_dir)
        produced = out_dir / api.proto.relative_to(IMPORT_ROOT).parent
        for stub in (api.pb2_grpc, api.pb2_grpc_stub):
            path = produced / stub.name
            if path.exists():
                path.write_text(relativize_pb2_import(path.read_text()))
        targets = api.outputs()
        missing = [t.name for t in targets if not (produced / t.name).exists()]
        if missing:
            raise CodegenError(f"protoc did not produce {', '.join(missing)} for {api.proto}")
        # Rename last, one file at a time: each replace is atomic, so a concurrent
        # importer sees either the old module or the new one, never a partial file.
        for target in targets:
            (produced / target.name).replace(target)
        if api.pb2_grpc_stub not in targets:
            # Left over from a run with mypy-protobuf; it would describe an older proto.
            api.pb2_grpc_stub.unlink(missing_ok=True)
    return True


def generate(force: bool = False) -> bool:
    """Regenerate every API's bindings that are not current; return whether anything was written."""
    wrote = [generate_api(api, force) for api in APIS]
    return any(wrote)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devheal.kubelet.codegen",
        description="Generate the kubelet APIs' gRPC bindings next to their api.proto files.",
    )
    parser.add_argument("--force", action="store_true", help="regenerate even if the outputs look current")
    parser.add_argument("--check", action="store_true", help="exit 1 if the outputs are missing or stale")
    opts = parser.parse_args(argv)
    if opts.check:
        return 0 if is_up_to_date() else 1
    try:
        wrote = generate(force=opts.force)
    except CodegenError as exc:
        print(f"codegen: {exc}", file=sys.stderr)
        return 1
    if wrote:
        print(f"codegen: generated {', '.join(str(p.relative_to(KUBELET_DIR)) for p in outputs())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
