"""A minimal in-memory stand-in for ``KubeClient``: the calls the agent's publisher makes, recorded."""

from __future__ import annotations

import copy
from typing import Any

from devheal.kube import errors


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_with: errors.KubeError | None = None

    def _check(self, method: str, path: str) -> None:
        self.calls.append((method, path))
        if self.fail_with is not None:
            raise self.fail_with

    def writes(self, suffix: str = "") -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "GET" and c[1].endswith(suffix)]

    async def apply(
        self, path: str, body: dict[str, Any], *, field_manager: str = "devheal", force: bool = True
    ) -> dict:
        self._check("APPLY", path)
        obj = self.objects.setdefault(path, {})
        obj.update(copy.deepcopy(body))
        return copy.deepcopy(obj)

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        self._check("GET", path)
        if path.startswith("/api/v1/nodes/"):
            return copy.deepcopy(self.nodes.setdefault(path.rsplit("/", 1)[1], {"status": {"conditions": []}}))
        if path not in self.objects:
            raise errors.NotFound(f"GET {path}: HTTP 404", status=404)
        return copy.deepcopy(self.objects[path])

    async def patch(self, path: str, body: Any, *, content_type: str = "") -> dict[str, Any]:
        self._check("PATCH", path)
        if path.startswith("/api/v1/nodes/"):
            node = self.nodes.setdefault(path.split("/")[4], {"status": {"conditions": []}})
            conds = {c["type"]: c for c in node["status"]["conditions"]}
            for c in body["status"]["conditions"]:
                if c.get("$patch") == "delete":
                    conds.pop(c["type"], None)
                else:
                    conds[c["type"]] = c
            node["status"]["conditions"] = list(conds.values())
            return node
        base = path.removesuffix("/status")
        if base not in self.objects:
            raise errors.NotFound(f"PATCH {path}: HTTP 404", status=404)
        self.objects[base]["status"] = copy.deepcopy(body["status"])
        return copy.deepcopy(self.objects[base])

    async def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        self._check("DELETE", path)
        if path not in self.objects:
            raise errors.NotFound(f"DELETE {path}: HTTP 404", status=404)
        return self.objects.pop(path)
