"""What the API server accepts of an object devheal writes: Kubernetes' name and label rules, and the CRD's schema.

``remediation_problems`` checks a Remediation body against ``crds/remediations.yaml`` (types, enums,
``maxLength``, ``maxItems``, ``date-time``) and against the rules the API server applies to every object
(name a DNS subdomain of at most 253 characters, label values valid); it answers what is wrong, empty when
the body would be stored.
"""

from __future__ import annotations

import datetime
import re
from functools import cache
from importlib import resources
from typing import Any

import yaml

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DATE_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z")


def dns_subdomain(name: object) -> bool:
    return isinstance(name, str) and len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name) is not None


def label_value(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def date_time(value: object) -> bool:
    if not isinstance(value, str) or not DATE_TIME.fullmatch(value):
        return False
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


@cache
def remediation_schema() -> dict[str, Any]:
    text = (resources.files("devheal.crds") / "remediations.yaml").read_text()
    crd = yaml.safe_load(text)
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def schema_problems(value: Any, schema: dict[str, Any], at: str) -> list[str]:
    """What in ``value`` the OpenAPI ``schema`` refuses (the parts of it the Remediation CRD uses)."""
    problems: list[str] = []
    kind = schema.get("type")
    expected = {"string": str, "object": dict, "array": list, "boolean": bool, "integer": int}.get(kind or "")
    if expected is not None and not isinstance(value, expected):
        return [f"{at}: expected {kind}, got {value!r:.80}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{at}: {value!r:.80} not in {schema['enum']}")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", 10**9):
            problems.append(f"{at}: {len(value)} characters, at most {schema['maxLength']}")
        if schema.get("format") == "date-time" and not date_time(value):
            problems.append(f"{at}: {value!r:.80} is no date-time")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{at}: {value!r:.80} does not match {schema['pattern']}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", 10**9):
            problems.append(f"{at}: {len(value)} items, at most {schema['maxItems']}")
        for i, item in enumerate(value):
            problems += schema_problems(item, schema.get("items", {}), f"{at}[{i}]")
    if isinstance(value, dict):
        problems += [f"{at}.{key}: required" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                problems += schema_problems(item, properties[key], f"{at}.{key}")
    return problems


def remediation_problems(body: dict[str, Any]) -> list[str]:
    """Why the API server would refuse ``body`` (a Remediation devheal creates); empty if it would not."""
    meta = body.get("metadata", {})
    problems = [] if dns_subdomain(meta.get("name")) else [f"metadata.name: {meta.get('name')!r:.80} is no DNS name"]
    problems += [f"metadata.labels.{k}: {v!r:.80}" for k, v in meta.get("labels", {}).items() if not label_value(v)]
    target = body.get("spec", {}).get("target", {})
    if target.get("kind") not in ("Node", "Device") and not target.get("namespace"):  # the CRD's CEL rule
        problems.append("spec.target.namespace: required when target.kind is Pod or Gang")
    return problems + schema_problems(body, remediation_schema(), "")
