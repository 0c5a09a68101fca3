"""The wheel and the sdist, built from a clean tree, install and run.

A clean tree is what a fresh clone holds: the files git tracks (or would track), without
the git-ignored generated pod-resources modules, which the build hook must generate. The
builds run without build isolation on this environment's locked build tools, and the
wheels go into a fresh virtualenv that sees this environment's installed dependencies
(but not its editable devheal) through a ``.pth`` file, installed by pip with
``--no-index --no-deps``: nothing is downloaded, and each step takes seconds.
"""

from __future__ import annotations

import ensurepip
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
PODRESOURCES = "devheal/kubelet/podresources"
GENERATED = ("api_pb2.py", "api_pb2_grpc.py")


def _run(args: Sequence[str | Path], cwd: Path | None = None) -> str:
    """Run a command with a scrubbed environment; fail with its output if it fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _clean_tree(dest: Path) -> Path:
    """Copy the files git tracks or would track (not the ignored build outputs) into ``dest``."""
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: no clean tree to build from")
    listing = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO)
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if source.is_file():  # tracked but deleted in the working tree: not part of it
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def _build(source: Path, outdir: Path, *kinds: str) -> None:
    """``python -m build --no-isolation``; no ``kinds`` means sdist, then a wheel from it."""
    _run([sys.executable, "-m", "build", "--no-isolation", *kinds, "--outdir", outdir, source])


def _deps_view(dest: Path) -> Path:
    """A directory of links to this environment's installed packages, leaving devheal out.

    The fresh venv sees the dependencies through it; leaving out this environment's
    editable devheal means pip neither finds it installed nor imports it.
    """
    dest.mkdir()
    for site_dir in site.getsitepackages():
        for entry in Path(site_dir).iterdir():
            if "devheal" in entry.name.lower() or entry.suffix == ".pth" or entry.name == "__pycache__":
                continue
            if not (dest / entry.name).exists():
                (dest / entry.name).symlink_to(entry)
    return dest


def _pip(venv_python: Path) -> list[str | Path]:
    """pip for ``venv_python``: run from the wheel bundled with the standard library (no install)."""
    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if bundled:
        return [venv_python, bundled[-1] / "pip"]
    _run([venv_python, "-m", "ensurepip", "--default-pip"])  # a Python without the bundled wheel: slower
    return [venv_python, "-m", "pip"]


@dataclass(frozen=True)
class Installed:
    venv: Path
    stdout_help: str
    generated: dict[str, str]  # module name -> its __file__, imported in the venv


def _install_and_run(wheel: Path, root: Path, deps: Path) -> Installed:
    venv = root / "venv"
    # Made by this environment's Python, the venv runs the same base interpreter (same ABI).
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip())
    (purelib / "_devheal_test_deps.pth").write_text(f"{deps}\n")
    _run([*_pip(python), "install", "--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check", wheel])
    help_text = _run([venv / "bin" / "devheal", "--help"], cwd=root)
    probe = (
        "import devheal\n"
        "from devheal.kubelet.podresources import api_pb2, api_pb2_grpc\n"
        "api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(name='p', namespace='n')])\n"
        "assert api_pb2_grpc.PodResourcesListerStub is not None\n"
        "for m in (devheal, api_pb2, api_pb2_grpc): print(m.__name__, m.__file__)\n"
    )
    lines = _run([python, "-c", probe], cwd=root).splitlines()
    modules = dict(line.split(" ", 1) for line in lines)
    return Installed(venv=venv, stdout_help=help_text, generated=modules)


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _deps_view(tmp_path_factory.mktemp("deps") / "site")


@pytest.fixture(scope="module")
def wheel_from_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = _clean_tree(tmp_path_factory.mktemp("tree"))
    assert not list((tree / "src" / PODRESOURCES).glob("api_pb2*")), "the clean tree holds generated code"
    out = tmp_path_factory.mktemp("dist-tree")
    _build(tree, out, "--wheel")
    (wheel,) = out.glob("devheal-*.whl")
    return wheel


@pytest.fixture(scope="module")
def sdist_and_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tree = _clean_tree(tmp_path_factory.mktemp("tree"))
    out = tmp_path_factory.mktemp("dist-sdist")
    _build(tree, out)  # the sdist, then the wheel from the unpacked sdist
    (sdist,) = out.glob("devheal-*.tar.gz")
    (wheel,) = out.glob("devheal-*.whl")
    return sdist, wheel


def _assert_runs(installed: Installed) -> None:
    assert "controller" in installed.stdout_help
    assert "agent" in installed.stdout_help
    for module in ("devheal", "devheal.kubelet.podresources.api_pb2", "devheal.kubelet.podresources.api_pb2_grpc"):
        assert Path(installed.generated[module]).is_relative_to(installed.venv), (module, installed.generated)


def test_wheel_built_from_a_clean_tree_installs_and_runs(wheel_from_tree: Path, deps: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel_from_tree).namelist()
    for generated in GENERATED:
        assert f"{PODRESOURCES}/{generated}" in names
        assert f"devheal/kubelet/deviceplugin/{generated}" in names
    _assert_runs(_install_and_run(wheel_from_tree, tmp_path, deps))


def test_sdist_holds_the_proto_and_the_hook_but_no_generated_code(sdist_and_wheel: tuple[Path, Path]) -> None:
    sdist, _ = sdist_and_wheel
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert {"pyproject.toml", "hatch_build.py", "README.md", f"src/{PODRESOURCES}/api.proto"} <= names
    assert "src/devheal/kubelet/codegen.py" in names
    assert "src/devheal/kubelet/deviceplugin/api.proto" in names
    assert not [n for n in names if n.startswith(f"src/{PODRESOURCES}/api_pb2")]


def test_wheel_built_from_the_sdist_installs_and_runs(
    sdist_and_wheel: tuple[Path, Path], deps: Path, tmp_path: Path
) -> None:
    _, wheel = sdist_and_wheel
    _assert_runs(_install_and_run(wheel, tmp_path, deps))


def _generated_versions(wheel: Path) -> tuple[Version, Version]:
    """The protobuf and grpcio versions the wheel's generated modules demand at import."""
    with zipfile.ZipFile(wheel) as whl:
        pb2 = whl.read(f"{PODRESOURCES}/api_pb2.py").decode()
        grpc_mod = whl.read(f"{PODRESOURCES}/api_pb2_grpc.py").decode()
    (protobuf_line,) = [line for line in pb2.splitlines() if line.startswith("# Protobuf Python Version:")]
    (grpc_line,) = [line for line in grpc_mod.splitlines() if line.startswith("GRPC_GENERATED_VERSION")]
    return Version(protobuf_line.split(":", 1)[1].strip()), Version(grpc_line.split("=", 1)[1].strip(" '\""))


def test_declared_runtime_minimums_satisfy_the_generated_code(wheel_from_tree: Path) -> None:
    protobuf_needed, grpcio_needed = _generated_versions(wheel_from_tree)
    with zipfile.ZipFile(wheel_from_tree) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        headers = HeaderParser().parsestr(whl.read(metadata).decode())
    requires = {r.name: r for r in map(Requirement, headers.get_all("Requires-Dist") or [])}
    for name, needed in (("protobuf", protobuf_needed), ("grpcio", grpcio_needed)):
        lowest_allowed = [Version(s.version) for s in requires[name].specifier if s.operator in (">=", "==", "~=")]
        assert lowest_allowed, f"Requires-Dist {requires[name]} has no lower bound; the generated code needs {needed}"
        assert min(lowest_allowed) >= needed, (
            f"Requires-Dist {requires[name]} allows a {name} older than {needed}, which the generated code refuses"
        )
