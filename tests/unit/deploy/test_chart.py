"""The Helm chart (deploy/helm/devheal): lint, what it renders, and the files generated from it.

helm is the pinned one, built from its Go module on first use (devheal.lab.helm); these
tests are skipped, saying why, only where it cannot be built (no Go toolchain).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

from devheal.agent.metrics import AgentMetrics
from devheal.lab import chart
from devheal.lab.helm import ensure_helm
from devheal.lab.toolchain import ToolchainError

REPO = Path(__file__).resolve().parents[3]
VALUES = chart.CHART / "values.yaml"
MONITORING = [f"monitoring.coreos.com/v1/{kind}" for kind in chart.MONITORING_KINDS]
TEMPLATES = (
    "remediation.templates[0].apiGroup=fence-agents-remediation.medik8s.io",
    "remediation.templates[0].kind=FenceAgentsRemediationTemplate",
    "remediation.templates[1].apiGroup=machine-deletion-remediation.medik8s.io",
    "remediation.templates[1].kind=MachineDeletionRemediationTemplate",
    "remediation.templates[1].resource=machinedeletionremediationtemplates",
)


@pytest.fixture(scope="module", autouse=True)
def helm() -> Iterator[Path]:
    try:
        yield ensure_helm()
    except ToolchainError as exc:
        pytest.skip(f"helm could not be built from its Go module: {exc}")


def documents(*args: str, api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(chart.render(*args, api_versions=api_versions)) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def test_helm_lint_strict_passes_with_default_and_every_option() -> None:
    chart.lint()
    chart.lint(*[arg for value in TEMPLATES for arg in ("--set", value)], "--set", "agent.classification.rules=[]")


def test_deploy_manifests_and_the_chart_crds_are_rendered_from_their_sources() -> None:
    stale = chart.drift()
    assert not stale, f"out of date: {', '.join(stale)}; run scripts/render-manifests"
    crds = {p.name: p.read_bytes() for p in (chart.CHART / "crds").glob("*.yaml")}
    assert crds == chart.chart_crds() and crds, "the chart's crds/ must be byte copies of src/devheal/crds/"


def test_the_chart_installs_the_package_version() -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert meta["appVersion"] == version, f"Chart.yaml appVersion {meta['appVersion']}, the package is {version}"


def documented_values() -> tuple[set[str], set[str]]:
    """(paths of values with a '# --' comment, paths of every mapping key) in values.yaml."""
    documented: set[str] = set()
    stack: list[tuple[int, str]] = []
    described = False
    for line in VALUES.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            described = True
            continue
        match = re.match(r"^(\s*)([A-Za-z_][\w]*):", line)
        if not match:
            if stripped and not stripped.startswith("#"):
                described = False
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        if described:
            documented.add(".".join(key for _, key in stack))
        described = False

    def keys(node: Any, prefix: str) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                path = f"{prefix}{key}"
                yield path
                if path not in documented:
                    yield from keys(value, f"{path}.")

    return documented, set(keys(yaml.safe_load(VALUES.read_text()), ""))


def test_every_value_is_described_in_values_yaml_and_in_docs_install() -> None:
    documented, every = documented_values()
    sections = {p for p in every if any(d.startswith(p + ".") for d in documented)}
    undescribed = sorted(every - documented - sections)
    assert not undescribed, f"values.yaml: no '# --' comment for {undescribed}"
    install = (REPO / "docs" / "install.md").read_text()
    missing = sorted(p for p in documented if f"| `{p}` |" not in install)
    assert not missing, f"docs/install.md: the values table lacks {missing}"


def test_no_rendered_object_repeats_a_key() -> None:
    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        keys = [loader.construct_object(k) for k, _ in node.value]
        repeated = {k for k in keys if keys.count(k) > 1}
        assert not repeated, f"line {node.start_mark.line + 1}: repeated keys {repeated}"
        return loader.construct_mapping(node)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    for text in (chart.render(api_versions=MONITORING), chart.render(*[a for v in TEMPLATES for a in ("--set", v)])):
        assert list(yaml.load_all(text, Strict))


def test_the_controller_role_grants_what_the_actions_use_and_nothing_broad() -> None:
    docs = documents()
    rules = one(docs, "ClusterRole", "devheal-controller")["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }
    assert not any("*" in grant for grant in granted), "no wildcards"
    urls = {(url, verb) for rule in rules for url in rule.get("nonResourceURLs", []) for verb in rule["verbs"]}
    assert urls == {("/metrics", "get")}, "the API server's feature gates, read only"
    assert not any(resource in ("secrets", "configmaps") for _, resource, _ in granted)
    assert not any(verb in ("escalate", "bind", "impersonate") for _, _, verb in granted)
    pods = {verb for group, resource, verb in granted if (group, resource) == ("", "pods")}
    assert pods == {"get", "list", "watch", "delete", "patch"}, "pod writes: the gang annotation and gate, and delete"
    assert ("", "pods/eviction", "create") in granted, "evictions through the eviction subresource"
    assert ("", "pods/status", "patch") in granted
    assert {v for g, r, v in granted if r == "nodes"} == {"get", "list", "watch", "patch"}, "patches, never PUTs"
    assert {v for g, r, v in granted if r == "nodes/status"} == {"patch"}, "devheal's drain conditions only"
    assert {v for g, r, v in granted if g == "lifecycle.k8s.io"} == {"get", "create", "delete"}, "EvictionRequests"
    assert not any(r == "evictions" for g, r, _ in granted if g == "lifecycle.k8s.io"), "the system's, not devheal's"
    pod_groups = {(r, v) for g, r, v in granted if g == "scheduling.k8s.io"}
    assert pod_groups == {
        ("podgroups", "get"),
        ("podgroups", "list"),
        ("podgroups", "watch"),
        ("podgroups/status", "patch"),
    }, "PodGroups read, and only devheal's DisruptionTarget condition written"
    assert not any(r.startswith("nodedevices") and v not in ("get", "list", "watch") for _, r, v in granted)
    lease = one(docs, "Role", "devheal-controller-lease")
    assert lease["metadata"]["namespace"] == chart.NAMESPACE
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]


def remediation_rules(docs: list[dict[str, Any]]) -> set[tuple[str, str, tuple[str, ...]]]:
    rules = one(docs, "ClusterRole", "devheal-controller")["rules"]
    return {
        (rule["apiGroups"][0], resource, tuple(rule["verbs"]))
        for rule in rules
        if rule.get("apiGroups", [""])[0].endswith(".medik8s.io")
        for resource in rule["resources"]
    }


def test_remediation_templates_from_values_become_rbac_for_them_and_for_what_they_create() -> None:
    assert remediation_rules(documents()) == {
        ("self-node-remediation.medik8s.io", "selfnoderemediationtemplates", ("get",)),
        ("self-node-remediation.medik8s.io", "selfnoderemediations", ("get", "create", "delete")),
    }
    docs = documents(*[a for v in TEMPLATES for a in ("--set", v)])
    assert remediation_rules(docs) == {
        ("fence-agents-remediation.medik8s.io", "fenceagentsremediationtemplates", ("get",)),
        ("fence-agents-remediation.medik8s.io", "fenceagentsremediations", ("get", "create", "delete")),
        ("machine-deletion-remediation.medik8s.io", "machinedeletionremediationtemplates", ("get",)),
        ("machine-deletion-remediation.medik8s.io", "machinedeletionremediations", ("get", "create", "delete")),
    }
    assert remediation_rules(documents("--set", "remediation.templates=null")) == set()


def test_validation_namespaces_become_a_role_for_pods_there_only() -> None:
    """Post-repair validation creates pods: only in the namespaces named, never cluster-wide."""
    assert not [d for d in documents() if d["metadata"]["name"] == "devheal-controller-validation"]
    docs = documents("--set-json", 'remediation.validationNamespaces=["gpu-checks"]')
    role = one(docs, "Role", "devheal-controller-validation")
    assert role["metadata"]["namespace"] == "gpu-checks"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "delete"]}]
    binding = one(docs, "RoleBinding", "devheal-controller-validation")
    assert binding["metadata"]["namespace"] == "gpu-checks"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "devheal-controller", "namespace": chart.NAMESPACE}
    ]
    rules = one(docs, "ClusterRole", "devheal-controller")["rules"]
    assert not any("create" in r["verbs"] and "pods" in r.get("resources", []) for r in rules)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("--set-json", 'remediation.templates=[{"apiGroup": "a.io", "kind": "Reboot"}]'), "must end in Template"),
        (
            ("--set-json", 'remediation.templates=[{"apiGroup": "a.io", "kind": "RebootTemplate", "resource": "rt"}]'),
            "resource rt of RebootTemplate: devheal reads templates of that kind as reboottemplates",
        ),
        (("--set-json", 'remediation.templates=[{"kind": "RebootTemplate"}]'), "needs apiGroup and kind"),
        (("--set", "controller.leaderElection=false"), "needs controller.leaderElection"),
        (("--set", "metrics.prometheusRule.enabled=maybe"), 'must be true, false or auto, got "maybe"'),
    ],
)
def test_bad_values_fail_rendering_saying_what_is_wrong(settings: tuple[str, ...], message: str) -> None:
    with pytest.raises(chart.ChartError, match=re.escape(message)):
        chart.render(*settings)


def test_the_controller_runs_two_leader_elected_replicas_non_root_read_only_without_capabilities() -> None:
    docs = documents()
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2 and "--leader-elect" in container["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    budget = one(docs, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    service = one(docs, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not [d for d in documents("--set", "controller.replicas=1") if d["kind"] == "PodDisruptionBudget"]


def test_the_agent_gets_the_pod_resources_socket_and_nvml_and_nothing_more() -> None:
    daemonset = one(documents(), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    host = [v for v in pod["volumes"] if "hostPath" in v]
    assert host == [
        {"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}}
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert all(m["readOnly"] for m in mounts.values())
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {t["key"] for t in pod["tolerations"]} >= {"nvidia.com/gpu", "devheal.io/device-failure"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility" and env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert not pod["hostNetwork"] and not pod["hostPID"]
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
    assert not security.get("privileged") and security["allowPrivilegeEscalation"] is False
    plain = one(documents("--set", "agent.runtimeClassName="), "DaemonSet")
    assert "runtimeClassName" not in plain["spec"]["template"]["spec"]


def test_extra_agent_volumes_are_mounted_beside_the_charts_own() -> None:
    volume = {"name": "lab-nodes", "hostPath": {"path": "/tmp/lab/nodes", "type": "Directory"}}
    mount = {"name": "lab-nodes", "mountPath": "/lab-nodes", "readOnly": True}
    daemonset = one(
        documents("--set-json", f"agent.extraVolumes=[{json.dumps(volume)}]",
                  "--set-json", f"agent.extraVolumeMounts=[{json.dumps(mount)}]"),
        "DaemonSet",
    )  # fmt: skip
    pod = daemonset["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["pod-resources", "classification", "lab-nodes"]
    assert pod["volumes"][-1] == volume
    assert pod["containers"][0]["volumeMounts"][-1] == mount


def test_admission_policies_name_the_release_service_accounts() -> None:
    docs = documents("--namespace", "gpu-ops")  # the last --namespace wins
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    controller = ("devheal-controller-pod-writes", "devheal-controller-node-writes", "devheal-controller-pod-status")
    assert set(policies) == {"devheal-agent-own-node", "devheal-launcher-own-pod", *controller}
    assert "system:serviceaccount:gpu-ops:devheal-agent'" in str(policies["devheal-agent-own-node"]["spec"])
    for name in controller:
        assert "system:serviceaccount:gpu-ops:devheal-controller'" in str(policies[name]["spec"])
    off = documents(
        "--set",
        "agent.admissionPolicy.enabled=false",
        "--set",
        "controller.admissionPolicy.enabled=false",
        "--set",
        "launcher.admissionPolicy.enabled=false",
    )
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(
    ("setting", "served", "expected"),
    [
        ("auto", False, set()),
        ("auto", True, {"ServiceMonitor", "PodMonitor", "PrometheusRule"}),
        ("true", False, {"ServiceMonitor", "PodMonitor", "PrometheusRule"}),
        ("false", True, set()),
    ],
)
def test_prometheus_operator_objects_follow_their_setting(setting: str, served: bool, expected: set[str]) -> None:
    docs = documents(
        "--set",
        f"metrics.serviceMonitor.enabled={setting}",
        "--set",
        f"metrics.prometheusRule.enabled={setting}",
        api_versions=tuple(MONITORING) if served else (),
    )
    assert {d["kind"] for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")} == expected
    dashboard = one(docs, "ConfigMap", "devheal-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def exported_metrics() -> set[str]:
    """Every series name devheal's controller and agent expose."""
    import devheal.controller.metrics  # noqa: F401  (registers the controller's metrics)

    agent = CollectorRegistry()
    AgentMetrics(agent)
    names = set()
    for registry in (REGISTRY, agent):
        for family in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
            names |= {family.name + suffix for suffix in suffixes}
    return {n for n in names if n.startswith("devheal_")}


def test_alerts_and_the_dashboard_use_metrics_devheal_exports() -> None:
    docs = documents(api_versions=tuple(MONITORING))
    rules = one(docs, "PrometheusRule")["spec"]["groups"][0]["rules"]
    alerts = {r["alert"]: r["expr"] for r in rules}
    assert {
        "DevhealControllerDown",
        "DevhealCircuitBreakerOpen",
        "DevhealRemediationStuck",
        "DevhealAgentReportStale",
    } <= set(alerts)
    dashboard = json.loads(one(docs, "ConfigMap", "devheal-dashboard")["data"]["devheal.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for expr in [*alerts.values(), *exprs] for name in re.findall(r"\bdevheal_[a-z_]+", expr)}
    unknown = used - exported_metrics()
    assert not unknown, f"alerts or dashboard use metrics devheal does not export: {sorted(unknown)}"
