"""Ranks that never join a gang's restart in place: when a restart stops waiting for them and replaces them.

A gang restarted in place runs its new generation once every rank has acknowledged it (its
in-place agent stopped the training process and reached its barrier). A rank whose agent never
does (its process stuck in the kernel and unkillable, its node's network cut, its launcher gone)
would hold the whole gang until the restart's timeout, while its peers' barriers give up on it
and start a training run that cannot complete without it. So once every other rank has
acknowledged, a rank that has run the generation without acknowledging it for
``stragglers.stall.joinAfter`` (default 120 s, the launcher's default ``--barrier-timeout``) is
replaced within the same restart, like a rank with a finding: same remediation, same rails.
A restart does this once: when a replacement does not join either, the cause is something a
new pod does not change (the launcher's permissions, the image), and the restart's timeout ends
it naming the rank.

Only a rank that runs and carries the generation is waited for here: a replacement still pending
(scheduling, pulling its image) is the restart's timeout's business, and a rank of a gang without
in-place agents counts as back once it carries the generation. A rank's wait starts when a pass
first sees it carry the generation unacknowledged (``JoinWatch`` keeps that between passes; a new
controller starts counting afresh, later rather than sooner).

Pure; time is passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from devheal.model.cluster import Pod


@dataclass
class JoinWatch:
    """One restart's ranks waited for, and since when; ``not_joined`` gives those to replace now."""

    waiting: dict[str, float] = field(default_factory=dict)
    """Pod UID -> when it was first seen running the restart's generation without acknowledging it."""

    def not_joined(
        self,
        ranks: Sequence[Pod],
        back: Collection[str],
        size: int,
        generation: int,
        join_after: float,
        now: float,
        *,
        replaced_before: bool = False,
    ) -> list[Pod]:
        """The ranks to replace for not joining ``generation``: each has run it unacknowledged for ``join_after``,
        and every other rank is back. Empty while any other rank is not back (or missing: fewer than ``size``).

        ``ranks``: the restart's members not being replaced (active); ``back``: UIDs of those running the
        generation (acknowledged, or carrying it where the gang has no in-place agents); ``size``: how many ranks
        the gang has; ``replaced_before``: this restart already replaced ranks for not joining it (nobody is
        replaced again; the wait is still kept)."""
        waiting = [
            p for p in ranks if p.uid not in back and p.phase == "Running" and p.restart_generation >= generation
        ]
        self.waiting = {p.uid: self.waiting.get(p.uid, now) for p in waiting}
        late = [p for p in waiting if now - self.waiting[p.uid] >= join_after]
        if not late or replaced_before:
            return []
        joined = sum(1 for p in ranks if p.uid in back)
        if joined + len(late) < max(size, len(ranks)):
            return []  # another rank is not back (or not there yet): the gang waits for it anyway
        return sorted(late, key=lambda p: p.key)
