"""How a gang member restarts in place: the names the controller, the launcher and the cluster probe share.

Two mechanisms react to a rise of the pod annotation ``devheal.io/restart-generation``: the devheal
launcher, and KEP-5532 ``RestartAllContainers`` (``devheal.engine.inplace`` reads which one a pod has).
"""

from __future__ import annotations

from enum import StrEnum

RESTART_ALL_CONTAINERS = "RestartAllContainers"
"""The ``restartPolicyRules[].action`` that restarts every container of the pod."""
RESTART_ALL_FEATURE = "RestartAllContainersOnContainerExits"
"""The feature gate, and the name nodes list in ``status.declaredFeatures`` when their kubelet supports it."""
DEFAULT_TRIGGER_EXIT_CODE = 88
"""The exit code ``devheal sidecar`` ends with on a new generation, unless told otherwise."""


class InPlaceRestart(StrEnum):
    LAUNCHER = "launcher"
    RESTART_ALL_CONTAINERS = "RestartAllContainers"
    NONE = "none"
    """Nothing in the pod reacts to a new restart generation."""
