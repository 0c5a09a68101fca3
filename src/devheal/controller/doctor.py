"""``devheal doctor``: is this cluster ready for devheal, and what is missing?

Each check reads the cluster (nothing is written) and says ``ok``, ``warn`` (devheal runs,
but something it could use is missing or it will act more widely than intended) or
``fail`` (devheal cannot do its job): devheal's CRDs served; the policies valid (and what
no policy means); a fresh agent report for every GPU node; the remediation templates the
policies name; KEP-4680 device health in pod status; RestartAllContainers; the gang Jobs the
policies select, where their backoff or failure policy costs a remediation time or retries; and
what the controller's service account may do (SubjectAccessReviews for the writes its actions make).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from devheal.controller.node_remediation import template_path
from devheal.controller.projections import ProjectionError, project_node, project_node_devices
from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.kube.crds import CRDsMissing, check_installed
from devheal.kube.features import detect_restart_all
from devheal.model import node_devices
from devheal.model.api import GROUP, GROUP_VERSION
from devheal.model.cluster import DEVICE_FAILED_CONDITION, GPU_RESOURCE
from devheal.model.policy import Policy, PolicyError, parse_policy

OK, WARN, FAIL = "ok", "warn", "fail"

CONTROLLER_NEEDS: tuple[tuple[str, str, str, str], ...] = (
    # (verb, API group, resource, subresource)
    ("list", "", "pods", ""),
    ("watch", "", "nodes", ""),
    ("create", "", "pods", "eviction"),
    ("patch", "", "pods", "status"),
    ("patch", "", "nodes", ""),
    ("patch", "", "nodes", "status"),  # DrainInProgress/Drained (node_conditions)
    ("create", "lifecycle.k8s.io", "evictionrequests", ""),  # cooperative eviction (eviction_requests)
    ("create", "", "events", ""),
    ("patch", "", "events", ""),
    ("create", GROUP, "remediations", ""),
    ("patch", GROUP, "remediations", "status"),
    ("delete", GROUP, "remediations", ""),
    ("list", GROUP, node_devices.PLURAL, ""),
    ("patch", GROUP, "remediationpolicies", "status"),
    ("update", "coordination.k8s.io", "leases", ""),
)
"""What the controller's actions write (and the watches it needs): checked for its service account."""


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str
    """``ok``, ``warn`` or ``fail``."""
    detail: str


def _names(items: list[str], most: int = 5) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


async def _crds(kube: KubeClient) -> Check:
    try:
        await check_installed(kube)
    except CRDsMissing as exc:
        return Check("crds", FAIL, str(exc))
    return Check("crds", OK, f"remediationpolicies, remediations, nodedevices served in {GROUP_VERSION}")


async def _policies(kube: KubeClient) -> tuple[Check, list[Policy]]:
    items, _ = await kube.list_all(api_path(GROUP_VERSION, "remediationpolicies"))
    valid: list[Policy] = []
    invalid: list[str] = []
    for obj in items:
        try:
            valid.append(parse_policy(obj))
        except PolicyError as exc:
            invalid.append(str(exc))
    if invalid:
        return Check("policies", FAIL, f"{len(invalid)} invalid (never acted on): {'; '.join(invalid[:3])}"), valid
    if not valid:
        return (
            Check(
                "policies",
                WARN,
                "no RemediationPolicy: devheal only observes (records what it would do as DryRun "
                "Remediations, acts on nothing); to let it act, apply one that selects namespaces or "
                "workloads, e.g. deploy/examples/recommended-policy.yaml (docs/policy.md)",
            ),
            valid,
        )
    return Check("policies", OK, f"{len(valid)} valid: {_names([p.name for p in valid])}"), valid


