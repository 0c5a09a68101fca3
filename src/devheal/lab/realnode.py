"""Real lab nodes: Kubernetes' own kubelet with containerd, runc and the CNI plugins, beside the kwok nodes.

A real node lives in ``<lab>/nodes/<name>/`` (configuration, containerd's root and state, kubelet's
root, pod logs) and in a mount namespace of its own: containerd starts in a new one (``unshare``)
and kubelet joins it (``nsenter``), so what they mount (container root filesystems, the pods'
network namespaces, kubelet's volumes) is invisible to the machine and goes away with them. In
that namespace three fixed paths are the node's own: ``/var/lib/kubelet/device-plugins`` (where
kubelet always listens for device plugins) and ``/var/lib/kubelet/pod-resources`` (where a node
agent finds kubelet's pod-resources socket, as on any node: the chart mounts that host path) are
bound to the node's directories, and ``/run/containerd`` (where containerd always puts its shims'
sockets) is a private tmpfs.

Networking: each node has a Linux bridge with a /24 of its own in a 10.x.0.0/16 the lab picks
clear of the machine's routes; containerd's CNI (bridge + host-local + portmap; loopback for
``lo``) puts each pod in its own network namespace with an address from it, its default route
through the bridge's address. No masquerading and no IP forwarding turned on: pod traffic reaches
this machine and its pods, and goes nowhere else. The ``kubernetes`` Service: one nat rule per
node takes its pods' connections to the Service's ClusterIP (port 443) to the API server on
127.0.0.1 (DNAT), which the bridge's own ``route_localnet`` lets through; both go with the node
(the rule at teardown, the setting with the bridge). Not kube-proxy: the real nodes share this
machine's network namespace, so a kube-proxy per node (or per lab, with labs side by side) would
each claim the same KUBE-* chains, and it would want the API server off loopback, an endpoint
reconciler and machine-wide settings; the pods need no other Service. Pods' cgroups live under a cgroup root per node
(``/devheal-<lab id>-<node>`` in every hierarchy), so ``teardown`` finds every process and
every cgroup a node made.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devheal.lab import toolchain
from devheal.lab.commands import FEATURE_GATES
from devheal.lab.images import PAUSE_IMAGE
from devheal.lab.pki import KUBERNETES_SERVICE_IP

REAL_NODE_LABEL = "devheal.io/real-node"
"""Label (value ``true``) and NoSchedule taint key of every real node: the lab's simulated workloads
schedule onto kwok nodes only; a pod meant for a real node tolerates the taint."""


def real_node_toleration() -> dict[str, str]:
    """The toleration of the real nodes' NoSchedule taint."""
    return {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}


def on_real_nodes() -> dict[str, Any]:
    """The pod spec fields that place a pod on a real node: their label as node selector, their taint tolerated."""
    return {"nodeSelector": {REAL_NODE_LABEL: "true"}, "tolerations": [real_node_toleration()]}


CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
HOST_POD_RESOURCES_DIR = Path("/var/lib/kubelet/pod-resources")
HOST_CONTAINERD_RUN_DIR = Path("/run/containerd")

_NAMESPACE_SETUP = f"""set -e
mount --bind "$1" {HOST_DEVICE_PLUGIN_DIR}
mount --bind "$2" {HOST_POD_RESOURCES_DIR}
mount -t tmpfs -o mode=0711 devheal-lab {HOST_CONTAINERD_RUN_DIR}
shift 2
exec "$@"
"""


class RealNodeError(RuntimeError):
    """A real node could not be set up or torn down; the message says which node and what failed."""


def check_machine() -> None:
    """Raise RealNodeError saying what is missing when real nodes cannot run on this machine."""
    if os.geteuid() != 0:
        raise RealNodeError("--real-nodes needs root: real nodes make network namespaces, cgroups and bridges")
    missing = [tool for tool in ("unshare", "nsenter", "ip", "mount", "iptables") if shutil.which(tool) is None]
    if missing:
        raise RealNodeError(
            f"--real-nodes needs {', '.join(missing)} on PATH (Debian: util-linux, iproute2, mount, iptables)"
        )
    if not _hierarchies():
        raise RealNodeError(f"--real-nodes needs cgroups mounted under {CGROUP_ROOT}")


