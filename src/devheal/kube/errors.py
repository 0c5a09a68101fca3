"""The one error tree for talking to the API server, and how to retry each.

    KubeError
    ├── PermanentError          do not retry the same request
    │   ├── NotFound            404
    │   ├── AlreadyExists       409, reason AlreadyExists
    │   ├── Invalid             422 (validation, CEL rules): the message names the field
    │   └── Forbidden           401/403
    └── TemporaryError          retry after ``delay`` seconds
        ├── Conflict            409 on update: read again, then retry
        ├── Gone                410: the watch's resourceVersion expired, list again
        ├── TooManyRequests     429 (PDB blocks an eviction, or API priority and fairness)
        └── Unavailable         5xx, timeouts, connection errors
            └── WatchStalled    a watch sent nothing (no event, no bookmark) for too long: watch again

Errors of the HTTP library underneath are translated in ``devheal.kube.client``
and never reach callers.
"""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    """An API request failed. ``status`` is the HTTP status (0 when no response came)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "", body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.body = body


class PermanentError(KubeError):
    """Retrying the same request gives the same answer."""


class TemporaryError(KubeError):
    """Retrying later may succeed."""

    delay: float = 1.0


class NotFound(PermanentError):
    pass


class AlreadyExists(PermanentError):
    pass


class Invalid(PermanentError):
    pass


class Forbidden(PermanentError):
    pass


class Conflict(TemporaryError):
    delay = 0.05


class Gone(TemporaryError):
    delay = 0.0


class TooManyRequests(TemporaryError):
    pass


class Unavailable(TemporaryError):
    pass


class WatchStalled(Unavailable):
    """No event and no bookmark came for the watch's idle timeout: open it again at once from its version."""

    delay = 0.0


def from_status(status: int, body: Any, what: str) -> KubeError:
    """Map an API server answer (a Status object, usually) to our tree."""
    reason = ""
    message = ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    text = f"{what}: HTTP {status}" + (f" {reason}" if reason else "") + (f": {message}" if message else "")
    cls: type[KubeError]
    if status == 404:
        cls = NotFound
    elif status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 410:
        cls = Gone
    elif status == 422:
        cls = Invalid
    elif status in (401, 403):
        cls = Forbidden
    elif status == 429:
        cls = TooManyRequests
    elif status >= 500:
        cls = Unavailable
    else:
        cls = PermanentError
    return cls(text, status=status, reason=reason, body=body)
