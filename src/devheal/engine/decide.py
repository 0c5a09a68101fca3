"""The engine: findings + cluster view + policies + in-flight remediations + now -> a plan.

Pure and deterministic, so the live controller and the offline simulator run the same
decisions, and tests check its invariants directly:

- no action on a pod or node outside every policy's selector;
- never two active remediations for one target, and no decision taken twice;
- every action is only recorded in dry-run or while paused; beyond that, what an action
  does (its effects, ``devheal.model.effects``) says which rails hold it: the circuit
  breaker stops whatever evicts, restarts, or stops scheduling on a node or a device; the
  unhealthy-node budgets (cluster-wide and per pool) count whatever takes a node out of
  service; the concurrency budget and the per-workload interval count whatever stops
  running work (evicts, restarts).

Budgets in percent and the breaker count GPU nodes only (``gpu_fleet``): CPU-only nodes
a policy selects do not widen them; the quiet nodes a narrowed view leaves out
(``ClusterView.rest``) do. The circuit breaker's state comes in from the round
(``devheal.engine.breaker``). A remediation active
for longer than its action's step timeout (``overdue``) no longer holds the concurrency
budget.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from devheal.engine import dra, infrastructure, maintenance, node_signals, pod_groups, recovery, validation
from devheal.engine.breaker import Breaker, gpu_fleet, step_breaker
from devheal.engine.degradation import DEGRADATION_FINDINGS, degradation_actions
from devheal.engine.stragglers import STEP_FINDINGS, steer_away, step_actions
from devheal.model.cluster import (
    OWNED_TAINT_EFFECT,
    OWNED_TAINT_KEY,
    OWNERSHIP_ANNOTATION,
    ClusterView,
    Node,
    WorkloadClass,
)
from devheal.model.degradation_policy import DEGRADED_MARK, DEGRADED_MARKS, DEGRADED_TAINT_KEY
from devheal.model.effects import KIND_EFFECTS, Effect, disrupts, effects_of, lifted_by, takes_node
from devheal.model.node_lifecycle import describe, under_maintenance
from devheal.model.plan import (
    POD_FINDINGS,
    Action,
    Blocked,
    Finding,
    FindingKind,
    FindingSource,
    InFlight,
    InFlightRecords,
    Phase,
    Plan,
    Rail,
    TargetKind,
)
from devheal.model.policy import ActionKind, Budgets, NodeRules, Policy, RemediationMode
from devheal.model.policy_set import policy_for_node, policy_for_pod
from devheal.model.times import format_duration, format_time
from devheal.model.validation_policy import VALIDATION_POD_LABEL

PolicyOf = Callable[[InFlight], Policy | None]
"""A record's policy, by its name (None: gone)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Controller-wide switches (flags), on top of each policy's own."""

    dry_run: bool = False
    paused: bool = False


@dataclass(frozen=True, slots=True)
class Overdue:
    """An active disruptive remediation older than its action's step timeout: it no longer holds the
    concurrency budget, and the host reports it (an Event and a metric in the controller)."""

    record: InFlight
    timeout: float
    why: str


def policy_of(policies: Sequence[Policy]) -> PolicyOf:
    """Look a record's policy up by its name."""
    by_name = {p.name: p for p in policies}
    return lambda r: by_name.get(r.policy)


class Disrupting:
    """Whether a record stops running work: carried out (not dry-run, Blocked, Skipped) and disruptive under its
    policy (the worst case of its kind when the policy is gone). What the policy makes of a kind is worked out once
    per (kind, policy name), as a storm's rounds ask it of tens of thousands of records."""

    __slots__ = ("_by_name", "_kinds")

    def __init__(self, policies: Sequence[Policy]) -> None:
        self._by_name = {p.name: p for p in policies}
        self._kinds: dict[tuple[ActionKind, str], bool] = {}

    def __call__(self, r: InFlight) -> bool:
        if r.dry_run or r.phase is Phase.BLOCKED or r.phase is Phase.SKIPPED:
            return False  # (``InFlight.carried_out``, inlined: called for every record of every round)
        key = (r.action, r.policy)
        found = self._kinds.get(key)
        if found is None:
            found = self._kinds[key] = disrupts(r.effects(self._by_name.get(r.policy)))
        return found


def overdue(in_flight: Iterable[InFlight], policies: Sequence[Policy], now: float) -> list[Overdue]:
    """Active disruptive remediations past the step timeout of their policy (the defaults when the policy is
    gone), oldest first."""
    policy = policy_of(policies)
    disrupting = Disrupting(policies)
    timeouts: dict[tuple[ActionKind, str], float | None] = {}
    found = []
    for r in in_flight:
        if not (r.active and disrupting(r)):
            continue
        key = (r.action, r.policy)
        if key in timeouts:
            timeout = timeouts[key]
        else:
            own = policy(r)
            timeout = timeouts[key] = (own.budgets if own is not None else Budgets()).step_timeout(r.action)
        if timeout is None or now - r.started <= timeout:
            continue
        found.append(
            Overdue(
                r,
                timeout,
                f"{r.action} on {r.target} still {r.phase} since {format_time(r.started)}, past its step timeout "
                f"of {timeout:.0f}s: no longer counted against maxConcurrentRemediations",
            )
        )
    return sorted(found, key=lambda o: (o.record.started, o.record.name))


