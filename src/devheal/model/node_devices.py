"""The NodeDevices contract: the names the node agent writes and the controller reads, defined once.

The node agent (``devheal.agent``) publishes one cluster-scoped ``NodeDevices`` object per node
(``devheal/crds/nodedevices.yaml``) and the node condition ``devheal.io/DevicesHealthy``; the
controller projects the object into a ``NodeDevicesReport`` (``devheal.model.cluster``) and decides on
the labels and remedies of its devices' reasons.
"""

from __future__ import annotations

from enum import StrEnum

KIND = "NodeDevices"
PLURAL = "nodedevices"
NODE_CONDITION = "devheal.io/DevicesHealthy"
"""The node condition the agent keeps beside its NodeDevices object."""

UNKNOWN_XID = "UnknownXid"
"""The reason label (and message prefix) of an XID without a row in the agent's classification table."""
REPEATED_XID = "RepeatedXid"
"""The reason label (and message prefix) of a GPU that failed again within the agent's ``repeatedXid.window``."""


class Remedy(StrEnum):
    """What an operator (or the controller) should do about a reason, cheapest first (a reason's ``remedy``)."""

    NONE = "None"
    RESTART_WORKLOAD = "RestartWorkload"
    RESET_GPU = "ResetGPU"
    REBOOT_NODE = "RebootNode"
    REPLACE_HARDWARE = "ReplaceHardware"
    """Drain the node and repair or replace the GPU: another reset will not help."""


def reported_remedy(value: object) -> Remedy | None:
    """A reported reason's ``remedy`` field; None: the agent did not say (one older than the field), or named a
    remedy this version does not know (the CRD accepts only ``Remedy``'s values)."""
    try:
        return Remedy(value) if isinstance(value, str) and value else None
    except ValueError:
        return None
