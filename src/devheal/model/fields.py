"""Reading the fields of outside input: one reader per kind of field, one wording per kind of mistake.

Every parser of what devheal reads from outside (a RemediationPolicy and its sections, the agent's
classification table, the API objects the controller projects) reads its fields with these, so a
mistake is worded the same wherever it is made: the object and the field (``where``, e.g.
``RemediationPolicy p: spec.node.taint``), what was expected, and what was given (``values.show``)::

    RemediationPolicy p: spec.node.taint: expected true or false, got 'yes'
    RemediationPolicy p: spec.stragglers: unknown field(s) stal; expected action, minRanks, ...

Each reader takes the error class to raise (``error``: ``PolicyError``, ``ClassificationError``,
``ProjectionError``; ``FieldError`` when none is given) rather than raising one of its own that the
callers' classes subclass: the section parsers already take their caller's class (``parse_degradation(value,
where, PolicyError)``), the agent and the controller declare theirs in the shell, which the model must not
import, and callers and the fuzz tests catch exactly the class a parser declares. Absent fields (``None``)
read as the default the caller gives. Durations are ``times.parse_duration``'s and numbers
``values.whole_number``'s: these only word the errors around them. Pure.

No schema library (msgspec, pydantic): their validation errors are worded their way ("Expected `bool`, got
`str` - at `$.spec.node.taint`"), so each parser would still catch and reword them to keep the messages
operators read; the cross-field rules (leaveAfter >= enterAfter, a rung's kinds unique, a percentage's
bound) stay code either way; and parsing is not where time goes (the recommended policy parses in about
60 microseconds, once per change of the policy). A dependency would buy little here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any, TypeVar

from devheal.model import times
from devheal.model.values import INT64_MAX, show, whole_number


class FieldError(ValueError):
    """A field of outside input is wrong; the message names the object, the field and what was expected."""


C = TypeVar("C", bound=StrEnum)


def expected(where: str, what: str, value: object, error: type[ValueError] = FieldError) -> ValueError:
    """The error to raise: ``{where}: expected {what}, got {value}``."""
    return error(f"{where}: expected {what}, got {show(value)}")


def mapping(
    value: Any,
    where: str,
    error: type[ValueError] = FieldError,
    *,
    fields: Collection[str] | None = None,
    noun: str = "an object",
    required: bool = False,
) -> Mapping[str, Any]:
    """An object field (``{}`` when absent, unless ``required``); with ``fields``, one that holds no other field."""
    if value is None and not required:
        return {}
    # A dict first: the ABC's isinstance is several times slower, and projections read many objects per pod.
    if not isinstance(value, dict) and not isinstance(value, Mapping):
        raise error(f"{where}: expected {noun}, got {type(value).__name__}")
    if fields is not None:
        check_fields(value, fields, where, error)
    return value


def unknown_fields(value: Mapping[Any, Any], fields: Collection[str]) -> list[str]:
    """The names in ``value`` that are not in ``fields``, sorted."""
    for key in value:  # the common case, cheaply: every name is known
        if key not in fields:
            return sorted(str(k) for k in value if k not in fields)
    return []


def check_fields(
    value: Mapping[Any, Any], fields: Collection[str], where: str, error: type[ValueError] = FieldError
) -> None:
    """Raises when ``value`` holds a field not in ``fields`` (a typo would otherwise be ignored)."""
    unknown = unknown_fields(value, fields)
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)}; expected {', '.join(sorted(fields))}")


def sequence(value: Any, where: str, error: type[ValueError] = FieldError) -> list[Any]:
    """A list field (``[]`` when absent)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise error(f"{where}: expected a list, got {type(value).__name__}")
    return value


def choice(
    value: Any,
    kind: type[C],
    default: C | None,
    where: str,
    error: type[ValueError] = FieldError,
    *,
    options: Collection[C] | None = None,
) -> C:
    """A member of ``kind`` by its value (of ``options`` when given); absent: ``default`` (required when None)."""
    if value is None and default is not None:
        return default
    try:
        member = kind(value)  # the enum's own lookup by value; any other value raises ValueError
    except ValueError:
        pass
    else:
        if options is None or member in options:
            return member
    allowed = kind if options is None else options
    raise expected(where, f"one of {', '.join(m.value for m in allowed)}", value, error)


def flag(value: Any, default: bool, where: str, error: type[ValueError] = FieldError) -> bool:
    """``true`` or ``false`` (never a string or a number); absent: ``default``."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise expected(where, "true or false", value, error)
    return value


def whole(
    value: Any,
    default: int | None,
    where: str,
    error: type[ValueError] = FieldError,
    *,
    minimum: int = 0,
    maximum: int = INT64_MAX,
    text: bool = False,
) -> int:
    """A whole number in [minimum, maximum] (``values.whole_number``); absent: ``default`` (required when None)."""
    if value is None and default is not None:
        return default
    number = whole_number(value, minimum=minimum, maximum=maximum, text=text)
    if number is None:
        raise expected(where, f"a whole number from {minimum} to {maximum}", value, error)
    return number


def duration(
    value: Any, default: float, where: str, error: type[ValueError] = FieldError, *, positive: bool = False
) -> float:
    """``30s``, ``5m``, ``1h30m`` -> seconds (``times.parse_duration``); absent: ``default``.

    ``positive``: 0s is refused too (a timeout or a window of nothing)."""
    if value is None:
        return default
    seconds = times.parse_duration(value, where, error=error)
    if positive and seconds <= 0:
        raise expected(where, "a duration above 0s", value, error)
    return seconds


def string(value: Any, default: str, where: str, error: type[ValueError] = FieldError) -> str:
    """A string; absent: ``default``."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise expected(where, "a string", value, error)
    return value