async def _agents(kube: KubeClient, now: float) -> Check:
    nodes, _ = await kube.list_all(api_path("v1", "nodes"))
    gpu_nodes = []
    for obj in nodes:
        try:
            node = project_node(obj)
        except ProjectionError:
            continue
        if node.gpu_capacity > 0:
            gpu_nodes.append(node.name)
    reports, _ = await kube.list_all(api_path(GROUP_VERSION, node_devices.PLURAL))
    fresh = set()
    for obj in reports:
        try:
            report = project_node_devices(obj)
        except ProjectionError:
            continue
        if not report.stale(now):
            fresh.add(report.node)
    silent = sorted(n for n in gpu_nodes if n not in fresh)
    if not gpu_nodes:
        return Check("agents", WARN, f"no node has {GPU_RESOURCE} capacity (is the device plugin running?)")
    if silent:
        return Check(
            "agents",
            WARN,
            f"{len(gpu_nodes) - len(silent)}/{len(gpu_nodes)} GPU nodes have a current NodeDevices report; "
            f"none from {_names(silent)} (is the devheal agent DaemonSet running there?)",
        )
    return Check("agents", OK, f"{len(gpu_nodes)}/{len(gpu_nodes)} GPU nodes have a current NodeDevices report")


async def _templates(kube: KubeClient, policies: list[Policy]) -> Check:
    named = {s.template for p in policies for s in p.node.ladder}
    if not named:
        return Check("templates", OK, "no policy names a node remediation template")
    missing = []
    for ref in sorted(named, key=lambda r: (r.api_version, r.kind, r.namespace, r.name)):
        try:
            await kube.get(template_path(ref))
        except (errors.NotFound, errors.Forbidden) as exc:
            missing.append(f"{ref.kind} {ref.namespace}/{ref.name} ({type(exc).__name__})")
    if missing:
        return Check("templates", FAIL, f"named by a policy but not readable: {_names(missing)}")
    return Check("templates", OK, f"{len(named)} remediation template(s) found")


async def _device_health(kube: KubeClient) -> Check:
    pods, _ = await kube.list_all(api_path("v1", "pods"), {"fieldSelector": "status.phase=Running"})
    gpu_pods = reporting = 0
    for pod in pods:
        containers = (pod.get("spec") or {}).get("containers") or []
        wants = any(
            GPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {}) for c in containers if isinstance(c, dict)
        )
        if not wants:
            continue
        gpu_pods += 1
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if any(isinstance(s, dict) and s.get("allocatedResourcesStatus") for s in statuses):
            reporting += 1
    if gpu_pods == 0:
        return Check("device-health", WARN, "no running GPU pod to tell whether kubelets report device health")
    if reporting == 0:
        return Check(
            "device-health",
            WARN,
            f"none of {gpu_pods} running GPU pods has allocatedResourcesStatus: the kubelets' "
            "ResourceHealthStatus feature (KEP-4680) looks off; devheal relies on its agents alone",
        )
    return Check("device-health", OK, f"{reporting}/{gpu_pods} running GPU pods report device health (KEP-4680)")


async def _restart_all(kube: KubeClient, namespace: str) -> Check:
    support = await detect_restart_all(kube, namespace)
    if support.usable:
        return Check("restart-all", OK, f"RestartAllContainers usable ({support.detail})")
    return Check("restart-all", WARN, f"RestartAllContainers not usable: {support.detail}; gangs use the launcher")


def gang_job_advice(job: Obj) -> list[str]:
    """What in an indexed Job of more than one pod (a gang) costs devheal's remediations time or the Job's retries;
    empty when nothing does (docs/gangs.md, "How it composes with Job and JobSet failure policies")."""
    spec = job.get("spec")
    if not isinstance(spec, dict) or spec.get("completionMode") != "Indexed":
        return []
    parallelism = spec.get("parallelism", 1)
    if not isinstance(parallelism, int) or parallelism < 2:
        return []
    advice = []
    if spec.get("backoffLimitPerIndex") is None:
        # Measured: bench.job_backoff (10.0, 19.9, 39.9, 79.9 s for 4 successive replacements).
        advice.append(
            "one backoff for the whole Job (no backoffLimitPerIndex): each rank devheal replaces is recreated "
            "after 10 s doubled for every pod of the Job failed since its last success (80 s after 4, 6 min "
            "from the 7th)"
        )
    failure_policy = spec.get("podFailurePolicy")
    rules = failure_policy.get("rules") if isinstance(failure_policy, dict) else None
    ignored = isinstance(rules, list) and any(
        isinstance(rule, dict)
        and rule.get("action") == "Ignore"
        and any(
            isinstance(c, dict) and c.get("type") == DEVICE_FAILED_CONDITION and c.get("status", "True") == "True"
            for c in rule.get("onPodConditions") or []
        )
        for rule in rules
    )
    if not ignored:
        advice.append(
            f"no podFailurePolicy rule ignores {DEVICE_FAILED_CONDITION}: every rank devheal fails or evicts for a "
            "failed device counts against the Job's backoff limit"
        )
    return advice


