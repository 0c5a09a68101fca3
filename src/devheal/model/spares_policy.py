"""The ``spares`` section of a ``RemediationPolicy``: a pool of warm spare nodes for gang ranks.

Spec (no section: no pool)::

    spares:
      nodeSelector:                    # required: the nodes that may serve as spares
        matchLabels: {devheal.io/spare-pool: "true"}
      size: 2                          # idle, healthy spares kept reserved (0 to 1000)
      promoteIdleNodes: true           # below size, reserve idle healthy nodes of the selector;
                                       # false: only nodes back from repair refill the pool

devheal reserves a spare with its taint ``devheal.io/spare=true:NoSchedule`` and label
``devheal.io/spare=true`` (``devheal.engine.spares``), so ordinary pods do not land there; a
replaced gang rank is nominated to a spare and given the toleration (docs/gangs.md).

Pure. ``parse_spares`` takes its caller's error class (``PolicyError``) and label-selector
parser, so its messages name the policy and the field like every other part of the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devheal.model import fields

if TYPE_CHECKING:
    from devheal.model.selectors import LabelSelector

MAX_SIZE = 1000
"""The largest pool a policy may ask for (more is a typo, not a fleet's spare budget)."""
_FIELDS = frozenset({"nodeSelector", "size", "promoteIdleNodes"})


@dataclass(frozen=True, slots=True)
class SparePool:
    node_selector: LabelSelector
    """The nodes that may serve as spares (within the policy's own node selector)."""
    size: int
    """How many idle, healthy spares devheal keeps reserved."""
    promote_idle: bool = True
    """Whether an idle healthy node of the selector may be reserved when the pool is short; without it, only
    nodes that come back from repair (devheal lifted its marks) refill it."""


def parse_spares(
    value: Any,
    where: str,
    error: type[ValueError],
    selector: Callable[[Any, str], LabelSelector],
) -> SparePool | None:
    """``spec.spares`` -> ``SparePool`` (None when absent); raises ``error`` naming the field and what was
    expected. ``selector`` parses a label selector (``matchLabels``/``matchExpressions``)."""
    if value is None:
        return None
    spec = fields.mapping(value, where, error, fields=_FIELDS)
    if spec.get("nodeSelector") is None:
        raise error(
            f"{where}.nodeSelector: required: the nodes that may serve as spares, e.g. "
            '{matchLabels: {devheal.io/spare-pool: "true"}}'
        )
    size = fields.whole(spec.get("size"), None, f"{where}.size", error, maximum=MAX_SIZE)
    promote = fields.flag(spec.get("promoteIdleNodes"), True, f"{where}.promoteIdleNodes", error)
    return SparePool(selector(spec["nodeSelector"], f"{where}.nodeSelector"), size, promote)
