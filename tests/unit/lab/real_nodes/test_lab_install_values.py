"""`devheal lab install`'s side of the chart: the values the lab adds, and when an install counts as running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devheal.lab.chart import CHART
from devheal.lab.cluster import LabError
from devheal.lab.install import LAB_NODES_MOUNT, Rollout, image_values, lab_values, rollout
from devheal.lab.realnode import REAL_NODE_LABEL

CHART_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_the_lab_image_is_never_pulled() -> None:
    assert image_values("devheal.local/lab/devheal:0.1.0-abc") == {
        "repository": "devheal.local/lab/devheal",
        "tag": "0.1.0-abc",
        "pullPolicy": "Never",
    }
    with pytest.raises(LabError, match="expected <repository>:<tag>"):
        image_values("localhost:5000/devheal")


def test_devheal_runs_on_the_real_nodes_and_each_agent_reads_its_own_nodes_gpus() -> None:
    values = lab_values("devheal.local/lab/devheal:1", Path("/tmp/lab"), CHART_VALUES)
    toleration = {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
    assert values["controller"] == {"nodeSelector": {REAL_NODE_LABEL: "true"}, "tolerations": [toleration]}
    agent = values["agent"]
    # The chart's selector goes (null removes a key in helm's merge), its tolerations stay.
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": None, REAL_NODE_LABEL: "true"}
    assert agent["tolerations"] == [*CHART_VALUES["agent"]["tolerations"], toleration]
    assert agent["backend"] == "simulated" and agent["runtimeClassName"] == ""
    assert agent["extraArgs"] == [f"--lab-state-file={LAB_NODES_MOUNT}/$(NODE_NAME)/gpus.json"]
    (volume,) = agent["extraVolumes"]
    assert volume["hostPath"] == {"path": "/tmp/lab/nodes", "type": "Directory"}
    assert agent["extraVolumeMounts"] == [{"name": volume["name"], "mountPath": LAB_NODES_MOUNT, "readOnly": True}]


def _deployment(replicas: int, available: int, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "devheal-controller", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": observed, "availableReplicas": available, "updatedReplicas": available},
    }


def _daemonset(desired: int, ready: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "devheal-agent", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "updatedNumberScheduled": desired,
        },
    }


def test_an_install_runs_when_the_controller_is_available_and_every_agent_ready() -> None:
    assert rollout([_deployment(2, 2)], [_daemonset(1, 1)], []) == Rollout(True, "")
    assert rollout([_deployment(2, 1)], [_daemonset(1, 1)], []).waiting == "devheal-controller 1/2 available"
    assert not rollout([_deployment(2, 2, generation=2)], [_daemonset(1, 1)], []).done, "an old status"
    # An agent on no node (its selector matches none) is no install.
    assert rollout([_deployment(2, 2)], [_daemonset(0, 0)], []).waiting == "devheal-agent 0/0 ready"


def test_a_pod_that_cannot_start_is_named_with_its_reason() -> None:
    pod = {
        "metadata": {"name": "devheal-agent-x"},
        "status": {
            "containerStatuses": [
                {"name": "agent", "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}}}
            ]
        },
    }
    starting = {
        "metadata": {"name": "b"},
        "status": {"containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
    }
    result = rollout([_deployment(2, 0)], [_daemonset(1, 0)], [pod, starting])
    assert result.stuck == ("devheal-agent-x/agent: ErrImageNeverPull (not present)",)
