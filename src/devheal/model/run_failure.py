"""A failed run its launcher holds for a restart, as published on its pod (annotation ``devheal.io/launcher-failed``).

With ``devheal launch --hold-failed SECONDS`` a launcher whose training command exits by
itself with a non-zero code does not exit at once: it writes this annotation on its own pod
and waits up to the hold for a higher restart generation, which restarts the command in
place (its acknowledgement removes the annotation). The controller's cache reads it into
``Pod.run_failure``; the engine restarts the gang (``devheal.engine.stragglers.failed_runs``).

The value is a compact JSON object::

    {"code": 79, "at": 1764587000.25, "generation": 3}

- ``code``: the command's exit code (1..255; 128+N for signal N);
- ``at``: when it exited (Unix seconds, the launcher's wall clock);
- ``generation``: the restart generation of the run that failed.

Pure. ``parse_run_failure`` never raises: anything else is refused with the reason, and the
pod counts as holding no failed run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from devheal.model.steps import MAX_TIMESTAMP, MIN_TIMESTAMP
from devheal.model.values import finite, json_object, show, whole_number

RUN_FAILURE_ANNOTATION = "devheal.io/launcher-failed"
MAX_ANNOTATION_LENGTH = 256
"""Longer is not what a launcher writes: not read at all."""


@dataclass(frozen=True, slots=True)
class RunFailure:
    """A training command's run that exited by itself with a non-zero code, held by its launcher."""

    code: int
    at: float
    generation: int

    def to_annotation(self) -> str:
        """The annotation value the launcher writes (compact JSON)."""
        return json.dumps(
            {"code": self.code, "at": round(self.at, 3), "generation": self.generation}, separators=(",", ":")
        )


def parse_run_failure(text: object) -> tuple[RunFailure | None, str]:
    """The failed run in an annotation value, or (None, why it is refused)."""
    body, why = json_object(text, MAX_ANNOTATION_LENGTH)
    if body is None:
        return None, why
    code = whole_number(body.get("code"), minimum=1, maximum=255)
    if code is None:
        return None, f"code: expected an exit code within 1..255, got {show(body.get('code'))}"
    at = finite(body.get("at"), minimum=MIN_TIMESTAMP, maximum=MAX_TIMESTAMP)
    if at is None:
        within = f"{MIN_TIMESTAMP:g}..{MAX_TIMESTAMP:g}"
        return None, f"at: expected Unix seconds within {within}, got {show(body.get('at'))}"
    generation = whole_number(body.get("generation"))
    if generation is None:
        return None, f"generation: expected a whole number >= 0, got {show(body.get('generation'))}"
    return RunFailure(code=code, at=at, generation=generation), ""
