"""The demo's script: GPUs fail on a live lab cluster, and devheal heals it, workload by workload.

It brings up the lab, installs devheal's CRDs and a policy, runs the controller as a
real process, deploys an inference Deployment and a training Job, then injects a
scripted sequence of faults and measures, for each, how fast devheal noticed, what it
did, how long until the workload ran again, and how many pods were disrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from devheal.kube import errors
from devheal.kube.client import KubeClient, Obj, api_path
from devheal.kube.crds import install_crds
from devheal.lab import toolchain
from devheal.lab.cluster import Lab, LabSpec
from devheal.lab.faults import Faults
from devheal.lab.workloads import (
    get_path,
    gpu_deployment,
    gpu_job,
    pod_devices,
    pods_of,
    wait_policy_observed,
    wait_until,
)
from devheal.model import node_devices
from devheal.model.api import GROUP_VERSION
from devheal.model.cluster import GPU_RESOURCE, LAUNCHER_GENERATION_ANNOTATION, OWNED_TAINT_KEY

NAMESPACE = "demo"
REMEDIATIONS = api_path(GROUP_VERSION, "remediations")
SPARE_POOL = "spare"
GANG_RANKS = 4
ACKED = LAUNCHER_GENERATION_ANNOTATION
TRAINING_LOOP = (
    "import time\n"
    "from devheal.launch import report_step\n"
    "step = 0\n"
    "while True:\n"
    "    began = time.monotonic(); time.sleep(0.2); step += 1\n"
    "    report_step(time.monotonic() - began, step)\n"
)
"""The fake training loop each rank's launcher runs: a 0.2 s step, reported to the launcher."""
FAKE_GROUP = "remediation.demo.devheal.io"


@dataclass
class FaultResult:
    """One scripted fault and what followed."""

    fault: str
    detection_seconds: float | None = None
    action: str = "-"
    recovered_seconds: float | None = None
    pods_disrupted: int = 0
    expected_disrupted: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.recovered_seconds is not None and self.pods_disrupted == self.expected_disrupted


def default_demo_dir() -> Path:
    explicit = os.environ.get("DEVHEAL_DEMO_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "devheal" / "demo"


def demo_policy() -> Obj:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "RemediationPolicy",
        "metadata": {"name": "demo"},
        "spec": {
            "selector": {"namespaces": [NAMESPACE]},
            "actions": {"inference": "Deschedule", "batch": "FailPod", "gang": "RestartGang"},
            "node": {
                "taint": True,
                "capacityGapAfter": "2s",
                "remediateAfter": "5s",
                "holdDown": "3s",
                "template": {
                    "apiVersion": f"{FAKE_GROUP}/v1",
                    "kind": "RebootRemediationTemplate",
                    "name": "reboot",
                    "namespace": "default",
                },
            },
            # A 4-node lab with two faulty nodes is 50% faulty: the storm breaker must allow that here.
            "budgets": {
                "maxUnhealthyNodes": 3,
                "maxUnhealthyNodesPerPool": "100%",
                "circuitBreaker": {"maxFaultyNodesPercent": 75, "window": "10m"},
            },
        },
    }


async def _install_fake_remediator(kube: KubeClient) -> None:
    """A medik8s-style remediator pair, so node remediation has something to create."""
    for kind in ("RebootRemediationTemplate", "RebootRemediation"):
        plural = kind.lower() + "s"
        name = f"{plural}.{FAKE_GROUP}"
        await kube.apply(
            api_path("apiextensions.k8s.io/v1", "customresourcedefinitions", name=name),
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": name},
                "spec": {
                    "group": FAKE_GROUP,
                    "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    ],
                },
            },
        )

    async def served() -> bool:
        try:
            await kube.get(api_path(f"{FAKE_GROUP}/v1", "rebootremediationtemplates", namespace="default"))
            return True
        except (errors.NotFound, errors.TooManyRequests):
            return False

    await wait_until(served, bool, timeout=30, what="the demo remediator's CRDs")
    with contextlib.suppress(errors.AlreadyExists):
        await kube.create(
            api_path(f"{FAKE_GROUP}/v1", "rebootremediationtemplates", namespace="default"),
            {
                "apiVersion": f"{FAKE_GROUP}/v1",
                "kind": "RebootRemediationTemplate",
                "metadata": {"name": "reboot"},
                "spec": {"template": {"spec": {"action": "reboot"}}},
            },
        )