def lab_id(lab_dir: Path) -> str:
    """A short, stable name for the lab, for host-wide names (bridges, cgroups)."""
    return hashlib.sha256(str(lab_dir).encode()).hexdigest()[:6]


@dataclass(frozen=True)
class RealNode:
    """One real node's names, paths and addresses (pure: nothing is created by making one)."""

    name: str
    index: int
    lab_dir: Path
    pod_network: ipaddress.IPv4Network
    """The lab's 10.x.0.0/16; this node gets its ``index``-th /24."""

    @property
    def dir(self) -> Path:
        return self.lab_dir / "nodes" / self.name

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return list(self.pod_network.subnets(new_prefix=24))[self.index]

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The bridge's address: the pods' gateway, and the node's InternalIP."""
        return self.subnet.network_address + 1

    @property
    def bridge(self) -> str:
        return f"dhl{lab_id(self.lab_dir)}b{self.index}"  # at most 15 characters: a Linux interface name

    @property
    def cgroup_root(self) -> str:
        return f"/devheal-{lab_id(self.lab_dir)}-{self.name}"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd.toml"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def device_plugin_dir(self) -> Path:
        """Kubelet's device-plugin directory as seen from the machine (``kubelet.sock`` is in it)."""
        return self.dir / "device-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def service_rule_comment(self) -> str:
        """Marks the node's nat rule, so teardown finds it (also one a killed lab left)."""
        return f"devheal-lab {lab_id(self.lab_dir)} {self.name}: kubernetes Service"

    def containerd_component(self) -> str:
        return f"containerd/{self.name}"

    def kubelet_component(self) -> str:
        return f"kubelet/{self.name}"


def pick_pod_network(lab_dir: Path) -> ipaddress.IPv4Network:
    """A 10.x.0.0/16 (x in 200..249, starting from the lab's id) that overlaps no route of this machine."""
    taken = _host_networks()
    start = int(lab_id(lab_dir), 16) % 50
    for step in range(50):
        candidate = ipaddress.IPv4Network(f"10.{200 + (start + step) % 50}.0.0/16")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise RealNodeError("found no free 10.x.0.0/16 (x in 200..249) for the real nodes' pods: every one is routed")


def _host_networks() -> list[ipaddress.IPv4Network]:
    proc = subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True, text=True)
    networks = []
    for route in json.loads(proc.stdout or "[]") if proc.returncode == 0 else []:
        dst = str(route.get("dst") or "")
        if dst in ("", "default"):
            continue
        with contextlib.suppress(ValueError):
            networks.append(ipaddress.IPv4Network(dst, strict=False))
    return networks


# ---- configuration (pure renders) ---------------------------------------------------------------


def _can_lower_oom_score() -> bool:
    """Whether this process holds CAP_SYS_RESOURCE (bit 24 of its effective capabilities)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))
    return True


def containerd_toml(node: RealNode) -> str:
    """containerd's configuration (version 3): the node's own root, state and sockets, CRI with runc and CNI."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{cri_runtime}.containerd.runtimes.runc"
    lines = [
        "version = 3",
        f"root = '{node.dir / 'containerd' / 'root'}'",
        f"state = '{node.dir / 'containerd' / 'state'}'",
        "disabled_plugins = [",
        "  'io.containerd.snapshotter.v1.zfs', 'io.containerd.snapshotter.v1.devmapper',",
        "  'io.containerd.snapshotter.v1.blockfile', 'io.containerd.nri.v1.nri',",
        "  'io.containerd.tracing.processor.v1.otlp', 'io.containerd.internal.v1.tracing',",
        "]",
        "[grpc]",
        f"  address = '{node.containerd_socket}'",
        "[ttrpc]",
        f"  address = '{node.containerd_socket}.ttrpc'",
        "[debug]",
        "  level = 'info'",
        "[plugins.'io.containerd.internal.v1.opt']",
        f"  path = '{node.dir / 'containerd' / 'opt'}'",
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"  sandbox = '{PAUSE_IMAGE}'",
        f"[{cri_runtime}]",
        "  netns_mounts_under_state_dir = true",
        # Without CAP_SYS_RESOURCE (some sandboxes drop it) no process may lower its oom_score_adj, and kubelet
        # asks -998 for every pod sandbox: clamp to containerd's own instead of failing every pod.
        f"  restrict_oom_score_adj = {'false' if _can_lower_oom_score() else 'true'}",
        f"[{cri_runtime}.containerd]",
        "  default_runtime_name = 'runc'",
        f"[{runc}]",
        "  runtime_type = 'io.containerd.runc.v2'",
        f"[{runc}.options]",
        f"  BinaryName = '{toolchain.NODE.binary('runc')}'",
        "  SystemdCgroup = false",
        f"[{cri_runtime}.cni]",
        f"  bin_dirs = ['{toolchain.NODE.bin_dir}']",
        f"  conf_dir = '{node.cni_conf_dir}'",
        "  max_conf_num = 1",
    ]
    return "\n".join(lines) + "\n"


