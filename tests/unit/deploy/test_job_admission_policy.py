"""deploy/job-admission-policy.yaml: the MutatingAdmissionPolicy that marks pods rejected at admission in kubelet's
own write, held to the names the controller uses (its live behaviour: tests/lab/controller/test_infrastructure.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from devheal.model.cluster import ADMISSION_REJECTED_CONDITION, ADMISSION_REJECTED_REASON

MANIFEST = Path(__file__).parents[3] / "deploy" / "job-admission-policy.yaml"


def test_the_policy_marks_only_pods_failed_at_admission_with_the_controllers_condition() -> None:
    policy, binding = yaml.safe_load_all(MANIFEST.read_text())
    assert (policy["kind"], binding["kind"]) == ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Ignore", "a broken policy must never block kubelet's status writes"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["pods/status"], ["UPDATE"])
    (condition,) = spec["matchConditions"]
    assert f'"{ADMISSION_REJECTED_REASON}"' in condition["expression"]
    assert f'"{ADMISSION_REJECTED_CONDITION}"' in condition["expression"], "never added twice"
    (mutation,) = spec["mutations"]
    assert f'type: "{ADMISSION_REJECTED_CONDITION}"' in mutation["applyConfiguration"]["expression"]