class Story:
    def __init__(
        self,
        console: Console,
        lab: Lab,
        kube: KubeClient,
        *,
        gpus_per_node: int = 8,
        gang_ranks: int = GANG_RANKS,
        launchers: bool = True,
    ) -> None:
        self.console = console
        self.lab = lab
        self.kube = kube
        self.faults = Faults(lab)
        self.t0 = time.monotonic()
        self.gpus_per_node = gpus_per_node
        self.gang_ranks = gang_ranks
        self.uses_launchers = launchers
        """Each rank's training runs under a local `devheal launch`; without, the ranks restart in place
        through their own containers (RestartAllContainers on a real kubelet)."""
        self.launchers: dict[str, subprocess.Popen[bytes]] = {}

    async def attach_launchers(self) -> int:
        """Start a launcher (a local process) for every running rank that has none: what the
        container entry point `devheal launch -- python train.py` would be in a real pod."""
        started = 0
        if not self.uses_launchers:
            return started
        for pod in await self.running("training"):
            uid = pod["metadata"]["uid"]
            if uid in self.launchers:
                continue
            name = pod["metadata"]["name"]
            self.launchers[uid] = await asyncio.to_thread(
                self.lab.spawn_devheal,
                "launch",
                f"--pod={name}",
                f"--namespace={NAMESPACE}",
                "--grace=1",
                "--",
                sys.executable,
                "-c",
                TRAINING_LOOP,
                log=self.lab.dir / "logs" / f"launch-{name}.log",
            )
            started += 1
        return started

    def stop_launchers(self) -> None:
        for proc in self.launchers.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.launchers.values():
            _reap(proc, 10)

    async def gang_fault(self, code: int) -> FaultResult:
        ranks = await wait_until(
            lambda: self.running("training"),
            lambda ps: len(ps) == self.gang_ranks,
            timeout=120,
            what=f"{self.gang_ranks} running training ranks",
        )
        await self.attach_launchers()
        await wait_until(
            lambda: self.running("training"),
            lambda ps: all(ACKED in (p["metadata"].get("annotations") or {}) for p in ps),
            timeout=120,
            what="every rank running its training (its generation acknowledged)",
        )
        before = {p["metadata"]["uid"] for p in ranks}
        victim = ranks[0]
        node, index, device = await self._gpu_of(victim)
        result = FaultResult(f"XID {code} on {node} GPU {index} under a training rank", expected_disrupted=1)
        self.say(
            "FAULT",
            f"XID {code} on {node} GPU {index} ({device[:16]}…), used by rank "
            f"{victim['metadata']['name']} of a {self.gang_ranks}-rank training gang",
        )
        started = time.monotonic()
        self.faults.xid(node, index, code)
        record = await self._first_remediation(lambda r: r["spec"]["action"] == "RestartGang", started)
        result.detection_seconds = time.monotonic() - started
        result.action = "RestartGang"
        # The gang restart ends once every rank acknowledged the new generation, the replacement
        # rank too: it gets its launcher as it starts.
        done = await self._wait_done(record["metadata"]["name"], meanwhile=self.attach_launchers)
        generation = (done["metadata"].get("annotations") or {}).get("devheal.io/gang-generation", "1")

        async def ranks_now() -> list[Obj]:
            await self.attach_launchers()  # the replacement rank gets its launcher as it starts
            return await self.running("training")

        healed = await wait_until(
            ranks_now,
            lambda ps: (
                len(ps) == self.gang_ranks
                and all((p["metadata"].get("annotations") or {}).get(ACKED) == generation for p in ps)
            ),
            timeout=120,
            what=f"every rank restarted in place at generation {generation}",
        )
        result.recovered_seconds = time.monotonic() - started
        result.pods_disrupted = len(before - {p["metadata"]["uid"] for p in healed})
        how = "by their launchers" if self.uses_launchers else "by kubelet (RestartAllContainers)"
        self.say(
            "HEALED",
            f"training gang: {self.gang_ranks}/{self.gang_ranks} ranks running generation {generation} after "
            f"{result.recovered_seconds:.2f}s; {self.gang_ranks - 1} restarted in place {how}, 1 pod replaced",
        )
        return result

    def say(self, kind: str, message: str) -> None:
        styles = {
            "FAULT": "bold red",
            "FOUND": "yellow",
            "ACT": "cyan",
            "HEALED": "bold green",
            "INFO": "dim",
            "NOTE": "magenta",
        }
        self.console.print(
            f"[dim]{time.monotonic() - self.t0:6.1f}s[/dim]  [{styles.get(kind, '')}]{kind:<6}[/]  {message}"
        )

    async def running(self, app: str) -> list[Obj]:
        pods = await pods_of(self.kube, NAMESPACE, f"app={app}")
        return [
            p
            for p in pods
            if get_path(p, "status", "phase") == "Running" and not get_path(p, "metadata", "deletionTimestamp")
        ]

    async def remediations(self) -> list[Obj]:
        items, _ = await self.kube.list_all(REMEDIATIONS)
        return items

    async def _gpu_of(self, pod: Obj) -> tuple[str, int, str]:
        node = pod["spec"]["nodeName"]
        device = pod_devices(pod)[0].device_id
        index = self.faults.gpu_index(node, device)
        return node, index, device

    async def _first_remediation(self, match: Callable[[Obj], bool], started: float) -> Obj:
        found = await wait_until(
            self.remediations,
            lambda items: any(match(i) for i in items),
            timeout=30,
            what="devheal's Remediation",
            interval=0.05,
        )
        record = next(i for i in found if match(i))
        spec = record["spec"]
        self.say(
            "FOUND",
            f"{spec['finding']['kind']} ({spec['finding']['source']}): {spec['finding']['evidence']} "
            f"after {time.monotonic() - started:.2f}s",
        )
        return record

    async def _wait_done(
        self,
        name: str,
        phases: tuple[str, ...] = ("Succeeded", "Failed", "Blocked"),
        meanwhile: Callable[[], Awaitable[object]] | None = None,
    ) -> Obj:
        async def read() -> Obj:
            if meanwhile is not None:
                await meanwhile()
            return await self.kube.get(f"{REMEDIATIONS}/{name}")

        record = await wait_until(
            read,
            lambda r: (r.get("status") or {}).get("phase") in phases,
            timeout=30,
            what=f"remediation {name} acted on",
            interval=0.05,
        )
        status = record.get("status") or {}
        self.say("ACT", f"{record['spec']['action']}: {status.get('message', '')} [{status.get('phase')}]")
        return record

    async def workload_fault(self, app: str, replicas: int, code: int, label: str) -> FaultResult:
        pods = await wait_until(
            lambda: self.running(app), lambda ps: len(ps) == replicas, timeout=60, what=f"{replicas} running {app} pods"
        )
        before = {p["metadata"]["uid"] for p in pods}
        victim = pods[0]
        node, index, device = await self._gpu_of(victim)
        result = FaultResult(f"XID {code} on {node} GPU {index} under {label}", expected_disrupted=1)
        self.say("FAULT", f"XID {code} on {node} GPU {index} ({device[:16]}…), used by {victim['metadata']['name']}")
        started = time.monotonic()
        self.faults.xid(node, index, code)
        record = await self._first_remediation(
            lambda r: r["spec"]["target"].get("name") == victim["metadata"]["name"], started
        )
        result.detection_seconds = time.monotonic() - started
        result.action = record["spec"]["action"]
        await self._wait_done(record["metadata"]["name"])
        healed = await wait_until(
            lambda: self.running(app),
            lambda ps: len(ps) == replicas and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in ps},
            timeout=60,
            what=f"{app} back to {replicas} running pods",
        )
        result.recovered_seconds = time.monotonic() - started
        result.pods_disrupted = len(before - {p["metadata"]["uid"] for p in healed})
        new = next(p for p in healed if p["metadata"]["uid"] not in before)
        nnode, nindex, _ = await self._gpu_of(new)
        self.say(
            "HEALED",
            f"{app}: {replicas}/{replicas} running again after {result.recovered_seconds:.2f}s; "
            f"replacement {new['metadata']['name']} on {nnode} GPU {nindex} (healthy)",
        )
        return result

    async def idle_node_fault(self, node: str) -> FaultResult:
        result = FaultResult(f"all 8 GPUs of idle {node} fail", expected_disrupted=0)
        self.say("FAULT", f"{node} (idle, pool {SPARE_POOL}) loses all 8 GPUs (XID 79 x8)")
        started = time.monotonic()
        for gpu in range(8):
            self.faults.xid(node, gpu, 79)
        taint = await self._first_remediation(
            lambda r: r["spec"]["target"].get("name") == node and r["spec"]["action"] == "Taint", started
        )
        result.detection_seconds = time.monotonic() - started
        await self._wait_done(taint["metadata"]["name"])
        remediate = await wait_until(
            self.remediations,
            lambda items: any(
                i["spec"]["action"] == "RemediateNode" and i["spec"]["target"]["name"] == node for i in items
            ),
            timeout=60,
            what="node remediation requested",
        )
        rec = next(
            i for i in remediate if i["spec"]["action"] == "RemediateNode" and i["spec"]["target"]["name"] == node
        )
        rec = await self._wait_done(rec["metadata"]["name"], ("InProgress", "Failed", "Blocked"))
        if rec["status"]["phase"] != "InProgress":
            result.notes.append(f"node remediation {rec['status']['phase']}: {rec['status'].get('message')}")
            return result
        result.action = "Taint + RemediateNode"
        self.say("NOTE", f"an external remediator (here: RebootRemediation default/{node}) reboots the node…")
        await asyncio.sleep(1.0)
        for gpu in range(8):
            self.faults.recover(node, gpu)

        async def lifted() -> bool:
            obj = await self.kube.get(api_path("v1", "nodes", name=node))
            return not any(t.get("key") == OWNED_TAINT_KEY for t in obj["spec"].get("taints") or [])

        await wait_until(lifted, bool, timeout=60, what="devheal lifts its taint after hold-down")
        result.recovered_seconds = time.monotonic() - started
        self.say(
            "HEALED",
            f"{node}: GPUs healthy, remediation closed, taint lifted after hold-down "
            f"({result.recovered_seconds:.1f}s after the fault)",
        )
        return result

    async def plugin_restart(self, node: str) -> FaultResult:
        result = FaultResult(f"device plugin restart on {node}", expected_disrupted=0, action="none (no device failed)")
        pods_before = {
            p["metadata"]["uid"]
            for p in await pods_of(self.kube, NAMESPACE)
            if p["spec"].get("nodeName") == node and get_path(p, "status", "phase") == "Running"
        }
        records_before = {r["metadata"]["name"] for r in await self.remediations()}
        self.say("FAULT", f"device plugin on {node} restarts: GPU allocatable drops to 0 for 3s")
        started = time.monotonic()
        self.faults.plugin_restart(node, 3.0)

        async def allocatable() -> str:
            obj = await self.kube.get(api_path("v1", "nodes", name=node))
            return str(get_path(obj, "status", "allocatable", GPU_RESOURCE, default="0"))

        # Back once every GPU that was not failed on purpose is allocatable again.
        failed = sum(1 for d in self.faults.devices(node)["devices"] if d.get("health") == "Unhealthy")
        back = str(self.gpus_per_node - failed)
        await wait_until(allocatable, lambda a: a == back, timeout=30, what=f"{back} GPUs allocatable again")
        await asyncio.sleep(2.0)
        result.recovered_seconds = time.monotonic() - started
        after = {
            p["metadata"]["uid"]
            for p in await pods_of(self.kube, NAMESPACE)
            if p["spec"].get("nodeName") == node and get_path(p, "status", "phase") == "Running"
        }
        result.pods_disrupted = len(pods_before - after)
        new_records = {r["metadata"]["name"] for r in await self.remediations()} - records_before
        if new_records:
            result.action = f"{len(new_records)} remediation(s): {sorted(new_records)}"
            result.pods_disrupted = max(result.pods_disrupted, 1)
        self.say(
            "HEALED",
            f"{node}: GPUs back after {result.recovered_seconds:.1f}s; {len(after)} pods kept "
            "running, devheal did not act (nothing failed)",
        )
        return result


