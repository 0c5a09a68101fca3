"""API paths from their parts."""

from __future__ import annotations

from devheal.kube.client import api_path


def test_api_path_builds_core_group_namespaced_and_subresource_paths() -> None:
    assert api_path("v1", "nodes") == "/api/v1/nodes"
    assert api_path("v1", "pods", namespace="ns", name="p", subresource="eviction") == (
        "/api/v1/namespaces/ns/pods/p/eviction"
    )
    assert api_path("devheal.io/v1alpha1", "remediations", name="a b") == "/apis/devheal.io/v1alpha1/remediations/a%20b"