def _marked_out(node: Node) -> bool:
    """devheal's marks keep new pods off the node: its taint or cordon, or its degraded taint at NoSchedule (a
    fence). The degraded taint at PreferNoSchedule only steers: the node stays in service."""
    if node.owned - DEGRADED_MARKS:
        return True
    return DEGRADED_MARK in node.owned and any(
        t.key == DEGRADED_TAINT_KEY and t.effect in ("NoSchedule", "NoExecute") for t in node.taints
    )


HARMLESS_ON_A_NODE = frozenset({Effect.REMOVES_OWN_MARK, Effect.NOTIFIES})
"""A node-level action with only these effects still runs on a node under someone else's maintenance."""


def _under_maintenance(action: Action, view: ClusterView) -> str:
    """Why ``action`` is held off its node (``Rail.NODE_MAINTENANCE``), or "": a node-level action (a taint, cordon,
    drain, a rung of the remediation ladder) on a node someone else has under maintenance. Pod, gang and device
    actions are not held: a pod on a dead GPU serves nothing, maintenance or not (docs/policy.md)."""
    if action.target_kind is not TargetKind.NODE or action.cluster_effects <= HARMLESS_ON_A_NODE:
        return ""
    node = view.nodes.get(action.node)
    condition = under_maintenance(node) if node is not None else None
    if condition is None:
        return ""
    return f"node {action.node} is under maintenance: {describe(condition)}; devheal leaves it to whoever set it"


def nodes_out(view: ClusterView, in_flight: Sequence[InFlight], policy: PolicyOf) -> set[str]:
    """Nodes of the view out of service, by devheal: marked (``_marked_out``); under an active remediation that
    takes a node out; or marked by a remediation that succeeded, until a later lift of that mark succeeded.

    The last is for the cache's lag: a Taint that succeeded may not show on the cached Node yet, and a node
    counted nowhere would let the next round take another one. It stops counting at the lift that removed the
    mark (or when the record leaves the records a round reads, a day after it ended), never earlier; when the
    mark shows, the mark counts."""
    out = {n.name for n in view.nodes.values() if _marked_out(n)}
    lifts: dict[tuple[str, ActionKind], float] = {}
    for r in in_flight:
        lift = r.target_kind == TargetKind.NODE and Effect.REMOVES_OWN_MARK in r.effects(None)
        if lift and r.phase is Phase.SUCCEEDED:
            key = (r.node, r.action)
            lifts[key] = max(lifts.get(key, r.started), r.started)
    for r in in_flight:
        if r.target_kind != TargetKind.NODE or r.node not in view.nodes or r.node in out:
            continue
        effects = r.effects(policy(r))
        if not takes_node(effects):
            continue
        if r.active:
            out.add(r.node)
        elif r.phase is Phase.SUCCEEDED and not r.dry_run and Effect.STOPS_NODE_SCHEDULING in effects:
            lifted = lifts.get((r.node, lifted_by(r.action)))
            if lifted is None or lifted <= r.started:
                out.add(r.node)
    return out


FLAP_WINDOW = 24 * 3600.0
"""Lifts of a node within this window make its next hold-down longer (``lift_hold_down``)."""
MAX_FLAP_HOLD_DOWN = 4 * 3600.0
"""The longest hold-down flapping makes (a policy's own ``holdDown`` may be longer)."""
LEMON_WINDOW = 30 * 24 * 3600.0
"""Lifts of a node within this window count towards ``node.lemonAfter``; a lemon's hold-down is this long."""


@dataclass(frozen=True, slots=True)
class HoldDown:
    """How long a node must stay healthy before devheal lifts its marks, and why (``hold_down_of``)."""

    seconds: float
    lifts: int = 0
    """The node's lifts that set it: within ``FLAP_WINDOW`` of now (each doubles it), or, for a lemon, within
    ``LEMON_WINDOW`` before it became healthy."""
    lemon_after: int = 0
    """The policy's ``node.lemonAfter`` where it made the node a lemon (kept out for ``LEMON_WINDOW``); 0: not one."""


