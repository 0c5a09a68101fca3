"""The lab: a real local control plane (etcd, kube-apiserver, controller manager, scheduler) with kwok
nodes, simulated GPUs and fault injection."""
