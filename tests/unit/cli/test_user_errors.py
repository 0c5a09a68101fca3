"""A kubeconfig that cannot be used, or a cluster that cannot be reached, is one line on stderr, never a traceback.

Each case runs ``python -m devheal`` in a fresh process, as a person would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLUSTERS = """\
apiVersion: v1
kind: Config
clusters:
- {name: refused, cluster: {server: "http://127.0.0.1:1"}}
users:
- {name: me, user: {token: secret}}
contexts:
- {name: refused, context: {cluster: refused, user: me}}
- {name: other, context: {cluster: refused, user: me}}
current-context: refused
"""


def run(args: list[str], home: Path, **env: str) -> tuple[int, str, str]:
    """Run devheal with a HOME of its own and no KUBECONFIG or service-account address unless given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_SERVICE"))}
    done = subprocess.run(
        [sys.executable, "-m", "devheal", *args],
        capture_output=True,
        text=True,
        env={**base, "HOME": str(home), **env},
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def refused(tmp_path: Path) -> Path:
    path = tmp_path / "refused.yaml"
    path.write_text(CLUSTERS)
    return path


AGENT = ["agent", "--node-name", "gpu-node-000"]
BARRIER = ["barrier", "--pod", "p", "--namespace", "ns"]
SIDECAR = ["sidecar", "--pod", "p", "--namespace", "ns"]
COMMANDS = [["controller"], AGENT, BARRIER, SIDECAR, ["features"], ["crds", "apply"]]
IDS = ["controller", "agent", "barrier", "sidecar", "features", "crds-apply"]


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_a_kubeconfig_that_does_not_exist(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    code, out, err = run([*command, "--kubeconfig", str(missing)], tmp_path)
    line = one_line(err)
    assert code == 2 and out == ""
    assert f"cannot load Kubernetes configuration from {missing}: no such file (--kubeconfig)" in line


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_an_api_server_that_refuses_connections(command: list[str], tmp_path: Path, refused: Path) -> None:
    code, _, err = run([*command, "--kubeconfig", str(refused)], tmp_path)
    line = one_line(err)
    assert code in (1, 2)
    assert "cannot reach the Kubernetes API server" in line and "127.0.0.1:1" in line
    assert "check that the cluster is running" in line


def test_the_controller_exits_1_when_the_cluster_cannot_be_reached(tmp_path: Path, refused: Path) -> None:
    code, _, _ = run(["controller", "--kubeconfig", str(refused)], tmp_path)
    assert code == 1


@pytest.mark.parametrize(
    "command",
    [
        [*BARRIER, "--context", "staging"],
        ["features", "--context", "staging"],
        ["crds", "apply", "--context", "staging"],
        ["launch", "--pod", "p", "--namespace", "ns", "--context", "staging", "--", "true"],
        ["controller", "--context", "staging"],
        [*AGENT, "--context", "staging"],
    ],
    ids=["barrier", "features", "crds-apply", "launch", "controller", "agent"],
)
def test_a_context_the_kubeconfig_does_not_have(command: list[str], tmp_path: Path, refused: Path) -> None:
    code, _, err = run(command, tmp_path, KUBECONFIG=str(refused))
    line = one_line(err)
    assert code == 2
    assert f"from KUBECONFIG={refused}: no context 'staging' (--context)" in line
    assert line.endswith("use one of its contexts (refused, other)")


def test_kubeconfig_is_a_merged_list_as_kubectl_reads_it(tmp_path: Path, refused: Path) -> None:
    # The first file does not exist, the second sets nothing, the third has the context: merged, it is found.
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    listed = os.pathsep.join([str(tmp_path / "absent"), str(empty), str(refused)])
    code, _, err = run([*BARRIER, "--context", "other"], tmp_path, KUBECONFIG=listed)
    assert code == 2 and "cannot reach the Kubernetes API server" in one_line(err)


def test_a_kubeconfig_list_with_no_existing_file(tmp_path: Path) -> None:
    code, _, err = run(["controller"], tmp_path, KUBECONFIG=str(tmp_path / "a") + os.pathsep + str(tmp_path / "b"))
    assert code == 2
    assert "none of these files exists: fix KUBECONFIG or pass --kubeconfig" in one_line(err)


def test_no_configuration_at_all_says_where_it_looked(tmp_path: Path) -> None:
    code, _, err = run(["crds", "apply"], tmp_path)
    line = one_line(err)
    assert code == 2
    assert f"from {tmp_path / '.kube' / 'config'}: no such file, and not in a pod" in line
    assert "pass --kubeconfig PATH, set KUBECONFIG" in line


def test_a_kubeconfig_that_is_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [\n  - {name: a\n")
    code, _, err = run(["controller", "--kubeconfig", str(bad)], tmp_path)
    line = one_line(err)
    assert code == 2
    assert f"from {bad}: not valid YAML" in line and "fix or replace the file" in line