async def run(
    console: Console, *, keep: bool, nodes: int, observe_seconds: float, directory: Path | None
) -> list[FaultResult]:
    """Tell the whole story; returns one result per scripted fault."""
    lab = Lab(directory or default_demo_dir())
    t0 = time.monotonic()
    console.print("[bold]devheal demo[/bold]: GPUs fail on a real local control plane; devheal heals the cluster.")
    with console.status("lab") as status:
        state = await asyncio.to_thread(lab.up, LabSpec(nodes=max(nodes, 3)), lambda m: status.update(m))
    console.print(
        f"[dim]{time.monotonic() - t0:6.1f}s[/dim]  INFO    lab ready in {state.ready_seconds:.1f}s: "
        f"{state.spec.nodes} kwok nodes x 8 simulated GPUs, real etcd/apiserver/controller-manager/scheduler"
    )
    controller: subprocess.Popen[bytes] | None = None
    agents: subprocess.Popen[bytes] | None = None
    results: list[FaultResult] = []
    story: Story | None = None
    try:
        async with await KubeClient.connect(str(lab.kubeconfig)) as kube:
            story = Story(console, lab, kube)
            story.t0 = t0
            await install_crds(kube)
            await _install_fake_remediator(kube)
            await kube.create(api_path(GROUP_VERSION, "remediationpolicies"), demo_policy())
            spare = f"gpu-node-{state.spec.nodes - 1:03d}"
            await kube.patch(
                api_path("v1", "nodes", name=spare), {"metadata": {"labels": {"devheal.io/pool": SPARE_POOL}}}
            )
            story.say("INFO", f"installed devheal CRDs and policy 'demo'; {spare} is an idle spare (pool {SPARE_POOL})")
            # Real fleets hold a recovered device back for minutes; the demo's agents for seconds.
            overrides = lab.dir / "agent-classification.yaml"
            overrides.write_text("quietWindow: 5s\nholdDown: 3s\n")
            agents = await asyncio.to_thread(
                lab.spawn_devheal,
                "agent",
                "--backend",
                "simulated",
                f"--lab-dir={lab.dir}",
                "--all-nodes",
                f"--classification={overrides}",
            )

            async def reports() -> int:
                items, _ = await kube.list_all(api_path(GROUP_VERSION, node_devices.PLURAL))
                return len(items)

            await wait_until(reports, lambda n: n >= state.spec.nodes, timeout=60, what="NodeDevices from every agent")
            story.say(
                "INFO",
                f"node agents running for all {state.spec.nodes} nodes (simulated NVML backend, pid "
                f"{agents.pid}): kubectl get nodedevices",
            )
            controller = await asyncio.to_thread(lab.spawn_devheal, "controller", "--no-leader-elect")

            await wait_policy_observed(kube, "demo", timeout=60)
            story.say(
                "INFO", f"devheal controller running (pid {controller.pid}, log {lab.dir / 'logs' / 'controller.log'})"
            )
            await kube.create(api_path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            deployment = gpu_deployment("inference", replicas=4, gpus=1)
            deployment["spec"]["template"]["spec"]["nodeSelector"] = {"devheal.io/pool": "default"}
            await kube.create(api_path("apps/v1", "deployments", namespace=NAMESPACE), deployment)
            await kube.create(
                api_path("batch/v1", "jobs", namespace=NAMESPACE),
                gpu_job("training", ranks=GANG_RANKS, indexed=True, node_selector={"devheal.io/pool": "default"}),
            )
            story.say(
                "INFO",
                f"deployed 'inference' (Deployment, 4 x 1 GPU) and 'training' (indexed Job: a gang of {GANG_RANKS} "
                "ranks x 1 GPU, each rank's training loop under `devheal launch`)",
            )
            results.append(await story.workload_fault("inference", 4, 79, "inference"))
            results.append(await story.gang_fault(48))
            results.append(await story.idle_node_fault(spare))
            busy = next(p["spec"]["nodeName"] for p in await story.running("inference"))
            results.append(await story.plugin_restart(busy))
            if observe_seconds > 0:
                await asyncio.sleep(observe_seconds)
            summary(console, results, lab)
    finally:
        if story is not None:
            story.stop_launchers()
        for proc in (controller, agents):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                _reap(proc, 15)
        if keep:
            keep_commands(console, lab)
        else:
            console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim]  INFO    tearing the lab down")
            await asyncio.to_thread(lab.down)
    return results


