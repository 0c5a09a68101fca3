"""How a gang member restarts in place: by the devheal launcher, or by KEP-5532 ``RestartAllContainers``.

Two mechanisms react to a rise of the pod annotation ``devheal.io/restart-generation``:

- the **launcher** (``devheal launch``) wraps the training command and restarts it inside
  the container; it announces itself by acknowledging generations in
  ``devheal.io/launcher-generation``;
- **RestartAllContainers** (KEP-5532; the ``RestartAllContainersOnContainerExits`` feature,
  beta and on by default since Kubernetes 1.36): a container's ``restartPolicyRules`` say
  that its exit with given codes makes the kubelet restart every container of the pod,
  keeping the sandbox, its IP and its devices. The ``devheal sidecar`` watcher exits with
  such a code on a new generation; the ``devheal barrier`` init container then
  acknowledges the generation, exactly like the launcher.

Pure: works on a pod's JSON ``spec`` and annotations.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from devheal.model.cluster import LAUNCHER_GENERATION_ANNOTATION
from devheal.model.restarts import RESTART_ALL_CONTAINERS, InPlaceRestart


def _items(value: object) -> list[Any]:
    """``value`` if it is a list, else nothing: the pod spec comes from outside and may be malformed."""
    return value if isinstance(value, list) else []


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers"):
        for container in _items(spec.get(key)):
            if isinstance(container, Mapping):
                yield container


def rule_matches(rule: Mapping[str, Any], exit_code: int) -> bool:
    """Whether a ``restartPolicyRules`` entry fires for ``exit_code`` (``exitCodes`` operator ``In``/``NotIn``)."""
    exit_codes = rule.get("exitCodes")
    if not isinstance(exit_codes, Mapping):
        return False
    values = {v for v in _items(exit_codes.get("values")) if isinstance(v, int) and not isinstance(v, bool)}
    operator = exit_codes.get("operator")
    if operator == "In":
        return exit_code in values
    if operator == "NotIn":
        return exit_code not in values
    return False


def restart_all_triggers(spec: Mapping[str, Any], exit_code: int | None = None) -> tuple[str, ...]:
    """Names of the containers (init, sidecar or regular) whose exit restarts all containers of the pod.

    With ``exit_code``: only those whose rules fire for that code; the kubelet applies the
    first matching rule of a container, so an earlier ``Restart`` rule for the same code wins.
    """
    names = []
    for container in _containers(spec):
        rules = [r for r in _items(container.get("restartPolicyRules")) if isinstance(r, Mapping)]
        if exit_code is None:
            if any(r.get("action") == RESTART_ALL_CONTAINERS for r in rules):
                names.append(str(container.get("name") or ""))
            continue
        first = next((r for r in rules if rule_matches(r, exit_code)), None)
        if first is not None and first.get("action") == RESTART_ALL_CONTAINERS:
            names.append(str(container.get("name") or ""))
    return tuple(names)


def in_place_restart(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> InPlaceRestart:
    """How this pod restarts in place when its restart generation rises.

    A ``RestartAllContainers`` rule in the spec wins (the API server accepts one only where
    the feature is on); otherwise a launcher's acknowledgement shows a launcher runs.
    """
    if restart_all_triggers(spec):
        return InPlaceRestart.RESTART_ALL_CONTAINERS
    if LAUNCHER_GENERATION_ANNOTATION in annotations:
        return InPlaceRestart.LAUNCHER
    return InPlaceRestart.NONE
