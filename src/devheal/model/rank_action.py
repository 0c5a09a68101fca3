"""What devheal does about one rank of a gang it suspects: a straggler, or a rank on a degraded device.

One vocabulary for the ``stragglers.action`` and ``degradation.gang`` policy fields.
"""

from __future__ import annotations

from enum import StrEnum


class RankAction(StrEnum):
    NOTIFY = "Notify"
    """Record it (a Notify Remediation on the rank and its Event); nothing is replaced."""
    REPLACE_AT_RESTART = "ReplaceAtRestart"
    """Record it, and replace the rank the next time the gang restarts for any reason."""
    REPLACE_NOW = "ReplaceNow"
    """Restart the gang in place at once, replacing the rank."""
    REPLACE_AT_CHECKPOINT = "ReplaceAtCheckpoint"
    """Restart the gang in place replacing the rank right after the gang's next checkpoint (its launchers report
    them), so the restart rolls back no work; at once when none is reported within ``stragglers.checkpointWithin``
    (``devheal.engine.checkpoints``)."""

    @property
    def restarts(self) -> bool:
        """Whether the gang restarts for the rank by itself (at once or at its next checkpoint), not only at the
        gang's next restart for another cause."""
        return self in (RankAction.REPLACE_NOW, RankAction.REPLACE_AT_CHECKPOINT)