def hold_down_of(
    rules: NodeRules, node: str, in_flight: Iterable[InFlight], now: float, since: float | None = None
) -> HoldDown:
    """How long ``node`` must stay healthy before devheal lifts its marks: the policy's ``holdDown``, doubled for
    each lift of the node within the last day, up to four hours. A GPU that keeps failing again soon after
    a lift stays one episode (one set of records), not one per flap; a node quiet for a day is back to the
    policy's hold-down. A node lifted ``lemonAfter`` times within ``LEMON_WINDOW`` is a lemon (repaired, it failed
    again): it stays out until it has been healthy for that whole window, so no workload lands on it meanwhile;
    its lifts are counted in the window before it became healthy (``since``; default ``now``), so the wait does
    not shorten as they age."""
    healthy_since = now if since is None else since
    if rules.lemon_after:
        counted = lifts_within(node, in_flight, healthy_since, LEMON_WINDOW)
        if counted >= rules.lemon_after:
            return HoldDown(max(rules.hold_down, LEMON_WINDOW), counted, rules.lemon_after)
    recent = lifts_within(node, in_flight, now, FLAP_WINDOW)
    if recent == 0:
        return HoldDown(rules.hold_down)
    return HoldDown(max(rules.hold_down, min(rules.hold_down * 2.0 ** min(recent, 32), MAX_FLAP_HOLD_DOWN)), recent)


def lift_hold_down(
    rules: NodeRules, node: str, in_flight: Iterable[InFlight], now: float, since: float | None = None
) -> float:
    """The seconds of ``hold_down_of``."""
    return hold_down_of(rules, node, in_flight, now, since).seconds


def lifts_within(node: str, in_flight: Iterable[InFlight], now: float, window: float) -> int:
    """Lifts of ``node``'s marks that succeeded within ``window`` before ``now``."""
    return sum(
        1
        for r in in_flight
        if r.action is ActionKind.LIFT
        and r.node == node
        and r.phase is Phase.SUCCEEDED
        and now - (r.finished if r.finished is not None else r.started) <= window
    )


def gang_epochs(view: ClusterView) -> dict[str, int]:
    """Per gang (workload key), its highest restart generation: each restart raises it, so the next fault after
    one is a new decision. Read from the pods, never counted from records (deleting records changes nothing)."""
    epochs: dict[str, int] = {}
    for pod in view.pods.values():
        key = pod.workload.key
        epochs[key] = max(epochs.get(key, 0), pod.restart_generation)
    return epochs


def _supersedes(action: Action, in_flight: Sequence[InFlight]) -> bool:
    """``action`` is a step up its node's escalation ladder and every active record of its target an earlier step."""
    if action.kind is not ActionKind.REMEDIATE_NODE or action.step == 0:
        return False
    return all(
        r.action is ActionKind.REMEDIATE_NODE and r.resume is not None and r.resume.step < action.step
        for r in in_flight
        if r.active and (r.target_kind, r.target) == (action.target_kind, action.target)
    )


def escalation_step(
    rules: NodeRules, node: str, epoch: int, in_flight: Sequence[InFlight], now: float, start: int = 0
) -> tuple[int, str]:
    """The rung of the node's remediation ladder to take now, and why when it is a step up.

    ``start`` (the rung NVML's recovery action asks for, ``devheal.engine.recovery``) is the
    episode's first rung. The highest rung recorded for this episode stays while it is in
    progress within its timeout (its record carries it on) or once it succeeded; the next
    rung is taken when it failed, ran past its timeout, or succeeded but its validation
    failed (``devheal.engine.validation``); the last rung is never left.
    """
    taken = [
        r
        for r in in_flight
        if r.action is ActionKind.REMEDIATE_NODE and r.node == node and r.resume is not None and r.resume.epoch == epoch
    ]
    if not taken:
        return min(max(start, 0), max(len(rules.ladder) - 1, 0)), ""
    last = max(taken, key=lambda r: (r.resume.step if r.resume is not None else 0, r.started))
    step = last.resume.step if last.resume is not None else 0
    ladder = rules.ladder
    if step + 1 >= len(ladder):
        return step, ""
    current = ladder[step].template
    if last.phase is Phase.FAILED:
        return step + 1, f"step {step + 1} ({current.kind}) failed: escalating to {ladder[step + 1].template.kind}"
    if last.phase is Phase.SUCCEEDED and validation.failed_after(last, in_flight):
        # The validation of the rung failed, and its GPUs failed again (a diagnostic under load often does).
        return step + 1, (
            f"the validation after step {step + 1} ({current.kind}) failed: escalating to "
            f"{ladder[step + 1].template.kind}"
        )
    if last.active and now - last.started > ladder[step].timeout:
        return step + 1, (
            f"step {step + 1} ({current.kind}) did not bring the node back within {ladder[step].timeout:.0f}s: "
            f"escalating to {ladder[step + 1].template.kind}"
        )
    return step, ""


POD_TARGETED = frozenset({ActionKind.DESCHEDULE, ActionKind.FAIL_POD, ActionKind.NOTIFY})
"""Pod actions whose target is the pod itself (``RestartGang`` targets the gang)."""


