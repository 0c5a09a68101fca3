"""The simulated kubelets of the lab: device manager, device plugin and pod lifecycle.

kwok keeps the lab's nodes alive (status, leases); this package does what a real
kubelet and the NVIDIA device plugin would do for pods bound to those nodes:

- admit a pod: allocate healthy device IDs per container, or fail the pod with
  ``UnexpectedAdmissionError`` when the node cannot satisfy it;
- run it: write a Running status whose containers carry KEP-4680
  ``allocatedResourcesStatus`` (one entry per allocated device); pods may opt in to a
  start-up cost (image pulls, container creation: Pending/ContainerCreating meanwhile) and a
  stop cost (containers handling SIGTERM) through ``devheal.io/sim-*`` annotations;
- keep node capacity/allocatable for ``nvidia.com/gpu`` equal to the device plugin's
  view (all devices / healthy devices; both 0 while the plugin restarts);
- on a fault, flip the device's health in the holding pod's status (the allocation
  stays, as on a real node);
- finish pods: delete terminating ones (grace 0, after their stop time), free devices of
  ended ones;
- serve kubelet's pod-resources v1 gRPC API per node on a unix socket;
- take fault injections over a loopback HTTP API, and persist device state to a
  JSON file so the state survives a restart and other tools can read it.

One process (``python -m devheal.lab.nodesim``) serves every node of the lab. Modules,
one job each:

- ``nodes``: node names and the Node object a node registers with;
- ``store``: the shared state of the simulated machines (devices, images), saved to a file;
- ``startup``: the opt-in start-up and stop cost model (annotations, jitter, image pulls);
- ``training``: the opt-in training process (framework start, in-place restarts by a launcher);
- ``pods``: what the simulator reads of a pod (``PodView``) and keeps of one it admitted;
- ``status``: the pod status bodies kubelet writes, device health included;
- ``kubelet``: admission, start, run, stop: the pod lifecycle;
- ``nodestatus``: Node registration and status (device plugin capacity/allocatable, images);
- ``podresources``: one node's answers for the pod-resources gRPC server;
- ``faultapi``: the loopback HTTP API that injects faults;
- ``simulator``: the parts wired and run; ``__main__``: the command line.

What pods and tools outside the simulator use (node names, the annotations a pod opts in
with) is re-exported here.
"""

from devheal.lab.nodesim.nodes import NODE_NAME_PREFIX, node_name
from devheal.lab.nodesim.pods import EXIT_CODE_ANNOTATION, RUN_SECONDS_ANNOTATION
from devheal.lab.nodesim.startup import (
    IMAGE_PULL_SECONDS_ANNOTATION,
    START_JITTER_SECONDS_ANNOTATION,
    START_SECONDS_ANNOTATION,
    STOP_JITTER_SECONDS_ANNOTATION,
    STOP_SECONDS_ANNOTATION,
)

__all__ = [
    "EXIT_CODE_ANNOTATION",
    "IMAGE_PULL_SECONDS_ANNOTATION",
    "NODE_NAME_PREFIX",
    "RUN_SECONDS_ANNOTATION",
    "START_JITTER_SECONDS_ANNOTATION",
    "START_SECONDS_ANNOTATION",
    "STOP_JITTER_SECONDS_ANNOTATION",
    "STOP_SECONDS_ANNOTATION",
    "node_name",
]
