"""What a lab could leave behind on this machine, read from /proc, /sys and ``ip``/``iptables``:
namespaces, network links, iptables rules, the settings kubelet changes when it starts, and the
machine's routing settings."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devheal.lab.realnode import KUBELET_SYSCTLS, RealNode, cgroup_pids


def _namespaces(kind: str) -> frozenset[str]:
    """Every namespace of ``kind`` some process is in (``net:[4026531840]``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                found.add(str((entry / "ns" / kind).readlink()))
    return frozenset(found)


def _links() -> frozenset[str]:
    proc = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return frozenset(str(link["ifname"]) for link in json.loads(proc.stdout))


def _iptables() -> str:
    """All iptables and ip6tables rules and chains (no counters, no comments); empty where iptables is not installed."""
    lines = []
    for save in ("iptables-save", "ip6tables-save"):
        if shutil.which(save) is not None:
            proc = subprocess.run([save], capture_output=True, text=True)
            lines += [re.sub(r"\[\d+:\d+\]", "", line) for line in proc.stdout.splitlines() if not line.startswith("#")]
    return "\n".join(lines)


ROUTING_SYSCTLS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet", "net/ipv4/conf/default/route_localnet")
"""Machine-wide settings a way to the `kubernetes` Service could change (kube-proxy does): the lab must not."""


@dataclass(frozen=True)
class HostState:
    net_namespaces: frozenset[str]
    mount_namespaces: frozenset[str]
    links: frozenset[str]
    iptables: str
    sysctls: tuple[tuple[str, str], ...]

    @staticmethod
    def read() -> HostState:
        names = (*KUBELET_SYSCTLS, *ROUTING_SYSCTLS)
        sysctls = tuple((name, (Path("/proc/sys") / name).read_text().strip()) for name in names)
        return HostState(_namespaces("net"), _namespaces("mnt"), _links(), _iptables(), sysctls)


@dataclass(frozen=True)
class NodeTraces:
    """What a running real node has made on the machine: its mount namespace, its bridge and the veths
    on it, its pods' network namespaces."""

    mount_namespaces: frozenset[str]
    links: frozenset[str]
    net_namespaces: frozenset[str]

    @staticmethod
    def read(node: RealNode, mount_namespace: str) -> NodeTraces:
        ports = Path(f"/sys/class/net/{node.bridge}/brif")
        links = {node.bridge, *(port.name for port in ports.iterdir())} if ports.is_dir() else set()
        nets = set()
        for pid in cgroup_pids(node):
            with contextlib.suppress(OSError):
                nets.add(str(Path(f"/proc/{pid}/ns/net").readlink()))
        # A process kubelet or runc has just put in a pod's cgroup may not have joined the pod's network yet.
        nets.discard(str(Path("/proc/self/ns/net").readlink()))
        return NodeTraces(frozenset({mount_namespace}), frozenset(links), frozenset(nets))

    def still_there(self, now: HostState) -> dict[str, object]:
        """Which of these exist in ``now`` (empty: all gone)."""
        left: dict[str, object] = {
            "mount namespaces": sorted(self.mount_namespaces & now.mount_namespaces),
            "links": sorted(self.links & now.links),
            "network namespaces": sorted(self.net_namespaces & now.net_namespaces),
        }
        return {what: value for what, value in left.items() if value}


def lab_mounts(lab_dir: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(lab_dir) in line]


def lab_processes(lab_dir: Path) -> list[str]:
    """Processes whose command line names the lab directory (every lab component, every shim)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if str(lab_dir) in cmdline:
                    found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def cgroups_named(fragment: str) -> list[Path]:
    root = Path("/sys/fs/cgroup")
    return [path for hierarchy in root.iterdir() if hierarchy.is_dir() for path in hierarchy.glob(f"*{fragment}*")]