def _in_hand(
    f: Finding, view: ClusterView, pod_only: Container[WorkloadClass], active: Container[tuple[TargetKind, str]]
) -> bool:
    """Whether the decision on ``f`` can only be skipped: a failed device in a pod's status whose one candidate
    (``_candidate_actions``) would target the pod, which a remediation in progress already targets ("one
    remediation at a time per target"). A fault storm's open findings are mostly these (their evictions are under
    way): leaving them out costs nothing of the plan, and saves the policy lookup and the naming of each.

    The candidate targets the pod where every policy's action for the pod's workload class does (``pod_only``:
    those classes) and no PodGroup turns ``Deschedule`` into a ``RestartGang`` (``pod_groups.member_action``);
    ``steer_away`` gives no taint for a failed device (only for a rank its own container or step times accuse)."""
    if f.kind is not FindingKind.DEVICE_FAILED or (TargetKind.POD, f.pod) not in active:
        return False
    pod = view.pods.get(f.pod)
    if pod is None:
        return True  # no candidate at all
    return pod.workload.cls in pod_only and pod_groups.group_of(view, pod.workload) is None


def _candidate_actions(
    view: ClusterView,
    findings: Iterable[Finding],
    policies: Sequence[Policy],
    in_flight: Sequence[InFlight],
    now: float,
) -> list[tuple[Action, Policy]]:
    out: list[tuple[Action, Policy]] = []
    generations: dict[str, int] | None = None
    for f in findings:
        node = view.nodes.get(f.node)
        if f.kind in POD_FINDINGS:
            pod = view.pods.get(f.pod)
            if pod is None or not pod.active or VALIDATION_POD_LABEL in pod.labels:
                continue  # devheal's own validation pod: its failed GPU is its validation's verdict
            policy = policy_for_pod(policies, pod, node)
            if policy is None:
                continue
            kind = pod_groups.member_action(view, pod.workload, policy.actions[pod.workload.cls])
            taint = steer_away(f, view, policy, policies)
            if taint is not None:  # first: the node is tainted before the pod's replacement is scheduled
                out.append(taint)
            if kind is ActionKind.RESTART_GANG:
                if pod_groups.held_by_others(view, pod.workload):
                    continue  # the scheduler (or another) is about to terminate the group: not devheal's to restart
                # One remediation per gang restart: every rank that fails while it runs joins it.
                if generations is None:
                    generations = gang_epochs(view)
                mode = pod_groups.disruption_mode(view, pod.workload)
                out.append(
                    (
                        Action.on_gang(
                            pod,
                            f,
                            policy.name,
                            epoch=generations.get(pod.workload.key, 0),
                            reason=pod_groups.restart_reason(
                                mode, f.kind, pod.key, pod.workload, policy.name, policy.actions[pod.workload.cls]
                            ),
                        ),
                        policy,
                    )
                )
                continue
            out.append(
                (
                    Action.on_pod(
                        kind,
                        pod,
                        f,
                        policy.name,
                        reason=f"{f.kind} on {pod.workload.cls} pod: policy {policy.name} says {kind}",
                    ),
                    policy,
                )
            )
            continue
        if node is None:
            continue
        policy = policy_for_node(policies, node)
        if policy is None:
            continue
        rules = policy.node
        base = Action.on_node(
            ActionKind.TAINT,
            node,
            f,
            policy.name,
            epoch=node.lifts,
        )
        if f.kind is FindingKind.NODE_DEVICES_FAILED:
            if rules.taint and "taint" not in node.owned:
                out.append((replace(base, reason="failed GPUs: keep new pods off the node"), policy))
            if rules.cordon and "cordon" not in node.owned and not node.unschedulable:
                out.append((replace(base, kind=ActionKind.CORDON, reason="failed GPUs: cordon the node"), policy))
            # An idle node with a failed GPU walks the ladder: its other GPUs serve nobody while it is kept
            # off new pods, and a reset or reboot often brings it back. Evicting pods (Drain) takes every
            # GPU failed: one dead GPU is no reason to stop the pods on the healthy ones.
            held = now - f.since
            all_held = now - (f.all_failed_since if f.all_failed_since is not None else f.since)
            # What NVML's recovery action asks of the failed GPUs: where the ladder starts, whether to drain first.
            asked = recovery.requested(view.report(node.name, now), f.device_ids) if rules.ladder else ()
            drain_first = recovery.drains_first(asked)
            if rules.ladder and f.node_idle and held >= rules.remediate_after:
                start = recovery.ladder_start(rules.ladder, asked)
                step, why = escalation_step(rules, node.name, node.lifts, in_flight, now, start.step)
                count = len(f.device_ids)
                failed = "all GPUs" if f.all_devices_failed else f"{count} GPUs" if count > 1 else "a GPU"
                waited = f"{failed} failed for {held:.0f}s (>= {rules.remediate_after:.0f}s), node idle"
                if start.reason:
                    waited += f"; {start.reason}"
                out.append(
                    (
                        replace(
                            base,
                            kind=ActionKind.REMEDIATE_NODE,
                            step=step,
                            reason=why or waited,
                        ),
                        policy,
                    )
                )
            elif (
                rules.ladder
                and rules.remediation is RemediationMode.DRAIN
                and (
                    (f.all_devices_failed and all_held >= rules.remediate_after)
                    or (drain_first and held >= rules.remediate_after)
                )
            ):
                if f.all_devices_failed and all_held >= rules.remediate_after:
                    reason = f"all GPUs failed for {all_held:.0f}s; policy drains busy nodes"
                    reason += f" ({drain_first})" if drain_first else ""
                else:
                    # Peer-to-peer traffic touches the node's other GPUs too: their pods go with it.
                    reason = f"{drain_first}; policy drains busy nodes"
                out.append((replace(base, kind=ActionKind.DRAIN, reason=reason), policy))
        elif f.kind is FindingKind.NODE_RECOVERED and node.owned:
            gate, hold = after_recovery(rules, f, node, in_flight, now)
            if hold is not None:
                if hold.over(now):
                    reason = f"healthy for {now - f.since:.0f}s (hold-down {hold.hold_down.seconds:.0f}s)"
                    out.append((replace(base, kind=ActionKind.LIFT, reason=reason), policy))
            elif gate.next is validation.Next.VALIDATE:
                out.append((replace(base, kind=ActionKind.VALIDATE, step=gate.step, reason=gate.why), policy))
            elif gate.next is validation.Next.ESCALATE:
                check = replace(
                    f, kind=FindingKind.VALIDATION_FAILED, sources=(FindingSource.VALIDATION,), evidence=gate.why
                )
                rung = replace(base, kind=ActionKind.REMEDIATE_NODE, finding=check, step=gate.step, reason=gate.why)
                out.append((rung, policy))
    return out