def cni_conflist(node: RealNode) -> dict[str, Any]:
    """The pod network: the node's bridge, an address from its /24, host ports through portmap."""
    return {
        "cniVersion": "1.0.0",
        "name": "devheal-lab",
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                # The lab gives the bridge its address; as a "gateway" the plugin would also turn on the
                # machine's IP forwarding, which would let pod traffic leave the machine.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(node.subnet), "gateway": str(node.gateway)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node.dir / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_configuration(node: RealNode, ca_cert: Path, port: int, healthz_port: int) -> dict[str, Any]:
    """KubeletConfiguration: cgroup v1 through cgroupfs under the node's cgroup root, the lab's feature
    gates, x509 client authentication against the lab's CA, and no image GC or disk eviction (the
    images were imported, they cannot be pulled again)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "address": str(node.gateway),
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "featureGates": dict(FEATURE_GATES),
        "failSwapOn": False,
        "podLogsDir": str(node.dir / "pod-logs"),
        "resolvConf": "",
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "registerWithTaints": [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
        "maxPods": 32,
        "rotateCertificates": False,
        "serializeImagePulls": False,
        "protectKernelDefaults": False,
        # Else kubelet adds iptables chains to the machine (a hint for kube-proxy, a localnet firewall) and no
        # one removes them: the lab runs no iptables-mode kube-proxy to read them.
        "makeIPTablesUtilChains": False,
    }


KUBERNETES_SERVICE_PORT = 443


def kubernetes_service_rule(node: RealNode, apiserver_port: int) -> list[str]:
    """The nat PREROUTING rule taking the node's pods' connections to the ``kubernetes`` Service to the API server."""
    return [
        "-i", node.bridge,
        "-d", f"{KUBERNETES_SERVICE_IP}/32",
        "-p", "tcp", "-m", "tcp", "--dport", str(KUBERNETES_SERVICE_PORT),
        "-m", "comment", "--comment", node.service_rule_comment,
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}",
    ]  # fmt: skip


def containerd_command(node: RealNode) -> list[str]:
    """containerd in a new private mount namespace, with the node's three fixed paths set up first."""
    return [
        "unshare",
        "--mount",
        "--propagation=private",
        "--",
        "sh",
        "-c",
        _NAMESPACE_SETUP,
        "devheal-lab-node",
        str(node.device_plugin_dir),
        str(node.pod_resources_socket.parent),
        str(toolchain.NODE.binary("containerd")),
        f"--config={node.containerd_config}",
    ]


def kubelet_command(node: RealNode, containerd_pid: int) -> list[str]:
    """kubelet in containerd's mount namespace: the paths it hands containerd are the same there."""
    return [
        "nsenter",
        f"--mount=/proc/{containerd_pid}/ns/mnt",
        "--",
        str(toolchain.NODE.binary("kubelet")),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubeconfig}",
        f"--root-dir={node.kubelet_root}",
        f"--cert-dir={node.dir / 'pki'}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.gateway}",
        f"--node-labels={REAL_NODE_LABEL}=true",
        "--v=2",
    ]


