"""Hypothesis strategies for outside input: arbitrary JSON-like values, and the values parsers get wrong.

``nasty`` holds what Python's lenient readers accept and Kubernetes does not (non-ASCII
digits, underscores, inf and nan, ints past int64, very long strings, names over 63
characters); ``json_values`` mixes them into arbitrary nested dicts and lists, and
``shaped`` fills a known object shape with them so the fuzz reaches the parser's deeper fields.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=int(os.environ.get("DEVHEAL_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Modest example counts, so every fuzz test together adds a few seconds to the suite;
``DEVHEAL_FUZZ_EXAMPLES=5000`` searches harder."""

LONG_NAME = "n" * 64 + ".example.com"
NASTY: tuple[Any, ...] = (
    "٣",  # Arabic-Indic three: str.isdigit() and int() accept it
    "１２",  # fullwidth digits
    "²",  # superscript two: isdigit() but not int()
    "1_000",
    " 7 ",
    "-1",
    "+1",
    "0x10",
    "1e3",
    "inf",
    "-inf",
    "nan",
    "NaN",
    ".inf",
    "1e999",
    "9" * 30,
    "9" * 5000,
    "99999999999999999999h",
    "1" * 40 + "s",
    "1.5",
    "30s",
    "1h30m",
    "",
    "True",
    "null",
    LONG_NAME,
    "a" * 10_000,
    "ü" * 70,
    "\x00",
    "\ud800",
    float("inf"),
    float("-inf"),
    float("nan"),
    1e308,
    -0.0,
    0.5,
    2**63,
    2**64 + 1,
    -(2**63) - 1,
    10**400,  # float() of it overflows
    -1,
    0,
    1,
    True,
    False,
    None,
    [],
    {},
)


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(NASTY),
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(2**200), max_value=2**200),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=20),
        st.text(alphabet="0123456789٣１２²_.-+ hms%", max_size=12),
    )


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-like values (dict keys are strings, as JSON's are)."""
    return st.recursive(
        scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.one_of(st.text(max_size=8), st.sampled_from(NASTY[:10])), children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def shaped(shape: Any, max_changes: int = 3) -> st.SearchStrategy[Any]:
    """Objects of ``shape`` with up to ``max_changes`` of their fields set to anything at all.

    A shape is a dict of shapes, a one-element list of a shape, or a tuple of valid leaf
    values. A valid object with a few corrupted fields reaches every check of a parser; an
    object corrupted everywhere would stop at its first."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        obj = draw(_valid(shape))
        paths = list(_paths(shape, ()))[1:]  # the object itself stays an object: json_values() covers the rest
        for _ in range(draw(st.integers(0, max_changes))):
            path = draw(st.sampled_from(paths))
            obj = _put(obj, path, draw(st.one_of(st.sampled_from(NASTY), json_values(6))))
        return obj

    return build()


def _valid(shape: Any) -> st.SearchStrategy[Any]:
    if isinstance(shape, dict):
        return st.fixed_dictionaries({}, optional={key: _valid(sub) for key, sub in shape.items()})
    if isinstance(shape, list):
        return st.lists(_valid(shape[0]), max_size=2)
    return st.sampled_from(shape)


def _paths(shape: Any, prefix: tuple[Any, ...]) -> Any:
    yield prefix
    if isinstance(shape, dict):
        for key, sub in shape.items():
            yield from _paths(sub, (*prefix, key))
    elif isinstance(shape, list):
        yield from _paths(shape[0], (*prefix, 0))


def _put(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``obj`` with ``value`` at ``path``, creating the objects and lists on the way."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(key, int):
        items = list(obj) if isinstance(obj, list) and obj else [{}]
        items[0] = _put(items[0], rest, value)
        return items
    fields = dict(obj) if isinstance(obj, dict) else {}
    fields[key] = _put(fields.get(key), rest, value)
    return fields
