"""A PyTorch rank as a pod on a real node (`torch_rank_spec`): torch from this machine's site-packages, read-only,
after the image's own packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import devheal
from devheal.lab.workloads import (
    COLLECTIVE_FAILED_EXIT_CODE,
    TORCH_SITE,
    TRAINING_DIR,
    host_torch_site_packages,
    restart_all_rank_spec,
    torch_rank_spec,
)

SITE = Path("/opt/venv/lib/python3.11/site-packages")
SHARED = Path("/tmp/gang")


def _spec(rank: int | None = 1) -> dict[str, Any]:
    return torch_rank_spec(
        account="devheal-launcher",
        devheal_image="devheal.local/lab/devheal:1",
        site_packages=SITE,
        shared_dir=SHARED,
        world_size=2,
        master_port=29500,
        apiserver_port=6443,
        rank=rank,
        training_args=["--events", f"{TRAINING_DIR}/events.jsonl"],
    )


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_rank_is_the_restart_all_layout_with_the_devheal_image_training() -> None:
    spec = _spec()
    layout = restart_all_rank_spec(
        account="devheal-launcher", devheal_image="devheal.local/lab/devheal:1", training_image="x", command=["x"]
    )
    assert [c["name"] for c in spec["initContainers"]] == [c["name"] for c in layout["initContainers"]]
    assert spec["initContainers"][1]["restartPolicyRules"] == layout["initContainers"][1]["restartPolicyRules"]
    (train,) = spec["containers"]
    assert train["image"] == "devheal.local/lab/devheal:1"
    assert train["command"][:2] == ["python", "-c"]
    assert train["command"][3:] == [
        TORCH_SITE,
        "--checkpoint-dir",
        f"{TRAINING_DIR}/checkpoints",
        "--events",
        f"{TRAINING_DIR}/events.jsonl",
    ]


def test_torch_is_mounted_read_only_and_the_shared_directory_writable() -> None:
    spec = _spec()
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    assert volumes == {
        "torch": {"path": str(SITE), "type": "Directory"},
        "training": {"path": str(SHARED), "type": "Directory"},
    }
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["torch"] == {"name": "torch", "mountPath": TORCH_SITE, "readOnly": True}
    assert not mounts["training"].get("readOnly")


def test_ranks_meet_on_loopback_and_the_barrier_reaches_the_api_server_there() -> None:
    spec = _spec()
    assert spec["hostNetwork"] is True
    env = _env(spec["containers"][0])
    assert env == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    for container in spec["initContainers"]:
        env = _env(container)
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
        assert "POD_NAME" in env, "the downward API is kept"


def test_without_a_rank_it_is_the_indexed_jobs_completion_index() -> None:
    env = _env(_spec(rank=None)["containers"][0])
    assert env["RANK"] == {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}}


def test_a_rank_whose_peer_went_away_restarts_its_pods_containers_instead_of_failing_it() -> None:
    (train,) = _spec()["containers"]
    assert train["restartPolicy"] == "Never"
    assert train["restartPolicyRules"] == [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [COLLECTIVE_FAILED_EXIT_CODE]}}
    ]


def test_the_host_site_packages_hold_torch() -> None:
    assert (host_torch_site_packages() / "torch" / "__init__.py").is_file()


def test_the_mounted_packages_come_after_the_images_own(tmp_path: Path) -> None:
    """The container's entry appends the mounted directory: a devheal there is not the one imported, torch is.
    (Run without this Python's site-packages, which hold the real torch, as the image's Python has none.)"""
    site = tmp_path / "site"
    (site / "devheal").mkdir(parents=True)
    (site / "devheal" / "__init__.py").write_text("raise SystemExit('the mounted devheal was imported')\n")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        "import sys, devheal\n"
        f"print(sys.path[-1] == {str(site)!r}, devheal.__file__ != {str(site / 'devheal' / '__init__.py')!r})\n"
        "raise SystemExit(0)\n"
    )
    (train,) = _spec()["containers"]
    entry = train["command"][2]
    image_packages = str(Path(devheal.__file__).parents[1])
    done = subprocess.run(
        [sys.executable, "-S", "-c", entry, str(site), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": image_packages},
    )
    assert (done.returncode, done.stdout.split()) == (0, ["True", "True"]), done.stderr
