"""Outside input the fuzz suite feeds its parsers: times, step reports, policy sections, objects of every kind.

Built on ``tests.unit.fuzzing`` (``NASTY``, ``json_values``, ``shaped``): a valid object of each shape
with a few fields set to anything at all, plus the values each kind of field gets wrong (times of year 1
and 9999 with offsets, leap seconds, 400-digit numbers, label values with upper case and ``_``).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from devheal.model.cluster import (
    GANG_LABEL,
    GPU_RESOURCE,
    LAUNCHER_GENERATION_ANNOTATION,
    LIFTS_ANNOTATION,
    OWNERSHIP_ANNOTATION,
    RESTART_GENERATION_ANNOTATION,
)
from devheal.model.dra import DEVICE_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL
from devheal.model.steps import STEPS_ANNOTATION
from tests.unit.fuzzing import LONG_NAME

BIG = "9" * 400
HOSTILE_TIMES = (
    "0001-01-01T00:00:00+23:59",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
    "9999-12-31T23:59:59-23:59",
    "1969-12-31T23:59:59Z",
    "1970-01-01T00:00:00Z",
    "2024-05-01T23:59:60Z",
    "2024-05-01T12:00:00.123456789012Z",
    "2024-05-01T12:00:00",
    "2024-05-01",
)
GOOD_TIME = "2024-05-01T12:00:00Z"
LABEL_VALUES = ("g", "My_Gang", "UPPER.case-1", "a" * 63, "x_y", "0")


@st.composite
def rfc3339(draw: st.DrawFn) -> str:
    """Date-time strings in and around RFC 3339: years 0 to 9999, fields past their range, any offset."""
    year = draw(st.one_of(st.sampled_from([0, 1, 1969, 1970, 2024, 9999]), st.integers(0, 9999)))
    month, day = draw(st.integers(0, 13)), draw(st.integers(0, 32))
    hour, minute, second = draw(st.integers(0, 24)), draw(st.integers(0, 60)), draw(st.integers(0, 61))
    fraction = draw(st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=12).map(lambda d: "." + d)))
    offset = draw(
        st.one_of(
            st.sampled_from(["Z", "z", "", "+00:00"]),
            st.tuples(st.sampled_from("+-"), st.integers(0, 24), st.integers(0, 60)).map(
                lambda t: f"{t[0]}{t[1]:02d}:{t[2]:02d}"
            ),
        )
    )
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}{fraction}{offset}"


def times() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from((*HOSTILE_TIMES, GOOD_TIME)), rfc3339())


def numbers() -> st.SearchStrategy[Any]:
    """JSON numbers a parser may get: huge, tiny, negative, fractional, non-finite."""
    return st.one_of(
        st.integers(),
        st.sampled_from([10**400, -(10**400), 10**300, 2**63, 2**64, -1, 0, 1e308, -0.0]),
        st.floats(allow_nan=True, allow_infinity=True),
    )


@st.composite
def step_annotations(draw: st.DrawFn) -> str:
    """``devheal.io/steps`` values: the launcher's JSON with any of its numbers replaced."""
    fields = ("count", "window", "p50", "last", "run", "collectives", "exits", "inside")
    body = {key: draw(st.one_of(numbers(), st.none(), st.sampled_from([True, "1", [], {}]))) for key in fields}
    text = json.dumps(body, separators=(",", ":"))  # inf and nan as Infinity and NaN, which json.loads takes
    return draw(st.one_of(st.just(text), st.just(text.replace("1e+300", BIG)), st.text(max_size=40)))


