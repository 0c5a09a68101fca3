"""Values that cross the boundary: whole numbers read strictly, values shown safely, label values.

Python's own readers are more lenient than Kubernetes: ``int()`` takes ``'٣'``, ``'１２'``,
``' 7 '`` and ``'1_000'``, ``float()`` takes ``'inf'``, ``'nan'`` and ``'1e999'``, and the
repr of an integer of more than 4300 digits raises. Whatever devheal reads from an API
object, an annotation or a file goes through these instead, so bad input is rejected with a
message that shows it, never accepted by accident nor turned into a crash. Pure.

- ``whole_number``: an int (never a bool), or a string of ASCII digits, within bounds; else None.
- ``show``: a short, always printable rendering of any value for an error message.
- ``label_value``: any text -> a valid label value (at most 63 characters, hashed when cut).
"""

from __future__ import annotations

import hashlib
import json
import math
import re

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
"""The largest whole number an API object can hold (Go's int64), the default bound."""

LABEL_VALUE_MAX = 63

_WHOLE = re.compile(r"-?[0-9]{1,19}")
"""ASCII digits only (Python's ``str.isdigit`` and ``int`` take any Unicode digit); no sign but '-',
no blanks, no underscores."""
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_NOT_LABEL = re.compile(r"[^-A-Za-z0-9_.]+")
_DIGEST = 10


def whole_number(value: object, *, minimum: int = 0, maximum: int = INT64_MAX, text: bool = False) -> int | None:
    """``value`` as a whole number in [minimum, maximum], or None.

    An int (a bool is not one); with ``text``, also a string of ASCII digits (``"12"``,
    ``"-3"``), as annotations and quantities write numbers. Floats are never whole numbers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif text and isinstance(value, str) and _WHOLE.fullmatch(value):
        number = int(value)
    else:
        return None
    return number if minimum <= number <= maximum else None


def finite(value: object, *, minimum: float = -math.inf, maximum: float = math.inf) -> float | None:
    """``value`` as a float in [minimum, maximum] if it is an int or float (not a bool, inf or nan)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and value.bit_length() > 1000:
        return None  # float() of it would raise
    number = float(value)
    return number if math.isfinite(number) and minimum <= number <= maximum else None


def json_object(text: object, max_length: int) -> tuple[dict[str, object] | None, str]:
    """An annotation value that must be a JSON object of at most ``max_length`` characters: the object, or (None,
    why it is not one). Never raises."""
    if not isinstance(text, str):
        return None, f"expected a JSON object as a string, got {show(text)}"
    if len(text) > max_length:
        return None, f"longer than {max_length} characters ({len(text)})"
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return None, f"not JSON: {show(text)}"
    if not isinstance(body, dict):
        return None, f"expected a JSON object, got {show(body)}"
    return body, ""


def show(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters; never raises (huge ints, deep nesting)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} that cannot be shown"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def label_value(text: str) -> str:
    """``text`` if it is a valid label value; otherwise a readable prefix plus a hash of the whole.

    Kubernetes refuses an object whose label value is over 63 characters or holds anything but
    alphanumerics, '-', '_' and '.' (inside); node and policy names may be 253 characters. The
    result is stable, so a selector on it finds the object again."""
    if len(text) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    readable = _NOT_LABEL.sub("-", text)[: LABEL_VALUE_MAX - _DIGEST - 1].strip("-_.")
    return f"{readable}-{digest}" if readable else digest
