"""The opt-in cost of starting and stopping a pod: image pulls, container start, SIGTERM handling.

Without these annotations a simulated pod runs at admission and vanishes at deletion, which
hides what a real restart costs. A pod opts in through ``devheal.io/sim-*`` annotations; this
module reads them, draws the reproducible jitter, and models each node's image pulls. It does
no I/O: the kubelet role (``kubelet.py``) turns its answers into pod and node status.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devheal.kube.client import Obj
from devheal.model.values import show

log = logging.getLogger(__name__)

IMAGE_PULL_SECONDS_ANNOTATION = "devheal.io/sim-image-pull-seconds"
"""Seconds to pull each of the pod's images on a node that does not have it yet."""
START_SECONDS_ANNOTATION = "devheal.io/sim-start-seconds"
"""Seconds from images present to containers running (sandbox, network, volumes, devices)."""
START_JITTER_SECONDS_ANNOTATION = "devheal.io/sim-start-jitter-seconds"
"""Plus a uniform extra in [0, N) seconds, the same for the same pod UID."""
STOP_SECONDS_ANNOTATION = "devheal.io/sim-stop-seconds"
"""Seconds the containers take to stop after the pod is deleted (capped by its grace period)."""
STOP_JITTER_SECONDS_ANNOTATION = "devheal.io/sim-stop-jitter-seconds"
"""Plus a uniform extra in [0, N) seconds, the same for the same pod UID."""
SIM_IMAGE_SIZE_BYTES = 10 * 1024**3
"""The size published in ``node.status.images`` for a pulled image (a CUDA training image)."""
MAX_SECONDS = 7 * 24 * 3600.0
"""The longest a simulated step may take (a week); more is a typo, not a model."""

_SECONDS = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,17})?")
"""ASCII decimals only: ``float()`` would also take 'inf', 'nan', '1e999', '٣' and '1_0'."""


def seconds_annotation(annotations: Mapping[str, Any], key: str, meta: Obj) -> float | None:
    """Seconds (``"20"``, ``"1.5"``, at most ``MAX_SECONDS``) from an annotation; None (and a warning) when
    absent or bad."""
    if key not in annotations:
        return None
    text = annotations[key]
    value = float(text) if isinstance(text, str) and _SECONDS.fullmatch(text) else None
    if value is None or value > MAX_SECONDS:
        log.warning(
            "pod %s/%s: %s is not a number of seconds from 0 to %d: %s",
            meta.get("namespace"),
            meta.get("name"),
            key,
            MAX_SECONDS,
            show(text),
        )
        return None
    return value


def jitter(uid: str, purpose: str, span: float) -> float:
    """A uniform draw in [0, span), the same for the same pod UID and purpose (reproducible runs)."""
    if span <= 0:
        return 0.0
    return random.Random(f"{uid}/{purpose}").random() * span


@dataclass
class NodeImages:
    """The images of one node: when each is (or will be) present. Pulled images stay (no GC).

    Like kubelet's default ``serializeImagePulls: true``, one pull runs at a time per node; a
    pod that needs an image whose pull is in flight waits for that pull (an image is pulled
    once)."""

    available: dict[str, float] = field(default_factory=dict)
    puller_free_at: float = 0.0

    def ensure(self, images: tuple[str, ...], pull_seconds: float, now: float) -> float:
        """Pull what is missing; returns when all ``images`` are present."""
        ready = now
        for image in images:
            at = self.available.get(image)
            if at is None:
                at = max(now, self.puller_free_at) + pull_seconds
                self.available[image] = at
                self.puller_free_at = at
            ready = max(ready, at)
        return ready

    def present(self, now: float) -> list[str]:
        return sorted(image for image, at in self.available.items() if at <= now)

    def next_pull_done(self, now: float) -> float | None:
        return min((at for at in self.available.values() if at > now), default=None)
