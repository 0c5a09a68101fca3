"""A rank replaced right after its gang's next checkpoint (``ReplaceAtCheckpoint``), so the restart rolls back no work.

Every rank of a gang restarted in place resumes from the gang's last checkpoint. Restarting at once to replace a
slow rank (a straggler, or a rank on a degraded GPU) throws away the work done since that checkpoint, on average
half a checkpoint interval for every GPU of the gang; waiting for the next checkpoint costs only the slow rank's
slowdown until then (a fraction of the same time), after which the restart loses nothing. Where the ranks'
launchers publish when their run last saved a checkpoint (``devheal.launch.report_checkpoint``, ``checkpoint`` in
``devheal.io/steps``), the gang restarts once one is newer than the finding; where none comes within the policy's
``stragglers.checkpointWithin`` of the finding (the workload reports none, or checkpoints rarely), at once.

Pure: the view, the finding's time and the rule in, the reason to restart now (or "") out.
"""

from __future__ import annotations

from devheal.model.cluster import ClusterView, Pod


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