def keep_commands(console: Console, lab: Lab) -> None:
    """What to look at in the lab the demo leaves running (``--keep``)."""
    kubectl = f"{toolchain.CONTROL_PLANE.binary('kubectl')} --kubeconfig {lab.kubeconfig}"
    console.print("\nThe lab keeps running. Look around:")
    console.print(f"  {kubectl} get remediations")
    console.print(f"  {kubectl} get remediationpolicies")
    console.print(f"  {kubectl} get nodedevices")
    console.print(f"  {kubectl} -n {NAMESPACE} get pods -o wide")
    console.print(f"  {kubectl} get events -A --field-selector source=devheal-controller")
    console.print(f"  devheal lab down --dir {lab.dir}")


def _reap(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Wait for a process we stopped, killing it after ``grace``: never leave an unreaped child behind
    (Python would reap its pid later, when the number may already belong to another process)."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def summary(console: Console, results: list[FaultResult], lab: Lab) -> None:
    table = Table("fault", "detected", "action", "workload running again", "pods disrupted", title="summary")
    for r in results:
        table.add_row(
            r.fault,
            _fmt(r.detection_seconds),
            r.action,
            _fmt(r.recovered_seconds),
            f"{r.pods_disrupted} (expected {r.expected_disrupted})",
        )
    console.print(table)
    for r in results:
        for note in r.notes:
            console.print(f"  {r.fault}: {note}")
    kubectl = f"{toolchain.CONTROL_PLANE.binary('kubectl')} --kubeconfig {lab.kubeconfig}"
    console.print("Audit trail while the lab runs (use --keep):")
    console.print(f"  {kubectl} get remediations -o wide")
