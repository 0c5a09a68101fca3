"""DRA claim devices in the pod-resources API survive the wire both ways, as kubelet's ``dynamic_resources``."""

from __future__ import annotations

from devheal.kubelet.podresources import ClaimResource, ContainerResources, DynamicResource, PodResources, api_pb2
from devheal.kubelet.podresources._convert import pod_from_pb, pod_to_pb


def test_dynamic_resources_round_trip_through_the_wire_format() -> None:
    pod = PodResources(
        namespace="ns",
        name="p",
        containers=(
            ContainerResources(
                name="main",
                devices=(),
                dynamic=(
                    DynamicResource(
                        "p-gpu-abcde",
                        "ns",
                        (ClaimResource("gpu.devheal.io", "node-1", "gpu-3", ("gpu.devheal.io/gpu=gpu-3",)),),
                    ),
                ),
            ),
        ),
    )
    wire = api_pb2.PodResources.FromString(pod_to_pb(pod).SerializeToString())
    (claim,) = wire.containers[0].dynamic_resources
    assert (claim.claim_name, claim.claim_namespace) == ("p-gpu-abcde", "ns")
    assert claim.claim_resources[0].device_name == "gpu-3"
    assert pod_from_pb(wire) == pod
