"""A rank replaced right after its gang's next checkpoint (``ReplaceAtCheckpoint``), so the restart rolls back no work.

Every rank of a gang restarted in place resumes from the gang's last checkpoint. Restarting at once to replace a
slow rank (a straggler, or a rank on a degraded GPU) throws away the work done since that checkpoint, on average
half a checkpoint interval for every GPU of the gang; waiting for the next checkpoint costs only the slow rank's
slowdown until then (a fraction of the same time), after which the restart loses nothing. Where the ranks'
launchers publish when their run last saved a checkpoint (``devheal.launch.report_checkpoint``, ``checkpoint`` in
``devheal.io/steps``), the gang restarts once one is newer than the finding; where none comes within the policy's
``stragglers.checkpointWithin`` of the finding (the workload reports none, or checkpoints rarely), at once.

Until then the restart is decided with what it waits for (``waiting_for``) and recorded Blocked
(``Rail.NEXT_CHECKPOINT``), so ``kubectl get remediations`` shows the slow rank in hand, not forgotten.

Pure: the view, the finding's time and the rule in, the reason to restart now (or "") out.
"""

from __future__ import annotations

from devheal.model.cluster import ClusterView, Pod
from devheal.model.times import format_time


def newest_checkpoint(view: ClusterView, pod: Pod) -> float | None:
    """When a rank of ``pod``'s gang (its active members) last reported a checkpoint of its current run; None when
    none did. One rank's report is enough: with DDP only rank 0 saves, and a workload reports once its checkpoint is
    whole (docs/stragglers.md)."""
    ranks = view.workload_pods(pod.workload.key)
    saved = [p.steps.checkpoint for p in ranks if p.active and p.steps is not None and p.steps.checkpoint is not None]
    return max(saved) if saved else None


def restart_now(view: ClusterView, pod: Pod, since: float, now: float, within: float) -> str:
    """Why the gang of ``pod``, whose rank was found at ``since``, may restart now: a checkpoint its ranks reported
    since then, or none within ``within`` seconds of it; "" while it waits for one."""
    saved = newest_checkpoint(view, pod)
    if saved is not None and saved >= since:
        return f"the gang saved a checkpoint {now - saved:.0f}s ago, after the rank was found"
    if now - since >= within:
        return f"no checkpoint reported within {within:.0f}s of finding the rank"
    return ""


def waiting_for(pod: Pod, since: float, within: float) -> str:
    """Why the gang restart that replaces ``pod`` (found at ``since``) waits: the same words every round it waits
    (a Blocked record is written again only when its reason changes)."""
    return (
        f"replacing rank {pod.key} waits for gang {pod.workload.key}'s next checkpoint, so the restart rolls no "
        f"work back: at most until {format_time(since + within)} (stragglers.checkpointWithin {within:.0f}s)"
    )


def restart_timing(view: ClusterView, pod: Pod, since: float, now: float, within: float) -> tuple[str, str]:
    """``ReplaceAtCheckpoint``'s answer for the gang of ``pod``: (why it may restart now, "") or ("", why it waits,
    ``waiting_for``)."""
    when = restart_now(view, pod, since, now, within)
    return (when, "") if when else ("", waiting_for(pod, since, within))