@dataclass(frozen=True, slots=True)
class LiftHold:
    """A node devheal keeps marked though it is healthy again: it waits out its hold-down (``hold_down_of``)."""

    node: str
    since: float
    """When the node became healthy."""
    hold_down: HoldDown

    @property
    def until(self) -> float:
        """When its marks come due to be lifted, nothing changing meanwhile."""
        return self.since + self.hold_down.seconds

    def over(self, now: float) -> bool:
        """Whether the node has been healthy for its whole hold-down at ``now``: its marks are due to be lifted."""
        return now - self.since >= self.hold_down.seconds

    def message(self) -> str:
        """What a person reading the node's Events needs: since when healthy, until when held, and why."""
        hold = self.hold_down
        text = (
            f"healthy since {format_time(self.since)}; devheal keeps its marks until {format_time(self.until)} "
            f"(hold-down {format_duration(hold.seconds)}"
        )
        if hold.lemon_after:
            return text + (
                f": a lemon, devheal lifted its marks {hold.lifts} time(s) within {format_duration(LEMON_WINDOW)} "
                f"before it became healthy, node.lemonAfter {hold.lemon_after}: no workload lands on it meanwhile; "
                f"to put it back sooner, remove devheal's marks and its annotation {OWNERSHIP_ANNOTATION})"
            )
        if hold.lifts:
            return text + f": doubled for each of its {hold.lifts} lift(s) within the last day)"
        return text + ")"


def lift_holds(
    view: ClusterView,
    findings: Iterable[Finding],
    policies: Sequence[Policy],
    in_flight: Sequence[InFlight],
    now: float,
) -> list[LiftHold]:
    """The nodes whose marks ``decide`` would lift but for their hold-down, as it judges them: devheal marked the
    node, it is healthy again, no remediation of it is under way, nothing left to validate. For the controller to
    say so on the node; the rounds do not need it (``due_times`` wakes them when a hold-down ends)."""
    recovered = [f for f in findings if f.kind is FindingKind.NODE_RECOVERED]
    if not recovered:
        return []  # (most rounds: no pass over the records)
    reads = RecordReads.of(policies)
    in_flight = [r for r in in_flight if reads.still_read(r, now)]  # what ``decide`` reads of them
    held = []
    busy = {r.target for r in in_flight if r.active and r.target_kind is TargetKind.NODE}
    for f in recovered:
        if f.node in busy:
            continue
        node = view.nodes.get(f.node)
        if node is None or not marks_on(node):
            continue  # (a person who took devheal's marks off put the node back: nothing is held)
        policy = policy_for_node(policies, node)
        if policy is None:
            continue
        _, hold = after_recovery(policy.node, f, node, in_flight, now)
        if hold is not None and not hold.over(now):
            held.append(hold)
    return held


def marks_on(node: Node) -> bool:
    """Whether a mark a ``Lift`` removes is still on ``node`` as devheal set it (``Node.owned``): its taint, its
    cordon."""
    if "taint" in node.owned and any(t.key == OWNED_TAINT_KEY and t.effect == OWNED_TAINT_EFFECT for t in node.taints):
        return True
    return "cordon" in node.owned and node.unschedulable


