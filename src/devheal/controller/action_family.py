"""The one interface every action family implements, and what its passes return or raise.

``Actuators`` (the facade in ``devheal.controller.actuators``) records a decision's intent,
then hands the action to the ``Actuator`` registered for its ``ActionKind``, then records
the ``Outcome``. An actuator only acts: it never writes the Remediation's status or
Events itself, and it checks its target before every disruptive step, so a pass that is
repeated (after a crash, or to carry a multi-pass action on) repeats nothing disruptive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from devheal.kube.client import Obj
from devheal.model.plan import Action, Phase
from devheal.model.policy import Policy

Policies = Callable[[], Mapping[str, Policy]]
"""The policies in force, by name (read at each pass: policies change while actions run)."""


@dataclass
class Outcome:
    phase: Phase
    reason: str
    message: str


Steps = list[str]
"""Names of the steps a pass took (``condition``, ``evict``, ``taint``...), added to the record's ``status.steps``."""


class StepFailed(Exception):
    """The action could not be taken now; ``retry`` says whether trying later may help."""

    def __init__(self, message: str, *, retry: bool, reason: str) -> None:
        super().__init__(message)
        self.retry = retry
        self.reason = reason


class Actuator(Protocol):
    async def act(self, action: Action, record: Obj) -> tuple[Outcome, Steps]:
        """One pass of ``action``; ``record`` is its Remediation as read when the pass began.

        Returns the outcome and the steps taken; raises ``StepFailed`` when the action cannot
        be taken now."""
        ...


def split_key(key: str) -> tuple[str, str]:
    """``namespace/name`` -> (namespace, name)."""
    ns, _, name = key.partition("/")
    return ns, name
