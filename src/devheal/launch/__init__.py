"""The launcher: runs a training command inside its pod and restarts it in place when its gang restarts.

``devheal launch -- CMD ARGS`` (``devheal.cli.launch``) wraps the command; training code
imports only ``report_step``, ``report_joined``, ``report_checkpoint``, ``report_collective`` and the
collective marks (``collective``, ``enter_collective``, ``leave_collective``) from here, which need nothing
but the standard library, so
``from devheal.launch import report_step`` stays cheap in the training process. See
docs/gangs.md for the contract with the controller.
"""

from devheal.launch.reporting import (
    collective,
    enter_collective,
    leave_collective,
    report_checkpoint,
    report_collective,
    report_joined,
    report_step,
)

__all__ = [
    "collective",
    "enter_collective",
    "leave_collective",
    "report_checkpoint",
    "report_collective",
    "report_joined",
    "report_step",
]