def node_environment() -> dict[str, str]:
    """containerd finds its shim (and the shim runc) on PATH: the real nodes' bin directory goes first."""
    return {**os.environ, "PATH": f"{toolchain.NODE.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


# ---- the machine's side ---------------------------------------------------------------------------


def prepare(node: RealNode, ca_cert: Path, kubeconfig: str, port: int, healthz_port: int, apiserver_port: int) -> None:
    """Write the node's configuration and make what it needs on the machine: its cgroup root in every
    hierarchy, its bridge with the gateway address, the three mount points its namespace binds over, and
    the way from its pods to the API server through the ``kubernetes`` Service."""
    import yaml

    # Every `up` is a fresh node, as it is a fresh cluster: no containers, images or addresses from an earlier run.
    # (Nothing of an earlier run is mounted here: its mounts lived and died in its own mount namespace.)
    shutil.rmtree(node.dir, ignore_errors=True)
    for sub in ("containerd", "kubelet/pod-resources", "device-plugins", "pod-logs", "pki", "cni/net.d", "cni/ipam"):
        (node.dir / sub).mkdir(parents=True, exist_ok=True)
    node.containerd_config.write_text(containerd_toml(node))
    (node.cni_conf_dir / "10-devheal-lab.conflist").write_text(json.dumps(cni_conflist(node), indent=2))
    node.kubelet_config.write_text(yaml.safe_dump(kubelet_configuration(node, ca_cert, port, healthz_port)))
    node.kubeconfig.write_text(kubeconfig)
    node.kubeconfig.chmod(0o600)
    for path in (HOST_DEVICE_PLUGIN_DIR, HOST_POD_RESOURCES_DIR, HOST_CONTAINERD_RUN_DIR):
        path.mkdir(parents=True, exist_ok=True)
    _make_cgroup_root(node)
    _make_bridge(node)
    _route_kubernetes_service(node, apiserver_port)


def _hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, the v2 'unified' one)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def _make_cgroup_root(node: RealNode) -> None:
    for hierarchy in _hierarchies():
        path = hierarchy / node.cgroup_root.lstrip("/")
        path.mkdir(exist_ok=True)
        # A v1 cpuset cgroup starts with no CPUs and no memory nodes: give it its parent's.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((hierarchy / knob).read_text())


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RealNodeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


def _make_bridge(node: RealNode) -> None:
    if not Path(f"/sys/class/net/{node.bridge}").exists():
        _ip("link", "add", node.bridge, "type", "bridge")
    _ip("addr", "replace", f"{node.gateway}/{node.subnet.prefixlen}", "dev", node.bridge)
    _ip("link", "set", node.bridge, "up")


def _iptables(*args: str) -> str:
    proc = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RealNodeError(f"`iptables {shlex.join(args)}` failed: {proc.stderr.strip()}")
    return proc.stdout


def _route_kubernetes_service(node: RealNode, apiserver_port: int) -> None:
    """Pods reach the API server, which listens on loopback, at the ``kubernetes`` Service's ClusterIP.

    Routing to 127.0.0.1 from another interface is refused unless that interface allows it: the
    bridge's own ``route_localnet`` (not the machine-wide one) does, for the bridge alone, and goes with it."""
    _remove_service_rules(node)  # one a killed lab left with the same name
    (Path("/proc/sys/net/ipv4/conf") / node.bridge / "route_localnet").write_text("1")
    _iptables("-t", "nat", "-A", "PREROUTING", *kubernetes_service_rule(node, apiserver_port))


def _remove_service_rules(node: RealNode) -> list[str]:
    """Delete the node's nat rules (found by their comment); return those that could not be deleted."""
    try:
        listed = _iptables("-t", "nat", "-S", "PREROUTING")
    except RealNodeError as exc:
        return [f"{node.name}: iptables rules ({exc})"]
    left = []
    for line in listed.splitlines():
        words = shlex.split(line)
        if words[:2] == ["-A", "PREROUTING"] and node.service_rule_comment in words:
            try:
                _iptables("-t", "nat", "-D", "PREROUTING", *words[2:])
            except RealNodeError as exc:
                left.append(f"{node.name}: iptables rule {line!r} ({exc})")
    return left


def containerd_answers(node: RealNode) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        try:
            sock.connect(str(node.containerd_socket))
        except OSError:
            return False
    return True


KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
"""Machine-wide settings kubelet sets when it starts (its "kernel tunables"); the lab puts them back at ``down``."""


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def restore_sysctls(values: dict[str, str]) -> list[str]:
    """Write back what ``read_sysctls`` read; return the settings that could not be written."""
    failed = []
    for name, value in values.items():
        path = Path("/proc/sys") / name
        try:
            if path.read_text().strip() != value:
                path.write_text(value)
        except OSError as exc:
            failed.append(f"sysctl {name.replace('/', '.')}={value} ({exc.strerror})")
    return failed


