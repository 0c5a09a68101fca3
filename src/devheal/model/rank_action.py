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
