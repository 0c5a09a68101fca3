"""``devheal`` with a crash injected, for the crash-resume tests: the process exits with ``EXIT_STATUS`` right
after the controller records the intent of an action, before the action's first step.

Run as a script in place of ``python -m devheal`` (``ControllerHarness.start(crash_after_intent=True)`` does):
it replaces every action family's actuator with one that exits, then runs devheal's command line. ``Actuators``
hands an action to its family only once the intent is stored, so the exit lands exactly between the two.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, NoReturn

from devheal.cli.app import main
from devheal.controller.actuators import Actuators
from devheal.kube.client import Obj
from devheal.model.plan import Action

SCRIPT = Path(__file__)
EXIT_STATUS = 70

log = logging.getLogger(__name__)


class ExitBeforeActing:
    """An actuator whose every pass ends the process at once, as a crash would (no cleanup, no flush)."""

    async def act(self, action: Action, record: Obj) -> NoReturn:
        log.error("crash injected: exiting after recording the intent of %s", action.name)
        os._exit(EXIT_STATUS)


def install() -> None:
    """Make every ``Actuators`` built from now on crash instead of acting."""
    build = Actuators.__init__

    def crashing(self: Actuators, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        self.families = dict.fromkeys(self.families, ExitBeforeActing())

    Actuators.__init__ = crashing  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    main()
