"""The in-memory API server's objects: what etcd and the registry do, without HTTP.

Objects are stored by resource (``/api/v1`` or ``/apis/group/version``, plural) and
namespace/name. Every write takes the next value of one global ``resourceVersion``
counter and is appended to an event log; the log keeps the last ``window`` events, so a
list continuation from an older version is answered 410 Gone, as after an etcd compaction.
A watch is answered 410 Gone only when its own collection's history no longer reaches back
(an event of that resource was dropped after its version, or ``compact`` ran), as the API
server's watch cache keeps a history per resource: a busy resource's writes (a storm's
pods) never expire a quiet one's watch (the nodes'). The registry's rules that devheal relies on are kept: ``uid`` and
``creationTimestamp`` set on create, ``generation`` bumped on spec changes, optimistic
concurrency on ``metadata.resourceVersion`` (and ``uid`` preconditions), the status
subresource (writes to an object leave its status alone and the other way round),
finalizers (a delete sets ``deletionTimestamp`` until the last one is removed).

Differences from a real API server, chosen for seeding tests: a create keeps the
``status`` it is given, and a pod's delete takes effect at once (there is no kubelet).
Server-side apply is a merge patch (no field managers), and strategic merge patch knows
only the merge keys in ``tests.shell.patches``.
"""

from __future__ import annotations

import base64
import bisect
import datetime
import json
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.shell import patches
from tests.shell.selectors import Matcher

Obj = dict[str, Any]
Key = tuple[str, str, str, str]
"""(api prefix, plural, namespace, name); namespace is "" for cluster-scoped objects."""

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

WITHOUT_STATUS = frozenset({"leases", "events", "configmaps", "secrets", "serviceaccounts", "endpoints"})
"""Plurals that have no status subresource (a write to the object may set its status)."""

_PATH = re.compile(r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)(?P<rest>(/[^/]+)*)/?$")


