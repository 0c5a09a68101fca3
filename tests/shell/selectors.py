"""Label and field selectors, as the API server reads ``labelSelector`` and ``fieldSelector``.

Labels: ``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``.
Fields: ``a.b=v``, ``a.b==v``, ``a.b!=v`` on any dotted path (the real server allows only
a few paths per kind; a missing field reads as the empty string).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Matcher = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")


class SelectorError(ValueError):
    """The selector does not parse (the server answers 400 BadRequest)."""


def _terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


def _equality(term: str) -> tuple[str, str, str]:
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = term.partition(op)
            if not key.strip():
                raise SelectorError(f"selector term {term!r} has no key")
            return key.strip(), "!=" if op == "!=" else "=", value.strip()
    raise SelectorError(f"selector term {term!r} has no operator")


def label_matcher(text: str) -> Matcher:
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _terms(text):
        found = _SET.match(term)
        if found:
            key, op = found["key"], found["op"]
            values = {v.strip() for v in found["values"].split(",")}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif term.startswith("!"):
            absent = term[1:].strip()
            checks.append(lambda labels, k=absent: k not in labels)
        elif not any(op in term for op in "=!"):
            checks.append(lambda labels, k=term: k in labels)
        else:
            key, op, value = _equality(term)
            if op == "=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return match


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return ""
        cur = cur[part]
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return "" if cur is None else str(cur)


def field_matcher(text: str) -> Matcher:
    terms = [_equality(term) for term in _terms(text)]

    def match(obj: dict[str, Any]) -> bool:
        return all((field_value(obj, key) == value) == (op == "=") for key, op, value in terms)

    return match


def matcher(label_selector: str = "", field_selector: str = "") -> Matcher:
    labels = label_matcher(label_selector)
    fields = field_matcher(field_selector)
    return lambda obj: labels(obj) and fields(obj)