DURATION = ("30s", "5m", "1h30m", "0s", "2562047h", "99999999999999999999h", "1" * 400 + "s", "1.5s")
SELECTOR = {
    "matchLabels": {"k": ("v", "")},
    "matchExpressions": [
        {"key": ("k", "devheal.io/pool"), "operator": ("In", "NotIn", "Exists", "DoesNotExist"), "values": [("a",)]}
    ],
}
TEMPLATE = {"apiVersion": ("v1", "x.io/v1"), "kind": ("T", "U"), "name": ("t",), "namespace": ("ns",)}
SECTIONS: dict[str, Any] = {
    "node": {
        "taint": (True, False),
        "cordon": (True, False),
        "capacityGapAfter": DURATION,
        "remediateAfter": DURATION,
        "holdDown": DURATION,
        "remediation": ("IdleOnly", "Drain"),
        "template": TEMPLATE,
        "escalation": [{"template": TEMPLATE, "timeout": DURATION}],
    },
    "budgets": {
        "maxUnhealthyNodes": ("10%", 3, "100%", 0, "101%"),
        "maxUnhealthyNodesPerPool": ("50%", 2),
        "poolLabel": ("devheal.io/pool",),
        "maxConcurrentRemediations": (10, 1),
        "workloadDisruptionInterval": DURATION,
        "gangRestartsPerHour": (3, 0),
        "stepTimeouts": {"Drain": DURATION, "FailPod": DURATION},
        "circuitBreaker": {
            "maxFaultyNodesPercent": (30, 100),
            "closeAtFaultyNodesPercent": (10, 50),
            "window": DURATION,
            "coolDown": DURATION,
        },
    },
    "records": {"ttlAfterFinished": DURATION, "maxEndedPerTarget": (1, 20, 1001)},
    "infrastructure": {
        "admissionRejected": ("DeletePod", "Notify"),
        "stuckTerminatingAfter": DURATION,
        "forceDeleteStuck": (True, False),
        "devicePluginDownAfter": DURATION,
        "driverFailure": ("Taint", "Notify"),
        "driverFailureAfter": DURATION,
    },
    "devices": {"taint": (True, False), "taintEffect": ("NoSchedule", "NoExecute"), "holdDown": DURATION},
    "stragglers": {
        "action": ("Notify", "ReplaceAtRestart", "ReplaceNow", "ReplaceAtCheckpoint"),
        "checkpointWithin": DURATION,
        "minSlowdownPercent": (12, 1, 1000),
        "outlierMADs": (5, 0),
        "minSamples": (5, 1),
        "sustainedReports": (3, 1),
        "minRanks": (3, 2),
        "stall": {
            "after": DURATION,
            "steps": (5, 1),
            "action": ("Notify", "RestartGang"),
            "joinAfter": DURATION,
            "firstStepAfter": DURATION,
            "unreachableAfter": DURATION,
        },
        "steady": {"minSlowdownPercent": (5, 0, 1000), "over": DURATION},
    },
    "spares": {"nodeSelector": SELECTOR, "size": (0, 2, 1000, 1001), "promoteIdleNodes": (True, False)},
    "signals": {
        "conditions": {"GpuPcieWatch": ("DevicesFailed", "Ignore"), "My_Cond": ("Degraded", "Notify")},
        "taints": {"nvidia.com/gpu-xid-error": ("DevicesFailed",), "devheal.io/x": ("Notify",)},
    },
    "degradation": {
        "enterAfter": DURATION,
        "leaveAfter": DURATION,
        "sources": [("ecc", "remap", "xid")],
        "noScheduleRemedies": [("RebootNode", "None")],
        "taint": (True, False),
        "inference": ("Deschedule", "Notify"),
        "inferenceGrace": DURATION,
        "gang": ("Notify", "ReplaceAtRestart", "ReplaceNow", "ReplaceAtCheckpoint"),
    },
    "repair": {"action": ("Drain", "Notify")},
}
POLICY = {
    "metadata": {
        "name": ("p", LONG_NAME),
        "generation": (1, 2),
        "annotations": {"devheal.io/paused": ("true", "false"), "devheal.io/reset-breaker": ("1",)},
    },
    "spec": {
        "selector": {"namespaces": [("ml", "default")], "podSelector": SELECTOR, "nodeSelector": SELECTOR},
        "actions": {"inference": ("Deschedule", "Notify"), "gang": ("RestartGang", "FailPod"), "batch": ("FailPod",)},
        "deviceErrorExitCodes": [(74, 255, 1)],
        "crashLoopRestarts": (3, 1),
        "allowDelete": (False, True),
        "failedDeviceGracePeriodSeconds": (5, 3600),
        "dryRun": (False, True),
        "paused": (False, True),
        **SECTIONS,
    },
    "status": {
        "circuitBreakerReset": ("1",),
        "conditions": [
            {
                "type": ("CircuitBreakerOpen",),
                "status": ("True", "False"),
                "reason": ("Reset",),
                "lastTransitionTime": (*HOSTILE_TIMES, GOOD_TIME),
            }
        ],
    },
}

