"""What the agent's admission policy says to a write of a node's NodeDevices, asked without storing anything."""

from __future__ import annotations

from typing import Any

from devheal.agent.publisher import FIELD_MANAGER, node_devices_path
from devheal.kube import errors
from devheal.kube.client import KubeClient
from devheal.model.api import GROUP_VERSION

OWN_NODE_ONLY = "only write the NodeDevices and the status of its own node"
"""The policy's message when an agent writes another node's NodeDevices."""


def node_devices(name: str, node_name: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "NodeDevices",
        "metadata": {"name": name},
        "spec": {"nodeName": node_name or name},
    }


async def refusal_of_node_devices(client: KubeClient, node: str) -> str:
    """The API server's refusal of ``client`` applying ``node``'s NodeDevices, or "" when it would let it through.

    A dry run: it goes through admission too, and leaves nothing behind if it is let through."""
    try:
        await client.request(
            "PATCH",
            node_devices_path(node),
            params={"fieldManager": FIELD_MANAGER, "force": "true", "dryRun": "All"},
            body=node_devices(node),
            content_type="application/apply-patch+yaml",
        )
    except errors.Forbidden as exc:
        return str(exc)
    return ""
