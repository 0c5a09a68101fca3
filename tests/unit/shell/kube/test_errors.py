"""API answers map onto one error tree that says whether and when to retry."""

from __future__ import annotations

import pytest

from devheal.kube import errors


@pytest.mark.parametrize(
    ("status", "reason", "expected", "temporary"),
    [
        (404, "NotFound", errors.NotFound, False),
        (409, "AlreadyExists", errors.AlreadyExists, False),
        (409, "Conflict", errors.Conflict, True),
        (410, "Expired", errors.Gone, True),
        (422, "Invalid", errors.Invalid, False),
        (401, "Unauthorized", errors.Forbidden, False),
        (403, "Forbidden", errors.Forbidden, False),
        (429, "TooManyRequests", errors.TooManyRequests, True),
        (500, "InternalError", errors.Unavailable, True),
        (503, "ServiceUnavailable", errors.Unavailable, True),
        (504, "Timeout", errors.Unavailable, True),
        (400, "BadRequest", errors.PermanentError, False),
    ],
)
def test_status_maps_to_its_error(status: int, reason: str, expected: type[errors.KubeError], temporary: bool) -> None:
    body = {"kind": "Status", "reason": reason, "message": "the message", "code": status}
    error = errors.from_status(status, body, "GET /api/v1/pods")
    assert type(error) is expected
    assert isinstance(error, errors.TemporaryError) is temporary
    assert isinstance(error, errors.PermanentError) is not temporary
    assert (error.status, error.reason, error.body) == (status, reason, body)
    assert str(error) == f"GET /api/v1/pods: HTTP {status} {reason}: the message"


def test_a_409_without_a_reason_is_a_conflict_to_retry() -> None:
    assert type(errors.from_status(409, {}, "PUT x")) is errors.Conflict
    assert type(errors.from_status(409, "not a Status", "PUT x")) is errors.Conflict


def test_temporary_errors_say_how_long_to_wait() -> None:
    assert errors.Conflict.delay == pytest.approx(0.05)  # read again at once
    assert errors.Gone.delay == 0.0  # list again at once
    assert errors.TooManyRequests.delay == errors.Unavailable.delay == 1.0


def test_the_message_names_the_request_without_a_body() -> None:
    assert str(errors.from_status(500, None, "WATCH /api/v1/nodes")) == "WATCH /api/v1/nodes: HTTP 500"


TOO_LARGE = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Timeout: Too large resource version: 1234, current: 1200",
    "reason": "Timeout",
    "details": {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 2,
    },
    "code": 504,
}


def test_a_watch_cache_behind_the_version_asked_for_is_its_own_temporary_error() -> None:
    error = errors.from_status(504, TOO_LARGE, "GET /api/v1/pods")
    assert type(error) is errors.ResourceVersionTooLarge
    assert isinstance(error, errors.Unavailable)
    assert error.delay == 2.0  # the server's retryAfterSeconds
    assert "Too large resource version: 1234" in str(error)


def test_too_large_is_told_by_its_cause_or_by_its_message() -> None:
    by_message = {"reason": "Timeout", "message": "Timeout: Too large resource version: 9, current: 8", "code": 504}
    assert type(errors.from_status(504, by_message, "GET x")) is errors.ResourceVersionTooLarge
    other_timeout = {"reason": "Timeout", "message": "request did not complete within 60s", "code": 504}
    assert type(errors.from_status(504, other_timeout, "GET x")) is errors.Unavailable
    assert errors.from_status(504, other_timeout, "GET x").delay == 1.0


def test_retry_after_seconds_sets_a_temporary_errors_delay() -> None:
    body = {"reason": "TooManyRequests", "details": {"retryAfterSeconds": 7}, "code": 429}
    assert errors.from_status(429, body, "POST x").delay == 7.0
    assert errors.from_status(404, {"details": {"retryAfterSeconds": 7}}, "GET x").status == 404
