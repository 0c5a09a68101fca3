"""docs/development.md's module map names every module of every package, so a newcomer finds each one there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "development.md"
SOURCE = ROOT / "src" / "devheal"


def modules(package: Path) -> set[str]:
    """The modules of ``package`` as the map names them: ``name`` for a module, ``name/`` for a subpackage
    (whose own modules the map does not list); private modules (``_name``) left out."""
    found = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    found |= {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    return found


def mapped() -> dict[str, set[str]]:
    """The module map's table: package -> every name in backquotes on its row (``package/name`` read as ``name``)."""
    text = DOC.read_text().split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = line.strip().strip("|").split("|")
        if len(cells) < 3:
            continue
        names = re.findall(r"`([^`]+)`", line)
        for package in re.findall(r"`(\w+)/`", cells[0]):
            rows[package] = {name.removeprefix(f"{package}/") for name in names}
    return rows


def test_every_package_and_module_is_on_the_module_map() -> None:
    rows = mapped()
    packages = sorted(p.name for p in SOURCE.iterdir() if (p / "__init__.py").is_file())
    assert sorted(rows) == packages, "packages on the map"
    missing = {package: sorted(modules(SOURCE / package) - rows[package]) for package in packages}
    assert not {p: m for p, m in missing.items() if m}, f"modules missing from the map in {DOC.name}"