def after_recovery(
    rules: NodeRules, f: Finding, node: Node, in_flight: Sequence[InFlight], now: float
) -> tuple[validation.AfterRepair, LiftHold | None]:
    """What a node devheal marked needs now that it is healthy again (``f``), one gate for ``decide`` and
    ``lift_holds`` alike: the post-repair validation's verdict (``node.validation``: a node a rung brought back
    passes its pod first) and, once that says ``Lift``, the hold-down the lift waits out."""
    gate = validation.after_repair(rules, node, in_flight)
    if gate.next is not validation.Next.LIFT:
        return gate, None
    return gate, LiftHold(node.name, f.since, hold_down_of(rules, node.name, in_flight, now, f.since))


def relevance_horizon(policies: Sequence[Policy]) -> float:
    """How far back (seconds) an ended record can still change a decision beyond its name: gang restarts per
    hour, the workload disruption interval, the lifts that lengthen a hold-down (``InFlightRecords.current``)."""
    intervals = [p.budgets.workload_disruption_interval for p in policies]
    return max([3600.0, lift_window(policies), Budgets().workload_disruption_interval, *intervals])


def lift_window(policies: Sequence[Policy]) -> float:
    """How long a succeeded lift can still lengthen a node's hold-down: ``FLAP_WINDOW``; where some policy counts
    lemons (``node.lemonAfter``), twice ``LEMON_WINDOW``: a lift counts if it came within that window before the
    node became healthy again, and it keeps counting until the node has been healthy for the whole window."""
    return 2 * LEMON_WINDOW if any(p.node.lemon_after for p in policies) else FLAP_WINDOW


GANG_RESTART_WINDOW = 3600.0
"""``budgets.gangRestartsPerHour`` counts the gang restarts started within this window."""


@dataclass(frozen=True, slots=True)
class RecordReads:
    """Which ended records a decision still reads beyond their name, under a set of policies (``still_read``)."""

    disruption_window: float
    """The gang restart window or the longest workload disruption interval, whichever is longer."""
    horizon: float
    """``relevance_horizon``: no shorter than any other window here (``still_read`` relies on it)."""
    lifts: float = FLAP_WINDOW
    """``lift_window``."""
    last_rungs: Mapping[str, int] = field(default_factory=dict)
    """Per policy with a validation (``node.validation``), its ladder's last rung (0 the first)."""

    @classmethod
    def of(cls, policies: Sequence[Policy]) -> RecordReads:
        intervals = [p.budgets.workload_disruption_interval for p in policies]
        window = max([GANG_RESTART_WINDOW, Budgets().workload_disruption_interval, *intervals])
        last_rungs = {p.name: len(p.node.ladder) - 1 for p in policies if p.node.validation is not None}
        return cls(window, relevance_horizon(policies), lift_window(policies), last_rungs)

    def still_read(self, record: InFlight, now: float) -> bool:
        """Whether a decision at ``now`` can still read ``record`` beyond its name. ``decide`` walks through no
        other record, and retention never deletes one of these (``devheal.engine.retention``), so a budget never
        loses a record it counts: a new reading of records in ``decide`` belongs here too.

        Read are: every active record (budgets, one remediation per target); a disruption started within the
        gang restart window or the longest workload disruption interval (``gangRestartsPerHour``, the
        interval); a lift that succeeded within ``lift_window`` (``lift_hold_down``; the spare pools' nodes back
        from repair); a node's mark that succeeded (taint, cordon, fence) and the lifts of marks, within
        ``FLAP_WINDOW`` (``nodes_out``, while the cache has not shown the mark); a node remediation's rung and its
        validation within the horizon (the escalation ladder, ``devheal.engine.validation``)."""
        if record.active:
            return True
        ended = record.finished if record.finished is not None else record.started
        if record.resume is None and now - ended > self.horizon:
            return False  # (most old records: every window below is within the horizon, from a later time)
        if record.disruptive and record.workload and now - record.started < self.disruption_window:
            return True
        if record.action is ActionKind.LIFT and record.phase is Phase.SUCCEEDED:
            return now - ended <= self.lifts
        if record.target_kind == TargetKind.NODE and record.phase is Phase.SUCCEEDED and not record.dry_run:
            # A node's mark that succeeded, and the lift that removed it: ``nodes_out`` counts the node until then.
            effects = KIND_EFFECTS[record.action]
            if Effect.STOPS_NODE_SCHEDULING in effects or Effect.REMOVES_OWN_MARK in effects:
                return now - ended <= FLAP_WINDOW
        if record.action is ActionKind.VALIDATE and record.phase is Phase.FAILED and record.resume is not None:
            # A failed validation after the last rung keeps its node quarantined for good (devheal.engine.validation):
            # read until an operator deletes it.
            last = self.last_rungs.get(record.policy)
            if last is not None and record.resume.step >= last:
                return True
        if record.action in (ActionKind.REMEDIATE_NODE, ActionKind.VALIDATE) and record.resume is not None:
            # A rung, and its validation: where the ladder goes on from (``escalation_step``, ``validation``).
            return now - max(record.started, ended) <= self.horizon
        return False