class ApiError(Exception):
    """An answer other than success, as a Kubernetes ``Status``."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        status: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            status["details"] = self.details
        status["code"] = self.code
        return status


def not_found(ref: Ref) -> ApiError:
    return ApiError(404, "NotFound", f'{ref.plural} "{ref.name}" not found')


def conflict(ref: Ref, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {ref.plural} "{ref.name}": {why}')


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


@dataclass(frozen=True)
class Ref:
    """What a request path names: a collection (``name`` empty) or an object, maybe a subresource."""

    prefix: str
    plural: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    @classmethod
    def parse(cls, path: str) -> Ref:
        found = _PATH.match(path)
        if not found:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        parts = [p for p in found["rest"].split("/") if p]
        namespace = ""
        if (
            len(parts) >= 3
            and parts[0] == "namespaces"
            and not (len(parts) == 3 and parts[2] in ("status", "finalize"))
        ):
            namespace, parts = parts[1], parts[2:]
        if not 1 <= len(parts) <= 3:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return cls(found["prefix"], parts[0], namespace, *parts[1:])

    @property
    def key(self) -> Key:
        return (self.prefix, self.plural, self.namespace, self.name)

    @property
    def api_version(self) -> str:
        return "v1" if self.prefix == "/api/v1" else self.prefix.removeprefix("/apis/")

    @property
    def builtin(self) -> bool:
        """Built-in kinds (core and ``*.k8s.io`` or dotless groups) list their items without kind/apiVersion."""
        group = self.api_version.rpartition("/")[0]
        return not group or "." not in group or group.endswith(".k8s.io")

    def in_collection(self, key: Key) -> bool:
        return key[:2] == (self.prefix, self.plural) and (not self.namespace or key[2] == self.namespace)


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    key: Key
    obj: Obj
    """The object after the change (for DELETED: its last state, with the deletion's resourceVersion)."""
    prev: Obj | None


def clone(obj: Any) -> Any:
    """A deep copy of plain data (what ``copy.deepcopy`` gives, three times faster: a pickle round trip)."""
    return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(ts: datetime.datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _kind(plural: str) -> str:
    singular = plural[:-2] if plural.endswith("ses") else plural.removesuffix("s")
    return singular[:1].upper() + singular[1:]


class Store:
    def __init__(
        self,
        *,
        now: Callable[[], datetime.datetime] = _utc_now,
        window: int = 1000,
        without_status: frozenset[str] = WITHOUT_STATUS,
    ) -> None:
        self.now = now
        self.window = window
        self.without_status = without_status
        self.rv = 0
        self.objects: dict[Key, Obj] = {}
        self.log: list[Event] = []
        self.horizon = 0
        """Events with a resourceVersion above this are all in ``log``; older ones are forgotten."""
        self.compacted = 0
        """The version of the last ``compact``: no watch reaches back past it."""
        self.dropped: dict[tuple[str, str], int] = {}
        """Per resource (api prefix, plural), the version of its last event dropped from ``log``: its own history
        reaches back to there."""
        self.listeners: list[Callable[[Event], None]] = []
        self._uids = 0
        self._listed: dict[tuple[int, str, str, str], list[Key]] = {}
        """A collection's keys at a version, sorted: each page of a paged list is a slice of them, not a sort."""

    # ---- the log ------------------------------------------------------------------------------

    def _record(self, kind: str, key: Key, obj: Obj | None, prev: Obj | None) -> Obj:
        """Store ``obj`` (the caller's own copy, stored as is) at the next version; returns a copy for the answer.

        Stored objects and the log's are never changed in place (a write stores a new one), so the log and
        the lists share them instead of copying every object at every write and read.
        """
        self.rv += 1
        if obj is None:  # a deletion: the last state, stamped with the deletion's version
            assert prev is not None
            obj = {**prev, "metadata": {**prev["metadata"]}}
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        event = Event(self.rv, kind, key, obj, prev)
        self.log.append(event)
        if len(self.log) > self.window:
            dropped = self.log[: len(self.log) - self.window]
            del self.log[: len(dropped)]
            self.horizon = dropped[-1].rv
            for old in dropped:
                self.dropped[old.key[:2]] = old.rv
        for listener in list(self.listeners):
            listener(event)
        return clone(obj)

    def compact(self) -> None:
        """Forget every event so far (an etcd compaction): older versions answer 410 Gone."""
        self.log.clear()
        self.horizon = self.compacted = self.rv

    def events_after(self, rv: int, resource: tuple[str, str] | None = None) -> list[Event]:
        """The events after ``rv``; of one ``resource`` (api prefix, plural) only when given, and then 410 Gone only
        where that resource's own history no longer reaches back."""
        horizon = self.horizon if resource is None else max(self.compacted, self.dropped.get(resource, 0))
        if rv < horizon:
            raise gone(f"too old resource version: {rv} ({horizon + 1})")
        return [e for e in self.log if e.rv > rv and (resource is None or e.key[:2] == resource)]

    def snapshot(self, rv: int) -> dict[Key, Obj]:
        """All objects as they were at ``rv`` (410 Gone where the log no longer reaches back)."""
        state = dict(self.objects)
        state.update(self._older(rv))
        return {k: v for k, v in state.items() if v is not None}

    def _older(self, rv: int) -> dict[Key, Obj | None]:
        """What the objects changed since ``rv`` were at ``rv`` (None: not there yet)."""
        return {event.key: event.prev for event in reversed(self.events_after(rv))}

    # ---- reads --------------------------------------------------------------------------------

    def get(self, ref: Ref) -> Obj:
        obj = self.objects.get(ref.key)
        if obj is None:
            raise not_found(ref)
        return clone(obj)

    def _keys_at(self, rv: int, ref: Ref, older: dict[Key, Obj | None]) -> list[Key]:
        """The keys of ``ref``'s collection at ``rv``, sorted (kept for the next pages of the same list)."""
        at = (rv, ref.prefix, ref.plural, ref.namespace)
        keys = self._listed.get(at)
        if keys is None:
            present = {k for k in self.objects if ref.in_collection(k)}
            present.update(k for k in older if ref.in_collection(k))
            keys = sorted(k for k in present if (older[k] if k in older else self.objects[k]) is not None)
            if len(self._listed) >= 16:  # lists abandoned half-way: forget them
                self._listed.clear()
            self._listed[at] = keys
        return keys

    def list(self, ref: Ref, match: Matcher, *, limit: int = 0, token: str = "", counted: bool = True) -> Obj:
        """A page of ``ref``'s collection (all of it without ``limit``), as of the version the list began at.

        ``counted``: say how many items remain after the page (``remainingItemCount``); the API server says
        it only for a list without selectors, so a selective list need not match the rest of the collection.
        """
        if token:
            try:
                position = json.loads(base64.urlsafe_b64decode(token.encode()))
                rv, start = int(position["rv"]), tuple(position["start"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from exc
            try:
                older = self._older(rv)
            except ApiError as exc:
                raise gone(
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter."
                ) from exc
        else:
            rv, start, older = self.rv, (), {}
        keys = self._keys_at(rv, ref, older)
        # Keys compare by (prefix, plural, namespace, name): the page goes on after the last one served.
        position = bisect.bisect_right(keys, (ref.prefix, ref.plural, *start)) if start else 0
        items: list[Obj] = []
        kind = _kind(ref.plural)
        more = False
        for index in range(position, len(keys)):
            key = keys[index]
            obj = older[key] if key in older else self.objects[key]
            if obj is None or not match(obj):
                continue
            if 0 < limit <= len(items):
                more = True
                break
            position = index
            kind = str(obj.get("kind") or kind) if not items else kind
            items.append({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} if ref.builtin else obj)
        meta: Obj = {"resourceVersion": str(rv)}
        if more:
            last = keys[position]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": last[2:]}).encode()).decode()
            if counted:
                meta["remainingItemCount"] = len(keys) - position - 1
        return {"kind": f"{kind}List", "apiVersion": ref.api_version, "metadata": meta, "items": items}

    # ---- writes -------------------------------------------------------------------------------

    def _check_preconditions(self, ref: Ref, current: Obj, uid: Any, rv: Any) -> None:
        meta = current["metadata"]
        if uid and uid != meta.get("uid"):
            raise conflict(
                ref, f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta.get('uid')}"
            )
        if rv and str(rv) != meta.get("resourceVersion"):
            raise conflict(
                ref, "the object has been modified; please apply your changes to the latest version and try again"
            )

    def create(self, ref: Ref, body: Any) -> Obj:
        if ref.name or not isinstance(body, dict):
            raise ApiError(405, "MethodNotAllowed", "create is on a collection, with an object")
        obj = clone(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            self._uids += 1
            meta["name"] = f"{meta['generateName']}{self._uids:05x}"
        name = meta.get("name")
        if not name:
            raise ApiError(
                422, "Invalid", f"{ref.plural}: metadata.name: Required value: name or generateName is required"
            )
        if meta.get("namespace") and ref.namespace and meta["namespace"] != ref.namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if ref.namespace:
            meta["namespace"] = ref.namespace
        else:
            meta.pop("namespace", None)
        target = Ref(ref.prefix, ref.plural, ref.namespace, name)
        if target.key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{ref.plural} "{name}" already exists')
        self._uids += 1
        obj.setdefault("apiVersion", ref.api_version)
        obj.setdefault("kind", _kind(ref.plural))
        meta["uid"] = f"00000000-0000-4000-8000-{self._uids:012d}"
        meta["creationTimestamp"] = _stamp(self.now())
        meta["generation"] = 1
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(field, None)
        return self._record("ADDED", target.key, obj, None)

    def _write(self, ref: Ref, current: Obj, wanted: Obj) -> Obj:
        """Store ``wanted`` over ``current`` as the registry would: server-owned fields kept."""
        if not isinstance(wanted, dict) or not isinstance(wanted.get("metadata", {}), dict):
            raise ApiError(422, "Invalid", "the object must be a JSON object with object metadata")
        cur_meta = current["metadata"]
        new = clone(wanted)
        meta = new.setdefault("metadata", {})
        if meta.get("name", cur_meta["name"]) != cur_meta["name"]:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        self._check_preconditions(ref, current, meta.get("uid"), meta.get("resourceVersion"))
        if ref.subresource == "status":
            new = {**clone(current), "status": clone(new.get("status"))}
            if new["status"] is None:
                del new["status"]
            meta = new["metadata"]
        elif ref.plural not in self.without_status:
            new.pop("status", None)
            if "status" in current:
                new["status"] = clone(current["status"])
        for field in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if field in cur_meta:
                meta[field] = cur_meta[field]
            else:
                meta.pop(field, None)
        for field in ("namespace", "name"):
            if field in cur_meta:
                meta[field] = cur_meta[field]
        new["kind"], new["apiVersion"] = current.get("kind"), current.get("apiVersion")
        if _spec_part(new) != _spec_part(current):
            meta["generation"] = int(cur_meta.get("generation") or 1) + 1
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._record("DELETED", ref.key, new, current)
        meta["resourceVersion"] = cur_meta["resourceVersion"]
        if new == current:
            return clone(current)  # a no-op write takes no new version
        return self._record("MODIFIED", ref.key, new, current)

    def _target(self, ref: Ref) -> tuple[Ref, Obj]:
        if not ref.name:
            raise ApiError(405, "MethodNotAllowed", "this verb needs an object, not a collection")
        if ref.subresource not in ("", "status"):
            raise ApiError(404, "NotFound", f"no subresource {ref.subresource!r} here")
        current = self.objects.get(ref.key)
        if current is None:
            raise not_found(ref)
        return ref, current

    def replace(self, ref: Ref, body: Any) -> Obj:
        ref, current = self._target(ref)
        return self._write(ref, current, body)

    def patch(self, ref: Ref, body: Any, content_type: str) -> Obj:
        ref, current = self._target(ref)
        base = clone(current)
        try:
            if content_type == JSON_PATCH:
                wanted = patches.json_patch(base, body)
                # A JSON patch carries no preconditions of its own (``test`` ops are its preconditions).
                wanted.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
            elif content_type == STRATEGIC_PATCH:
                wanted = patches.strategic_merge_patch(base, body)
            elif content_type in (MERGE_PATCH, APPLY_PATCH):
                wanted = patches.merge_patch(base, body)
            else:
                raise ApiError(
                    415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
                )
        except patches.PatchError as exc:
            raise ApiError(422, "Invalid", str(exc)) from exc
        if content_type != JSON_PATCH and isinstance(body, dict):
            meta = body.get("metadata") or {}
            # A patch that names a uid or resourceVersion asks for them as preconditions.
            self._check_preconditions(ref, current, meta.get("uid"), meta.get("resourceVersion"))
            wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self._write(ref, current, wanted)

    def delete(self, ref: Ref, options: Any = None) -> Obj:
        ref, current = self._target(ref)
        if ref.subresource:
            raise ApiError(405, "MethodNotAllowed", "delete is on the object, not a subresource")
        preconditions = (options or {}).get("preconditions") or {}
        self._check_preconditions(ref, current, preconditions.get("uid"), preconditions.get("resourceVersion"))
        if current["metadata"].get("finalizers"):
            if current["metadata"].get("deletionTimestamp"):
                return clone(current)
            new = clone(current)
            new["metadata"]["deletionTimestamp"] = _stamp(self.now())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._record("MODIFIED", ref.key, new, current)
        return self._record("DELETED", ref.key, None, current)

    def evict(self, ref: Ref, body: Any, *, dry_run: bool = False) -> Obj:
        """POST pods/NAME/eviction: deletes the pod (PodDisruptionBudgets are a test's fault to inject); a dry run
        (``?dryRun=All``) only checks that the pod is there and its UID precondition holds."""
        pod = Ref(ref.prefix, ref.plural, ref.namespace, ref.name)
        if ref.plural != "pods":
            raise ApiError(404, "NotFound", f"{ref.plural} have no eviction subresource")
        options = (body or {}).get("deleteOptions") if isinstance(body, dict) else None
        if dry_run:
            current = self.get(pod)
            uid = ((options or {}).get("preconditions") or {}).get("uid")
            if uid and current["metadata"].get("uid") != uid:
                raise ApiError(409, "Conflict", f"precondition failed: UID in precondition: {uid}")
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        self.delete(pod, options)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
