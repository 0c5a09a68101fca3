"""Findings from the node conditions and taints other tools set, as the policy's ``signals`` maps them (pure).

node-problem-detector, NVIDIA NVSentinel and DCGM health checks report a node's trouble as a
node condition (``True``: the problem is there) or a taint; ``spec.signals``
(``devheal.model.signals_policy``) says what each condition type and taint key means:

- ``DevicesFailed`` joins the node's ``NodeDevicesFailed`` finding (or makes one), so the
  node path applies unchanged: a NoSchedule taint when ``node.taint``, the circuit breaker
  counting the node, and the lift after ``node.holdDown`` once the signal is gone. It names
  no device, so it acts on no pod and starts no node remediation by itself;
- ``Degraded`` and ``Notify`` make one ``NodeSignal`` finding per node, which leads to a
  ``Notify`` record of the node (one per episode, numbered by when the signal began).

``with_node_signals`` is called by ``devheal.engine.findings.detect``; ``candidates`` by
``devheal.engine.decide``, whose rails (dry-run, pause) then apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from devheal.model.cluster import ClusterView, Node
from devheal.model.plan import Action, Finding, FindingKind, FindingSource
from devheal.model.policy import ActionKind, Policy
from devheal.model.policy_set import policy_for_node
from devheal.model.signals_policy import SignalClass, SignalRules


@dataclass(frozen=True, slots=True)
class Signal:
    """One condition or taint of a node that the policy maps to a class."""

    what: str
    """``condition GpuPcieWatch`` or ``taint nvidia.com/gpu-xid-error:NoSchedule``."""
    cls: SignalClass
    detail: str = ""
    since: float | None = None

    def describe(self) -> str:
        return f"{self.what} ({self.cls})" + (f": {self.detail}" if self.detail else "")


def signals(node: Node, rules: SignalRules) -> list[Signal]:
    """The node's conditions and taints the rules give a class other than Ignore, conditions first."""
    found = []
    for c in node.conditions:
        cls = rules.condition(c.type)
        if cls is not SignalClass.IGNORE:
            detail = ": ".join(part for part in (c.reason, c.message) if part)
            found.append(Signal(f"condition {c.type}", cls, detail[:300], c.since))
    for t in node.taints:
        cls = rules.taint(t.key)
        if cls is not SignalClass.IGNORE:
            found.append(Signal(f"taint {t.key}" + (f"={t.value}" if t.value else "") + f":{t.effect}", cls))
    return found


def _since(found: Sequence[Signal], now: float) -> float:
    return min(s.since if s.since is not None else now for s in found)


def with_node_signals(
    node_findings: Sequence[Finding], view: ClusterView, policies: Sequence[Policy], now: float
) -> list[Finding]:
    """``node_findings`` (the device signals' node findings) with what the nodes' mapped conditions and taints
    add: ``DevicesFailed`` joins the node's ``NodeDevicesFailed`` finding or makes one; ``Degraded`` and
    ``Notify`` make one ``NodeSignal`` finding per node."""
    out = list(node_findings)
    failed_at = {f.node: i for i, f in enumerate(out) if f.kind is FindingKind.NODE_DEVICES_FAILED}
    for node in view.nodes.values():
        if not node.conditions and not node.taints:
            continue  # nothing another tool said: skip the policy lookup (most nodes, every round)
        policy = policy_for_node(policies, node)
        if policy is None:
            continue
        found = signals(node, policy.signals)
        failed = [s for s in found if s.cls is SignalClass.DEVICES_FAILED]
        others = [s for s in found if s.cls is not SignalClass.DEVICES_FAILED]
        if failed:
            evidence = "; ".join(s.describe() for s in failed)
            since = _since(failed, now)
            at = failed_at.get(node.name)
            if at is not None:
                f = out[at]
                out[at] = replace(
                    f,
                    sources=(*f.sources, FindingSource.NODE_SIGNAL),
                    evidence=f"{f.evidence}; {evidence}",
                    since=min(f.since, since),
                )
            else:
                idle = not any(p.active and p.gpu_request > 0 for p in view.pods_on(node.name))
                out.append(
                    Finding(
                        kind=FindingKind.NODE_DEVICES_FAILED,
                        node=node.name,
                        sources=(FindingSource.NODE_SIGNAL,),
                        evidence=f"{evidence}" + ("; node idle" if idle else "; node busy"),
                        since=since,
                        node_idle=idle,
                    )
                )
        if others:
            out.append(
                Finding(
                    kind=FindingKind.NODE_SIGNAL,
                    node=node.name,
                    sources=(FindingSource.NODE_SIGNAL,),
                    evidence="; ".join(s.describe() for s in others),
                    since=_since(others, now),
                )
            )
    return out


def candidates(
    view: ClusterView, findings: Iterable[Finding], policies: Sequence[Policy]
) -> list[tuple[Action, Policy]]:
    """A ``Notify`` record of the node for each ``NodeSignal`` finding (``NodeDevicesFailed`` takes the node
    path in ``devheal.engine.decide``)."""
    out = []
    for f in findings:
        if f.kind is not FindingKind.NODE_SIGNAL:
            continue
        node = view.nodes.get(f.node)
        policy = policy_for_node(policies, node) if node is not None else None
        if node is None or policy is None:
            continue
        action = Action.on_node(
            ActionKind.NOTIFY,
            node,
            f,
            policy.name,
            # Nothing to lift, so no lift count: each episode is numbered by when its signal began.
            epoch=int(f.since),
            reason=f"reported by another tool: {f.evidence}",
        )
        out.append((action, policy))
    return out
