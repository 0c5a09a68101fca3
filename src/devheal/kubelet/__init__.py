"""Kubelet APIs that devheal both serves (the lab's simulated kubelets) and consumes (the node agent)."""
