"""devheal's API group and version: one definition for every module that names its resources."""

from __future__ import annotations

GROUP = "devheal.io"
VERSION = "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
"""The ``apiVersion`` of RemediationPolicy, Remediation and NodeDevices objects."""
