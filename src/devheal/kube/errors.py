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
            ├── ResourceVersionTooLarge
            │                   504 "Too large resource version": the server's watch cache is
            │                   behind; send the same request again after ``delay``
            └── WatchStalled    a watch sent nothing (no event, no bookmark) for too long: watch again

A Status's ``details.retryAfterSeconds``, when the server gives one, becomes a temporary
error's ``delay``.

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


class ResourceVersionTooLarge(Unavailable):
    """504, reason ``Timeout``, cause ``ResourceVersionTooLarge``: asked for a version the server's
    watch cache has not reached yet (it lags etcd, e.g. right after a restart, or under load),
    and it gave up waiting. Nothing is wrong with the request: send it again after ``delay``
    (the server's ``retryAfterSeconds``), as client-go does."""


class WatchStalled(Unavailable):
    """No event and no bookmark came for the watch's idle timeout: open it again at once from its version."""

    delay = 0.0


def from_status(status: int, body: Any, what: str) -> KubeError:
    """Map an API server answer (a Status object, usually) to our tree."""
    reason = ""
    message = ""
    details: Any = {}
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
        details = body.get("details") if isinstance(body.get("details"), dict) else {}
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
    elif status == 504 and _too_large_resource_version(message, details):
        cls = ResourceVersionTooLarge
    elif status >= 500:
        cls = Unavailable
    else:
        cls = PermanentError
    error = cls(text, status=status, reason=reason, body=body)
    retry_after = details.get("retryAfterSeconds")
    if isinstance(error, TemporaryError) and isinstance(retry_after, int | float) and retry_after > 0:
        error.delay = float(retry_after)
    return error


TOO_LARGE_RESOURCE_VERSION = "ResourceVersionTooLarge"
"""The Status cause the API server gives with its 504 "Too large resource version"."""


def _too_large_resource_version(message: str, details: Any) -> bool:
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == TOO_LARGE_RESOURCE_VERSION:
            return True
    # Servers before the cause existed said it in the message only.
    return "too large resource version" in message.lower()
