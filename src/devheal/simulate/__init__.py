"""The goodput simulator: replay a fleet's failures against remediation strategies.

A discrete-event model of GPU nodes, the workloads on them (training gangs with
checkpoints, inference replicas, batch jobs) and a spare pool. Failures come from a
seeded trace generator (``failures``) or a trace file (``tracefile``). Remediation
decisions for devheal strategies come from devheal's own engine (``detect``,
``FindingTracker``, ``decide``) under a real ``Policy``; only the cluster and the
hardware are modelled here. See docs/simulator.md.
"""