TIME = (*HOSTILE_TIMES, GOOD_TIME)
CONTAINER = {
    "name": ("main",),
    "resources": {"limits": {GPU_RESOURCE: ("8", 8, "0", BIG)}, "requests": {GPU_RESOURCE: ("8",)}},
    "restartPolicyRules": [
        {"action": ("RestartAllContainers",), "exitCodes": {"operator": ("In",), "values": [(88, 10**400)]}}
    ],
}
POD = {
    "kind": ("Pod",),
    "metadata": {
        "namespace": ("ml",),
        "name": ("p", LONG_NAME),
        "uid": ("u",),
        "labels": {"app": ("a",), GANG_LABEL: LABEL_VALUES, "jobset.sigs.k8s.io/jobset-name": LABEL_VALUES},
        "annotations": {
            RESTART_GENERATION_ANNOTATION: ("1", BIG, "-1", "٣"),
            LAUNCHER_GENERATION_ANNOTATION: ("1", BIG),
            STEPS_ANNOTATION: ('{"count":3,"window":3,"p50":0.4,"last":1764587000.25}', "{}"),
        },
        "ownerReferences": [{"kind": ("Job",), "name": ("j",), "uid": ("x",), "controller": (True,)}],
        "deletionTimestamp": TIME,
    },
    "spec": {
        "nodeName": ("n1", LONG_NAME),
        "restartPolicy": ("Never", "Always"),
        "containers": [CONTAINER],
        "initContainers": [CONTAINER],
        "resourceClaims": [{"name": ("gpu",), "resourceClaimName": ("c",)}],
    },
    "status": {
        "phase": ("Running", "Failed"),
        "conditions": [{"type": ("Ready",), "status": ("True",)}],
        "resourceClaimStatuses": [{"name": ("gpu",), "resourceClaimName": ("c",)}],
        "containerStatuses": [
            {
                "name": ("main",),
                "restartCount": (0, 3, BIG),
                "state": {"waiting": {"reason": ("CrashLoopBackOff",)}, "terminated": {"exitCode": (74, -1, BIG)}},
                "lastState": {"terminated": {"exitCode": (1,)}},
                "allocatedResourcesStatus": [
                    {
                        "name": (GPU_RESOURCE, "claim:c/gpu"),
                        "resources": [{"resourceID": ("gpu-0",), "health": ("Unhealthy",), "message": ("m",)}],
                    }
                ],
            }
        ],
    },
}
NODE = {
    "kind": ("Node",),
    "metadata": {
        "name": ("n1", LONG_NAME),
        "uid": ("u",),
        "labels": {"devheal.io/pool": ("a",)},
        "annotations": {OWNERSHIP_ANNOTATION: ("taint,cordon", "degraded"), LIFTS_ANNOTATION: ("2", BIG)},
    },
    "spec": {"unschedulable": (True,), "taints": [{"key": ("k",), "value": ("v",), "effect": ("NoSchedule",)}]},
    "status": {
        "capacity": {GPU_RESOURCE: ("8", BIG)},
        "allocatable": {GPU_RESOURCE: ("8", "0")},
        "conditions": [
            {"type": ("Ready", "GpuPcieWatch"), "status": ("True",), "lastTransitionTime": TIME, "reason": ("r",)}
        ],
    },
}
NODE_DEVICES = {
    "kind": ("NodeDevices",),
    "metadata": {"name": ("n1", LONG_NAME), "uid": ("u",)},
    "spec": {"nodeName": ("n1",)},
    "status": {
        "updatedAt": TIME,
        "devices": [
            {
                "id": ("GPU-1", "gpu.example.com/pool/gpu-0", "x" * 300),
                "index": (0, "3", BIG),
                "health": ("Unhealthy", "Healthy", "Degraded"),
                "pod": {"namespace": ("ml",), "name": ("p",)},
                "reasons": [
                    {
                        "code": (79, "48", BIG),
                        "source": ("xid", "ecc"),
                        "reason": ("XidError",),
                        "health": ("Unhealthy", "Degraded"),
                        "remedy": ("ResetGPU", "ReplaceHardware"),
                        "message": ("fell off the bus",),
                        "firstSeen": TIME,
                    }
                ],
            }
        ],
        "conditions": [
            {
                "type": ("TelemetryAvailable",),
                "status": ("False",),
                "reason": ("DriverNotLoaded", "NVMLInitFailed"),
                "lastTransitionTime": TIME,
            }
        ],
    },
}
REMEDIATION = {
    "kind": ("Remediation",),
    "metadata": {
        "name": ("r",),
        "labels": {"devheal.io/epoch": ("0", "3", "n5", "-5", BIG), "devheal.io/step": ("1", "8")},
        "annotations": {"devheal.io/decision": ("Act", "Blocked")},
        "creationTimestamp": TIME,
    },
    "spec": {
        "action": ("Deschedule", "RemediateNode", "RestartGang", "TaintDevice"),
        "target": {
            "kind": ("Pod", "Node", "Gang", "Device"),
            "name": ("p",),
            "namespace": ("ml",),
            "uid": ("u",),
            "node": ("n1",),
        },
        "workload": {"kind": ("Job",), "namespace": ("ml",), "name": ("j",), "class": ("batch", "gang")},
        "finding": {
            "kind": ("DeviceFailed",),
            "source": ("pod-status", "pod-status,nodedevices"),
            "evidence": ("e",),
            "since": TIME,
            "deviceIDs": [("g",)],
            "pod": ("ml/p",),
            "podUID": ("u",),
        },
        "policy": ("p",),
        "dryRun": (False,),
    },
    "status": {
        "phase": ("InProgress", "Succeeded", "Blocked", "Pending"),
        "startedAt": TIME,
        "completedAt": TIME,
        "observedAt": TIME,
    },
}
RESOURCE_SLICE = {
    "kind": ("ResourceSlice",),
    "metadata": {"name": ("s",)},
    "spec": {
        "driver": ("gpu.example.com",),
        "pool": {"name": ("pool", "a/b")},
        "nodeName": ("n1",),
        "devices": [
            {
                "name": ("gpu-0",),
                "attributes": {"uuid": {"string": ("GPU-1",)}},
                "taints": [{"key": ("k",), "effect": ("NoSchedule", "NoExecute"), "timeAdded": TIME}],
            }
        ],
    },
}
DEVICE_TAINT_RULE = {
    "kind": ("DeviceTaintRule",),
    "metadata": {
        "name": ("r",),
        "labels": {MANAGED_BY_LABEL: (MANAGED_BY,)},
        "annotations": {DEVICE_ANNOTATION: ("gpu.example.com/pool/gpu-0",)},
        "creationTimestamp": TIME,
    },
    "spec": {
        "deviceSelector": {"driver": ("gpu.example.com",), "pool": ("pool",), "device": ("gpu-0",)},
        "taint": {"key": ("devheal.io/device-failure",), "effect": ("NoSchedule", "NoExecute")},
    },
}
