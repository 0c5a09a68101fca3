"""The build requirements and the image's lock files agree with requirements.lock.

``scripts/lock`` writes all three; these tests catch a hand edit, or a change to
``pyproject.toml`` without re-locking, before an image is built from a stale subset.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s*\\\n\s+--hash=\S+)*)", re.MULTILINE)


def lock_entries(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """Each pinned package of a ``uv pip compile --generate-hashes`` file: name -> (version, hashes)."""
    entries: dict[str, tuple[str, frozenset[str]]] = {}
    for match in _ENTRY.finditer(path.read_text()):
        hashes = frozenset(re.findall(r"--hash=(\S+)", match.group(3)))
        if not hashes:
            raise ValueError(f"{path.name}: {match.group(1)}=={match.group(2)} has no --hash: expected hash pins")
        entries[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    if not entries:
        raise ValueError(f"{path.name}: no 'name==version' entries found")
    return entries


FULL = lock_entries(REPO / "requirements.lock")


def test_build_requirements_are_exact_pins_of_the_locked_versions() -> None:
    for text in PYPROJECT["build-system"]["requires"]:
        req = Requirement(text)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"[build-system] requires {text!r}: expected 'name==X'"
        locked = FULL.get(canonicalize_name(req.name), ("not locked", frozenset()))[0]
        assert specs[0].version == locked, f"[build-system] requires {text!r}, requirements.lock has {locked}"


@pytest.mark.parametrize("subset", ["requirements-build.lock", "requirements-runtime.lock"])
def test_image_locks_are_subsets_of_the_full_lock(subset: str) -> None:
    for name, (version, hashes) in lock_entries(REPO / subset).items():
        assert name in FULL, f"{subset}: {name} is not in requirements.lock"
        assert (version, hashes) == FULL[name], f"{subset}: {name}=={version} differs from requirements.lock"


def test_build_lock_covers_the_build_requirements() -> None:
    build = lock_entries(REPO / "requirements-build.lock")
    for text in PYPROJECT["build-system"]["requires"]:
        assert canonicalize_name(Requirement(text).name) in build, f"requirements-build.lock lacks {text!r}"


def test_runtime_lock_covers_the_runtime_dependencies_and_no_dev_tool() -> None:
    runtime = lock_entries(REPO / "requirements-runtime.lock")
    for text in PYPROJECT["project"]["dependencies"]:
        req = Requirement(text)
        assert canonicalize_name(req.name) in runtime, f"requirements-runtime.lock lacks {text!r}"
        assert req.specifier.contains(runtime[canonicalize_name(req.name)][0]), (
            f"requirements-runtime.lock pins {req.name}=={runtime[canonicalize_name(req.name)][0]}, outside {text!r}"
        )
    assert "pytest" not in runtime and "mypy" not in runtime


def test_plotting_is_an_extra_the_dev_environment_has_and_the_image_lacks() -> None:
    """matplotlib (and numpy, fontTools, Pillow under it) is ``devheal[plots]``: the simulator's PNGs only."""
    assert PYPROJECT["project"]["optional-dependencies"]["plots"] == ["matplotlib>=3.9"]
    assert not any(Requirement(t).name == "matplotlib" for t in PYPROJECT["project"]["dependencies"])
    assert "matplotlib" in FULL  # scripts/bootstrap installs requirements.lock: the plot tests run
    runtime = lock_entries(REPO / "requirements-runtime.lock")
    assert not {"matplotlib", "numpy", "fonttools", "pillow"} & set(runtime)


def test_lock_entries_rejects_unhashed_pins(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("grpcio==1.85.3\n    # via devheal\n")
    with pytest.raises(ValueError, match=r"x.lock: grpcio==1.85.3 has no --hash"):
        lock_entries(lock)