def decide(
    view: ClusterView,
    findings: Iterable[Finding],
    policies: Sequence[Policy],
    in_flight: Sequence[InFlight],
    now: float,
    settings: Settings = Settings(),
    breaker: Breaker | None = None,
    late: Collection[str] | None = None,
) -> Plan:
    """Decide what to do now. ``policies`` must be sorted by name (the first selecting policy wins).

    ``breaker``: the circuit breaker for this round, already stepped by the caller (``step_breaker``);
    None: stepped from a closed breaker over this view, so this round's findings alone open it. ``late``: the
    names of the remediations past their step timeout (``overdue`` of these records), where the caller has them
    already; None: found here."""
    findings = list(findings)
    # One pass over every record: each is looked up by name; beyond that only the active and the recent ones
    # count (budgets, intervals, hold-downs), so old records cost little more than their names.
    existing: Callable[[str], InFlight | None]
    if isinstance(in_flight, InFlightRecords):  # the host keeps them indexed: no pass over old records at all
        existing = in_flight.get
        if not in_flight.filtered:
            reads = RecordReads.of(policies)
            in_flight = [r for r in in_flight if reads.still_read(r, now)]
    else:
        by_name: dict[str, InFlight] = {}
        current: list[InFlight] = []
        reads = RecordReads.of(policies)
        for r in in_flight:
            by_name[r.name] = r
            if reads.still_read(r, now):
                current.append(r)
        existing, in_flight = by_name.get, current
    active_targets = {(r.target_kind, r.target) for r in in_flight if r.active}
    pod_only = frozenset(c for c in WorkloadClass if all(p.actions.get(c) in POD_TARGETED for p in policies))
    open_ones = [f for f in findings if not _in_hand(f, view, pod_only, active_targets)]
    candidates = _candidate_actions(view, open_ones, policies, in_flight, now)
    candidates += infrastructure.candidates(view, findings, policies)
    candidates += node_signals.candidates(view, findings, policies)  # other tools' node conditions, taints
    candidates += dra.candidates(view, findings, policies, now)  # DRA devices: device taints (engine.dra)
    if any(f.kind is FindingKind.MAINTENANCE_PLANNED for f in findings):  # gangs off a node before maintenance
        candidates += maintenance.candidates(view, findings, policies, gang_epochs(view))
    if any(f.kind in DEGRADATION_FINDINGS for f in findings):  # degraded devices, repair, unknown XIDs
        candidates += degradation_actions(view, findings, policies, gang_epochs(view), now)
    if any(f.kind in STEP_FINDINGS for f in findings):  # slow ranks, stalled gangs (engine.stragglers)
        restarting = {r.workload for r in in_flight if r.active and r.action is ActionKind.RESTART_GANG}
        candidates += step_actions(findings, view, policies, gang_epochs(view), now, restarting)

    # Circuit breaker: too many GPU nodes faulting within the window stops disruptive actions.
    if breaker is None:
        breaker = step_breaker(Breaker(), view, findings, policies, now)
    breaker_open, breaker_reason = breaker.open, breaker.reason
    if not candidates:  # nothing to weigh against the budgets (most rounds)
        return Plan((), (), breaker_open, breaker_reason)

    # Budget state from what is already in flight or already taken out; a remediation past its step
    # timeout no longer holds the concurrency budget. The node budgets count GPU nodes, and any node
    # already out (a GPU node whose device plugin is gone shows no GPU capacity).
    record_policy = policy_of(policies)
    out_nodes = nodes_out(view, in_flight, record_policy)
    fleet = gpu_fleet(view, policies)  # a narrowed view's left-out nodes too (never out: nothing marks them)
    selected_nodes = list(fleet.nodes)
    counted = {n.name for n in selected_nodes}
    selected_nodes += [
        view.nodes[name]
        for name in sorted(out_nodes - counted)
        if policy_for_node(policies, view.nodes[name]) is not None
    ]
    if late is None:
        late = {o.record.name for o in overdue(in_flight, policies, now)}
    disrupting = list(filter(Disrupting(policies), in_flight))
    concurrent = sum(1 for r in disrupting if r.active and r.name not in late)
    last_disruption: dict[str, float] = {}
    gang_restarts: Counter[str] = Counter(
        r.workload for r in disrupting if r.action is ActionKind.RESTART_GANG and r.workload and now - r.started < 3600
    )
    for r in disrupting:
        if r.workload:
            last_disruption[r.workload] = max(last_disruption.get(r.workload, 0.0), r.started)

    actions: list[Action] = []
    blocked: list[Blocked] = []
    planned_targets: set[tuple[TargetKind, str]] = set()
    queue = deque(candidates)
    while queue:
        candidate, own = queue.popleft()
        dry = settings.dry_run or own.dry_run
        # Dry-run before naming it (a dry-run decision has its own name); its effects under its policy.
        action = replace(candidate, dry_run=dry, effects=effects_of(candidate.kind, own))
        prior = existing(action.name)
        if prior is not None and prior.phase is not Phase.BLOCKED:
            continue  # decided before (in flight, done, recorded as dry-run, or failed): never twice
        target = (action.target_kind, action.target)
        # One remediation at a time per target: the next step waits for the current one to end (a step up the
        # escalation ladder takes over from the node's earlier steps, which stay in progress).
        if target in planned_targets or (target in active_targets and not _supersedes(action, in_flight)):
            continue
        if settings.paused or own.paused:
            blocked.append(
                Blocked(action, "devheal is paused" if settings.paused else f"policy {own.name} is paused", Rail.PAUSED)
            )
            continue
        held_off = _under_maintenance(action, view)
        if held_off:
            blocked.append(Blocked(action, held_off, Rail.NODE_MAINTENANCE))
            continue
        if action.waits:  # its policy's own timing: recorded, so operators see what it waits for
            blocked.append(Blocked(action, action.waits, Rail.NEXT_CHECKPOINT))
            continue
        if dry:
            actions.append(action)
            planned_targets.add(target)
            continue
        if action.stopped_by_breaker and breaker_open:
            blocked.append(Blocked(action, breaker_reason, Rail.CIRCUIT_BREAKER))
            continue
        budgets = own.budgets
        if action.takes_node and action.node not in out_nodes:
            selected = len(selected_nodes) + fleet.rest_count
            limit = budgets.max_unhealthy_nodes.of(selected)
            if len(out_nodes) + 1 > limit:
                blocked.append(
                    Blocked(
                        action,
                        f"max unhealthy nodes {budgets.max_unhealthy_nodes} reached: {len(out_nodes)} of "
                        f"{selected} GPU nodes already out ({', '.join(sorted(out_nodes))})",
                        Rail.MAX_UNHEALTHY_NODES,
                    )
                )
                continue
            node = view.nodes.get(action.node)
            pool = node.labels.get(budgets.pool_label, "") if node is not None else ""
            pool_nodes = [n for n in selected_nodes if n.labels.get(budgets.pool_label, "") == pool]
            pool_out = sum(1 for n in pool_nodes if n.name in out_nodes)
            pool_size = len(pool_nodes) + fleet.rest_in_pool(budgets.pool_label, pool)
            pool_limit = budgets.max_unhealthy_nodes_per_pool.of(pool_size)
            if pool_out + 1 > pool_limit:
                blocked.append(
                    Blocked(
                        action,
                        f"max unhealthy nodes per pool {budgets.max_unhealthy_nodes_per_pool} reached in pool "
                        f"{pool or '(none)'}: {pool_out} of {pool_size} out",
                        Rail.MAX_UNHEALTHY_NODES_PER_POOL,
                    )
                )
                continue
        if action.disruptive:
            if concurrent + 1 > budgets.max_concurrent_remediations:
                blocked.append(
                    Blocked(
                        action,
                        f"max concurrent remediations {budgets.max_concurrent_remediations} reached",
                        Rail.MAX_CONCURRENT,
                    )
                )
                continue
            if action.kind is ActionKind.RESTART_GANG and action.workload is not None:
                restarts = gang_restarts.get(action.workload.key, 0)
                if restarts >= budgets.gang_restarts_per_hour:
                    blocked.append(
                        Blocked(
                            action,
                            f"gang {action.workload.key} restarted {restarts} times in the last hour "
                            f"(budget {budgets.gang_restarts_per_hour}/h): falling back to the workload's own "
                            "failure handling",
                            Rail.GANG_BUDGET,
                        )
                    )
                    # Fail the broken pod instead, so the Job/JobSet's own failure policy decides; only a rank
                    # the finding names (a stall that names nobody accuses no pod: failing one would be arbitrary).
                    finding = action.finding
                    if finding.pod and finding.pod_uid:
                        fallback = replace(
                            action,
                            kind=ActionKind.FAIL_POD,
                            target_kind=TargetKind.POD,
                            target=finding.pod,
                            target_uid=finding.pod_uid,
                            epoch=0,
                            dry_run=False,
                            reason=f"gang restart budget spent: fail {finding.pod} and let {action.workload.kind} "
                            f"{action.workload.name} handle it",
                        )
                        queue.append((fallback, own))
                    continue
                gang_restarts[action.workload.key] = restarts + 1
            if action.workload is not None:
                last = last_disruption.get(action.workload.key)
                if last is not None and now - last < budgets.workload_disruption_interval:
                    blocked.append(
                        Blocked(
                            action,
                            # No running count in the reason: a changed reason is recorded (and announced) again.
                            f"workload {action.workload.key} was disrupted at {format_time(last)} "
                            f"(at most one disruptive action per {budgets.workload_disruption_interval:.0f}s)",
                            Rail.WORKLOAD_INTERVAL,
                        )
                    )
                    continue
                last_disruption[action.workload.key] = now
            concurrent += 1
        if action.takes_node:
            out_nodes.add(action.node)
        actions.append(action)
        planned_targets.add(target)
    actions.sort(key=lambda a: not a.marks_node)  # (stable: otherwise in the order decided)
    return Plan(tuple(actions), tuple(blocked), breaker_open, breaker_reason)
