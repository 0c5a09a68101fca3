"""Typed records of the cluster, policies, findings and plans. No I/O."""
