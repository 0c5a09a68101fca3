"""Kubernetes label selectors (``matchLabels`` and ``matchExpressions``), as policies write them. Pure.

``parse_selector`` takes its caller's error class, so its messages name the object and the
field like the rest of the caller's parser (``devheal.model.policy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devheal.model import fields
from devheal.model.values import show

_LABEL_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: tuple[tuple[str, str], ...] = ()
    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        # No generator for what is empty: every round asks this of every node and pod it looks at.
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        return not self.requirements or all(r.matches(labels) for r in self.requirements)


def parse_selector(value: Any, where: str, error: type[ValueError]) -> LabelSelector:
    """``matchLabels``/``matchExpressions`` -> ``LabelSelector``; raises ``error`` naming the field."""
    spec = fields.mapping(value, where, error)
    labels = fields.mapping(spec.get("matchLabels"), f"{where}.matchLabels", error)
    for key, val in labels.items():
        if not isinstance(val, str):
            raise error(f"{where}.matchLabels.{key}: expected a string, got {show(val)}")
    expressions = spec.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise error(f"{where}.matchExpressions: expected a list, got {type(expressions).__name__}")
    reqs = []
    for i, expr in enumerate(expressions):
        at = f"{where}.matchExpressions[{i}]"
        expr = fields.mapping(expr, at, error)
        op = expr.get("operator")
        if op not in _LABEL_OPS:
            raise error(f"{at}.operator: expected one of {', '.join(_LABEL_OPS)}, got {show(op)}")
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise error(f"{at}.values: expected a list of strings, got {show(values)}")
        if op in ("In", "NotIn") and not values:
            raise error(f"{at}.values: operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise error(f"{at}.values: operator {op} takes no values")
        if not isinstance(expr.get("key"), str) or not expr.get("key"):
            raise error(f"{at}.key: expected a label key")
        reqs.append(LabelRequirement(str(expr["key"]), str(op), frozenset(str(v) for v in values)))
    return LabelSelector(tuple(sorted((str(k), str(v)) for k, v in labels.items())), tuple(reqs))
