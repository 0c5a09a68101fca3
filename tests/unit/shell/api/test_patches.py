"""The in-memory API server's patch formats and selectors, on the RFCs' own examples."""

from __future__ import annotations

from typing import Any

import pytest

from tests.shell.patches import PatchError, TestFailed, json_patch, merge_patch, strategic_merge_patch
from tests.shell.selectors import SelectorError, field_matcher, label_matcher

# RFC 7386, appendix A.
MERGE_EXAMPLES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), MERGE_EXAMPLES)
def test_merge_patch_follows_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


def test_json_patch_follows_rfc_6902() -> None:
    doc = {"foo": ["bar", "baz"], "q": {"x": 1}}
    ops = [
        {"op": "add", "path": "/foo/1", "value": "qux"},
        {"op": "remove", "path": "/foo/0"},
        {"op": "replace", "path": "/q/x", "value": 2},
        {"op": "move", "from": "/q/x", "path": "/moved"},
        {"op": "copy", "from": "/foo", "path": "/copied"},
        {"op": "add", "path": "/foo/-", "value": "end"},
        {"op": "add", "path": "/a~1b", "value": 0},
        {"op": "test", "path": "/moved", "value": 2},
    ]
    assert json_patch(doc, ops) == {
        "foo": ["qux", "baz", "end"],
        "q": {},
        "moved": 2,
        "copied": ["qux", "baz"],
        "a/b": 0,
    }
    assert doc == {"foo": ["bar", "baz"], "q": {"x": 1}}  # the target is left alone


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/foo/5", "value": 1}],
        [{"op": "add", "path": "/no/such/parent", "value": 1}],
        [{"op": "explode", "path": "/foo"}],
        {"op": "add"},
    ],
)
def test_a_json_patch_that_cannot_apply_is_an_error(ops: Any) -> None:
    with pytest.raises(PatchError):
        json_patch({"foo": [1]}, ops)


def test_a_failed_test_operation_is_its_own_error() -> None:
    with pytest.raises(TestFailed):
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])


def test_strategic_merge_merges_keyed_lists_and_replaces_the_others() -> None:
    pod = {
        "metadata": {"finalizers": ["a"]},
        "spec": {"schedulingGates": [{"name": "g1"}, {"name": "g2"}], "tolerations": [{"key": "t"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    patch = {
        "metadata": {"finalizers": ["b", "a"]},
        "spec": {"schedulingGates": [{"name": "g1", "$patch": "delete"}], "tolerations": [{"key": "u"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]},
        "$setElementOrder/conditions": [{"type": "Ready"}],
    }
    assert strategic_merge_patch(pod, patch) == {
        "metadata": {"finalizers": ["a", "b"]},
        "spec": {"schedulingGates": [{"name": "g2"}], "tolerations": [{"key": "u"}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]},
    }


def test_strategic_merge_needs_the_merge_key() -> None:
    with pytest.raises(PatchError):
        strategic_merge_patch({}, {"conditions": [{"status": "True"}]})


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("", ["a", "b", "c"]),
        ("app", ["a", "b"]),
        ("!app", ["c"]),
        ("app=web", ["a"]),
        ("app==web", ["a"]),
        ("app!=web", ["b", "c"]),
        ("app in (web, db)", ["a", "b"]),
        ("app notin (web),tier", ["b"]),
    ],
)
def test_label_selectors(selector: str, names: list[str]) -> None:
    objects = {
        "a": {"metadata": {"labels": {"app": "web"}}},
        "b": {"metadata": {"labels": {"app": "db", "tier": "x"}}},
        "c": {"metadata": {}},
    }
    match = label_matcher(selector)
    assert [name for name, obj in objects.items() if match(obj)] == names


def test_field_selectors_read_dotted_paths() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "unschedulable": True}}
    assert field_matcher("spec.nodeName=n1,metadata.name==p")(obj)
    assert field_matcher("spec.unschedulable=true")(obj)
    assert not field_matcher("spec.nodeName!=n1")(obj)
    assert field_matcher("status.phase=")(obj)
    with pytest.raises(SelectorError):
        field_matcher("spec.nodeName")
