"""Convert devheal's plain options without pydantic, so that a command starts in a fraction of a second.

typer (0.29) converts every option through a pydantic ``TypeAdapter``: the first option a
command reads imports pydantic and builds an adapter per option, which costs more than the
whole start-up may (0.5 s), on the restart path of a training pod (`devheal barrier`,
`devheal sidecar`) too. devheal's options are plain: ``str``, ``int``, ``float``, ``Path``,
``bool``, a ``StrEnum``, optionally ``None``, or a list of those. ``install`` has typer convert those
here, exactly as click would (ranges included); anything else still goes to typer's own
conversion. ``tests/unit/cli/test_params.py`` checks the conversions and errors, and
``tests/unit/cli/test_startup.py`` that pydantic stays unimported.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from typer import _coercion, core
from typer._click import Context
from typer._click.exceptions import BadParameter

_SCALARS = (str, int, float, bool, Path)
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else None
    return annotation


def plain_type(annotation: Any) -> tuple[type, bool] | None:
    """``(element type, is a list)`` for an annotation converted here; None for typer's own conversion."""
    annotation = _unwrap_optional(annotation)
    many = get_origin(annotation) is list
    if many:
        args = get_args(annotation)
        annotation = _unwrap_optional(args[0]) if len(args) == 1 else None
    if annotation in _SCALARS or (isinstance(annotation, type) and issubclass(annotation, Enum)):
        return annotation, many
    return None


def _number(kind: type, value: Any, info: Any) -> int | float:
    try:
        number: int | float = kind(value)
    except (TypeError, ValueError):
        name = "integer" if kind is int else "float"
        raise BadParameter(f"{value!r} is not a valid {name}.") from None
    low, high = info.min, info.max
    if (low is not None and number < low) or (high is not None and number > high):
        if info.clamp:
            return max(low, number) if low is not None and number < low else min(high, number)
        bounds = f"{low if low is not None else ''}<=x" + (f"<={high}" if high is not None else "")
        raise BadParameter(f"{number} is not in the range {bounds}.")
    return number


def _choice(kind: type[Enum], value: Any, case_sensitive: bool) -> Enum:
    for member in kind:
        text = str(member.value)
        if text == str(value) or (not case_sensitive and text.lower() == str(value).lower()):
            return member
    choices = ", ".join(repr(str(m.value)) for m in kind)
    raise BadParameter(f"{value!r} is not one of {choices}.")


def _flag(value: Any) -> bool:
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BadParameter(f"{value!r} is not a valid boolean.")


@dataclass(frozen=True)
class PlainRuntimeParam(_coercion.RuntimeParam):
    """typer's conversion contract, for plain annotations."""

    kind: type
    many: bool

    def _one(self, value: Any) -> Any:
        kind = self.kind
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            if kind in (int, float):
                return _number(kind, value, self.parameter_info)
            return value
        if issubclass(kind, Enum):
            return _choice(kind, value, self.parameter_info.case_sensitive)
        if kind is bool:
            return _flag(value)
        if kind in (int, float):
            return _number(kind, value, self.parameter_info)
        if kind is Path:
            return Path(value)
        return str(value)

    def _coerce_value(self, value: Any, param: Any, ctx: Context) -> Any:
        try:
            if self.many:
                items = value if isinstance(value, list | tuple) else [value]
                return [self._one(item) for item in items]
            return self._one(value)
        except BadParameter as exc:
            exc.ctx, exc.param = ctx, param
            raise


def _plain_path_options(info: Any) -> bool:
    """A ``Path`` option that asks typer for no checks (exists, readable, resolve, ...)."""
    return not (
        info.exists
        or info.resolve_path
        or info.allow_dash
        or info.path_type is not None
        or info.writable
        or not info.file_okay
        or not info.dir_okay
    )


def build(descriptor: _coercion.TypeDescriptor, fallback: Callable[..., Any]) -> Any:
    """The conversion of one option: ours for plain annotations, typer's for the rest."""
    found = plain_type(descriptor.annotation)
    info = descriptor.parameter_info
    if (
        found is None
        or descriptor.is_file
        or info.parser is not None
        or getattr(info, "click_type", None) is not None
        or (found[0] is Path and not _plain_path_options(info))
    ):
        return fallback(descriptor)
    kind, many = found
    return PlainRuntimeParam(parameter_info=info, annotation=descriptor.annotation, kind=kind, many=many)


def install() -> None:
    """Have typer convert plain options here (idempotent)."""
    original = core.build_runtime_param
    if getattr(original, "devheal_plain", False):
        return

    def build_runtime_param(descriptor: _coercion.TypeDescriptor) -> Any:
        return build(descriptor, original)

    build_runtime_param.devheal_plain = True  # type: ignore[attr-defined]
    core.build_runtime_param = build_runtime_param