async def _gang_jobs(kube: KubeClient, policies: list[Policy]) -> Check:
    if not policies:
        return Check("gang-jobs", OK, "no policy selects any Job")
    jobs, _ = await kube.list_all(api_path("batch/v1", "jobs"))
    selected = 0
    findings: list[str] = []
    for job in jobs:
        meta = job.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        template = ((job.get("spec") or {}).get("template") or {}).get("metadata") or {}
        labels = template.get("labels") or {}
        # Its pods' nodes are not known yet: a Job is selected when a policy may govern its pods somewhere.
        if not isinstance(labels, dict) or not any(
            (not p.namespaces or namespace in p.namespaces) and p.pod_selector.matches(labels) for p in policies
        ):
            continue
        advice = gang_job_advice(job)
        selected += 1
        if advice:
            findings.append(f"Job {namespace}/{name}: {'; '.join(advice)}")
    if findings:
        return Check(
            "gang-jobs",
            WARN,
            f"{len(findings)} of {selected} selected Jobs: {_names(findings, 3)}"
            + " (docs/gangs.md: backoffLimitPerIndex and a podFailurePolicy for gangs)",
        )
    return Check(
        "gang-jobs",
        OK,
        f"{selected} selected Job(s); every gang among them backs off per index and ignores {DEVICE_FAILED_CONDITION}",
    )


async def _permissions(kube: KubeClient, account: str) -> Check:
    namespace, _, name = account.partition("/")
    user = f"system:serviceaccount:{namespace}:{name}"
    refused = []
    for verb, group, resource, subresource in CONTROLLER_NEEDS:
        review: dict[str, Any] = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace if resource == "leases" else "",
                },
            },
        }
        answer = await kube.create(api_path("authorization.k8s.io/v1", "subjectaccessreviews"), review)
        if not (answer.get("status") or {}).get("allowed"):
            refused.append(f"{verb} {resource}{'/' + subresource if subresource else ''}")
    if refused:
        return Check("permissions", FAIL, f"{user} may not {_names(refused, 8)} (apply deploy/controller.yaml)")
    return Check("permissions", OK, f"{user} may make every write the controller's actions need")


async def run_checks(kube: KubeClient, *, account: str, namespace: str, now: float | None = None) -> list[Check]:
    """Every check, in order; a check the caller may not run is a ``warn`` saying so."""
    now = time.time() if now is None else now
    crds = await _crds(kube)
    checks = [crds]
    if crds.status == FAIL:
        return checks  # nothing of devheal's can be read
    policies_check, policies = await _policies(kube)
    checks.append(policies_check)
    for name, check in (
        ("agents", lambda: _agents(kube, now)),
        ("templates", lambda: _templates(kube, policies)),
        ("device-health", lambda: _device_health(kube)),
        ("restart-all", lambda: _restart_all(kube, namespace)),
        ("gang-jobs", lambda: _gang_jobs(kube, policies)),
        ("permissions", lambda: _permissions(kube, account)),
    ):
        try:
            checks.append(await check())
        except errors.Forbidden as exc:
            checks.append(Check(name, WARN, f"cannot check: {exc}"))
    return checks
