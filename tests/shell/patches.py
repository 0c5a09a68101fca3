"""The three patch formats the API server accepts, on plain JSON values.

``merge_patch`` is RFC 7386 (``application/merge-patch+json``); ``json_patch`` is
RFC 6902 (``application/json-patch+json``); ``strategic_merge_patch`` is the subset of
Kubernetes' strategic merge patch that devheal sends: lists named in ``MERGE_KEYS``
merge element by element on their key, ``{"$patch": "delete"}`` removes an element,
``null`` removes a field, every other list is replaced whole.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """The patch cannot be applied (the server answers 422 Invalid)."""


class TestFailed(PatchError):
    """A JSON patch ``test`` operation did not hold."""

    __test__ = False  # not a pytest class


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- RFC 6902 --------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], token: str, *, adding: bool) -> int:
    if adding and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"{token!r} is not an array index")
    index = int(token)
    if index > len(container) or (not adding and index == len(container)):
        raise PatchError(f"array index {index} is out of range")
    return index


def _parent(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for token in parts[:-1]:
        if isinstance(cur, dict):
            if token not in cur:
                raise PatchError(f"path segment {token!r} does not exist")
            cur = cur[token]
        elif isinstance(cur, list):
            cur = cur[_index(cur, token, adding=False)]
        else:
            raise PatchError(f"path segment {token!r} is inside a scalar")
    return cur


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts)
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(parent, token, adding=False)]
    raise PatchError(f"path {path!r} is inside a scalar")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts)
    token = parts[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, adding=True), value)
    else:
        raise PatchError(f"path {path!r} is inside a scalar")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, parts)
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"path {path!r} does not exist")
        del parent[token]
    elif isinstance(parent, list):
        del parent[_index(parent, token, adding=False)]
    else:
        raise PatchError(f"path {path!r} is inside a scalar")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: apply ``operations`` in order to a copy of ``target``; all or nothing."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {kind} at {path!r} has no value")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op["value"])) if path else op["value"]
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(f"operation {kind} at {path!r} has no 'from'")
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise TestFailed(f"test at {path!r} failed: {_get(doc, path)!r} != {op['value']!r}")
        else:
            raise PatchError(f"unknown operation {kind!r}")
    return doc


# ---- strategic merge patch -------------------------------------------------------------------

MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "schedulingGates": "name",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "ownerReferences": "uid",
}
"""Lists whose elements merge by key (their ``patchMergeKey`` in the Kubernetes API)."""

MERGED_SETS = frozenset({"finalizers"})
"""Lists of scalars that merge as sets (``patchStrategy: merge`` on a ``[]string``)."""


def _merge_keyed(current: Any, patch: list[Any], key: str) -> list[Any]:
    result = [copy.deepcopy(item) for item in current] if isinstance(current, list) else []
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            raise PatchError(f"element {element!r} lacks its merge key {key!r}")
        found = next(
            (i for i, item in enumerate(result) if isinstance(item, dict) and item.get(key) == element[key]), None
        )
        directive = element.get("$patch")
        if directive == "delete":
            if found is not None:
                del result[found]
        elif found is None:
            result.append(strategic_merge_patch({}, {k: v for k, v in element.items() if k != "$patch"}))
        else:
            result[found] = strategic_merge_patch(result[found], element)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge patch, the subset described in the module docstring."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $patch, $retainKeys, $setElementOrder/...: directives we do not need
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_keyed(result.get(key), value, MERGE_KEYS[key])
        elif isinstance(value, list) and key in MERGED_SETS:
            merged = list(result.get(key) or [])
            merged.extend(v for v in value if v not in merged)
            result[key] = merged
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result
