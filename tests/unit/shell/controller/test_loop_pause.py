"""How long the controller's loop waits after a round: a share of the loop for the watches and the work queue."""

from __future__ import annotations

import pytest

from devheal.controller.loop import BACKLOG_PAUSE, COALESCE, PAUSE_MAX, pause_after


def test_while_work_waits_beyond_the_workers_rounds_take_a_quarter_of_the_loop() -> None:
    """A storm's backlog: more work waiting than the workers take at once leaves the queue three times the round."""
    assert pause_after(0.2, waiting=32, workers=32) == 0.2, "the workers take all that waits: half"
    assert pause_after(0.2, waiting=33, workers=32) == pytest.approx(0.2 * BACKLOG_PAUSE)
    assert pause_after(0.001, waiting=5000, workers=32) == COALESCE, "a cheap round is not held back"
    assert pause_after(1.0, waiting=5000, workers=32) == PAUSE_MAX, "never near the liveness limit"
