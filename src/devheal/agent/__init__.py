"""The node agent: device health from NVML (or the lab's simulated GPUs) and kubelet, published as NodeDevices.

One agent runs per accelerator node (a DaemonSet). Every poll it reads each device's
telemetry through a ``TelemetryBackend`` (``nvml`` on a GPU node, ``simulated`` in the
lab), classifies it with a data table (``classification``), keeps per-device incident
and hold-down state (``health``), maps devices to the pods holding them through the
kubelet's pod-resources API (``podmap``), and publishes the result as the node's
``NodeDevices`` object, a node condition and Prometheus metrics (``publisher``,
``metrics``). ``runner`` ties these together; the pure parts (``telemetry``,
``classification``, ``health``, ``status``) do no I/O and take time as a parameter.
"""