# ---- teardown ------------------------------------------------------------------------------------


def _cgroup_dirs(node: RealNode) -> list[Path]:
    """The node's cgroups in every hierarchy, deepest first."""
    found: list[Path] = []
    for hierarchy in _hierarchies():
        top = hierarchy / node.cgroup_root.lstrip("/")
        if top.is_dir():
            found += [Path(root) for root, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(node: RealNode) -> set[int]:
    """Every process in one of the node's cgroups (the pods' processes)."""
    pids: set[int] = set()
    for path in _cgroup_dirs(node):
        with contextlib.suppress(OSError):
            pids |= {int(line) for line in (path / "cgroup.procs").read_text().split()}
    return pids


def namespace_pids(mount_ns: str) -> set[int]:
    """Every process in the mount namespace ``mount_ns`` (as ``readlink /proc/PID/ns/mnt`` prints it).

    Never the machine's own namespace (ours, or init's): a node that failed to get one of its own
    must not make teardown kill every process of the machine."""
    pids: set[int] = set()
    if not mount_ns or mount_ns in (mount_namespace(os.getpid()), mount_namespace(1)):
        return pids
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if str((entry / "ns" / "mnt").readlink()) == mount_ns:
                    pids.add(int(entry.name))
    return pids


def mount_namespace(pid: int) -> str:
    try:
        return str(Path(f"/proc/{pid}/ns/mnt").readlink())
    except OSError:
        return ""


def _kill(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[1][:1] != "Z"


def _wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    left = {pid for pid in pids if _alive(pid)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {pid for pid in left if _alive(pid)}
    return left


def teardown(node: RealNode, mount_ns: str, kubelet_pid: int | None, containerd_pid: int | None) -> list[str]:
    """Stop a real node and remove everything it made; return what could not be removed (empty: nothing left).

    Order: kubelet (so nothing restarts a container), the pods' processes (SIGKILL, found by cgroup),
    the shims and anything else in the node's mount namespace but containerd (SIGKILL), containerd
    (SIGTERM, then SIGKILL). The mount namespace dies with its last process, taking every mount and the
    pods' network namespaces (whose veths go with them); then the cgroups and the bridge are removed."""
    leftover: list[str] = []
    if kubelet_pid and _alive(kubelet_pid):
        _kill({kubelet_pid}, signal.SIGTERM)
        if _wait_gone({kubelet_pid}, 10):
            _kill({kubelet_pid}, signal.SIGKILL)
            _wait_gone({kubelet_pid}, 5)
    for _ in range(3):  # a dying shim can still start nothing, but be thorough: until the cgroups are empty
        pods = cgroup_pids(node)
        if not pods:
            break
        _kill(pods, signal.SIGKILL)
        _wait_gone(pods, 5)
    others = namespace_pids(mount_ns) - {containerd_pid or 0}
    _kill(others, signal.SIGKILL)
    _wait_gone(others, 5)
    if containerd_pid and _alive(containerd_pid):
        _kill({containerd_pid}, signal.SIGTERM)
        if _wait_gone({containerd_pid}, 10):
            _kill({containerd_pid}, signal.SIGKILL)
    still = _wait_gone(namespace_pids(mount_ns) | cgroup_pids(node), 5)
    leftover += [f"{node.name}: process {pid}" for pid in sorted(still)]
    for path in _cgroup_dirs(node):
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            leftover.append(f"{node.name}: cgroup {path} ({exc.strerror})")
    leftover += _remove_bridge(node)
    leftover += _remove_service_rules(node)
    return leftover


def _remove_bridge(node: RealNode) -> list[str]:
    if not Path(f"/sys/class/net/{node.bridge}").exists():
        return []
    # Pods' veths vanish with their network namespaces; any still attached (a namespace pinned elsewhere) go here.
    ports = Path(f"/sys/class/net/{node.bridge}/brif")
    for port in sorted(ports.iterdir()) if ports.is_dir() else []:
        with contextlib.suppress(RealNodeError):
            _ip("link", "delete", port.name)
    try:
        _ip("link", "delete", node.bridge)
    except RealNodeError as exc:
        return [f"{node.name}: bridge {node.bridge} ({exc})"]
    return []
