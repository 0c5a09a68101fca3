"""Start, check and stop a lab cluster: real control-plane processes on loopback.

A lab lives in one directory: certificates, kubeconfig, etcd data, a log per
component and ``lab.json`` (ports and process ids), so ``devheal lab down`` from
another shell finds and stops everything. Components start in dependency order,
each awaited until its health endpoint answers; a component that dies or never
becomes healthy fails ``up`` with the tail of its log, and what was started is
stopped again.

Stopping goes the other way, one tier at a time (``STOP_ORDER``): each component gets
SIGTERM, a bounded grace, then SIGKILL, and the next tier is signalled only once the
previous one is gone, so kube-apiserver never drains its requests against a dead etcd.

Real nodes (``LabSpec.real_nodes``, devheal.lab.realnode) start after the simulated ones
are Ready, each a containerd and a kubelet; ``down`` tears them down first, pods and all.

Kueue (``LabSpec.kueue``, devheal.lab.kueue) starts last, once every node is Ready: its CRDs,
its controller manager, then its webhook configurations; ``down`` stops it before the control plane.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devheal.lab import commands, images, kueue, realnode, toolchain, versions
from devheal.lab.commands import FEATURE_GATES as FEATURE_GATES
from devheal.lab.pki import LabPki
from devheal.lab.realnode import RealNode
from devheal.model.cluster import GPU_RESOURCE

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "nodesim")

STOP_ORDER = (("nodesim", "kwok"), ("kube-scheduler", "kube-controller-manager"), ("kube-apiserver",), ("etcd",))
"""Tiers in which ``down`` stops the components: those that depend on a component go before it."""

STOP_GRACE = 10.0
"""Seconds a tier has to exit after SIGTERM before it gets SIGKILL."""

KILL_WAIT = 5.0
"""Seconds a process has to be gone after SIGKILL before ``down`` reports it as left over."""

MAX_REAL_NODES = 8
"""Real nodes cost a kubelet and a containerd each (and a /24 of the lab's pod network)."""

ProgressFn = Callable[[str], None]


class LabError(RuntimeError):
    """The lab could not be started, checked or stopped; the message says which component and why."""


@dataclass(frozen=True)
class LabSpec:
    nodes: int = 4
    gpus_per_node: int = 8
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    pod_resources_sockets: bool = True
    dra_nodes: int = 0
    """The last this many simulated nodes expose their GPUs through the simulated DRA driver, not the device plugin."""
    real_nodes: int = 0
    """The last this many of the ``nodes`` are real (kubelet, containerd, runc); the others are kwok nodes."""
    kueue: bool = False
    """Run Kueue's controller manager (devheal.lab.kueue) against the lab."""

    @property
    def simulated_nodes(self) -> int:
        return self.nodes - self.real_nodes

    def validate(self) -> None:
        if not 0 <= self.real_nodes <= min(self.nodes, MAX_REAL_NODES):
            raise LabError(
                f"--real-nodes must be between 0 and --nodes ({self.nodes}), at most {MAX_REAL_NODES}, "
                f"got {self.real_nodes}"
            )
        if not 0 <= self.dra_nodes <= self.simulated_nodes:
            raise LabError(
                f"--dra-nodes must be between 0 and the simulated nodes (--nodes minus --real-nodes: "
                f"{self.simulated_nodes}), got {self.dra_nodes}"
            )
        if not 1 <= self.nodes <= 5000:
            raise LabError(f"--nodes must be between 1 and 5000, got {self.nodes}")
        if not 0 <= self.gpus_per_node <= 64:
            raise LabError(f"--gpus-per-node must be between 0 and 64, got {self.gpus_per_node}")
        if not self.gpu_model.strip():
            raise LabError("--gpu-model must not be empty")


@dataclass
class LabState:
    spec: LabSpec
    ports: dict[str, int]
    pids: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0
    ready_seconds: float = 0.0
    pod_network: str = ""
    """The real nodes' 10.x.0.0/16 (empty without real nodes)."""
    mount_namespaces: dict[str, str] = field(default_factory=dict)
    """Each real node's mount namespace (``readlink /proc/PID/ns/mnt`` of its containerd), for ``down``."""
    host_sysctls: dict[str, str] = field(default_factory=dict)
    """The machine's settings kubelet changes, as they were before the first real node started."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> LabState:
        data = json.loads(text)
        return LabState(
            spec=LabSpec(**data["spec"]),
            ports={k: int(v) for k, v in data["ports"].items()},
            pids={k: int(v) for k, v in data.get("pids", {}).items()},
            started_at=float(data.get("started_at", 0.0)),
            ready_seconds=float(data.get("ready_seconds", 0.0)),
            pod_network=str(data.get("pod_network", "")),
            mount_namespaces={k: str(v) for k, v in data.get("mount_namespaces", {}).items()},
            host_sysctls={k: str(v) for k, v in data.get("host_sysctls", {}).items()},
        )

    def real_nodes(self, lab_dir: Path) -> list[RealNode]:
        if not self.spec.real_nodes or not self.pod_network:
            return []
        network = ipaddress.IPv4Network(self.pod_network)
        first = self.spec.simulated_nodes
        return [
            RealNode(name=node_name(first + i), index=i, lab_dir=lab_dir, pod_network=network)
            for i in range(self.spec.real_nodes)
        ]


def default_lab_dir() -> Path:
    explicit = os.environ.get("DEVHEAL_LAB_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME")
    return (Path(state) if state else Path.home() / ".local" / "state") / "devheal" / "lab"


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LAB_PORTS = 12000
"""How many ports below the kernel's ephemeral range the lab chooses its listeners' ports from."""
_handed_out: deque[int] = deque(maxlen=2000)
"""Ports this process chose lately: two components started together never get the same one."""


def _ephemeral_low() -> int:
    try:
        return max(2048, int(EPHEMERAL_RANGE.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port for a component to listen on, below the kernel's ephemeral range. A port the kernel
    hands out for port 0 could be taken between this choice and the component's own bind, by a process that
    listens on port 0 or by any outgoing connection; the component then fails to start while another process
    answers its health check (seen: a kube-controller-manager that never ran, every later test failing)."""
    low = _ephemeral_low()
    floor = max(1024, low - LAB_PORTS)
    for _ in range(500):
        port = random.randrange(floor, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.append(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # that whole range taken: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone once its other threads are
    # gone too: until then a zombie leader's threads are still exiting and may hold its sockets.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(") ", 1)[1][:1] != "Z" or len(list(Path(f"/proc/{pid}/task").iterdir())) > 1
    except OSError:
        return False


class Lab:
    """A lab cluster rooted at ``directory``."""

    def __init__(self, directory: Path | None = None) -> None:
        self.dir = (directory or default_lab_dir()).resolve()
        self.pki = LabPki(self.dir / "pki")
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ---- paths -------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def state_path(self) -> Path:
        return self.dir / "lab.json"

    @property
    def devices_path(self) -> Path:
        return self.dir / "devices.json"

    @property
    def socket_dir(self) -> Path:
        return self.dir / "sock"

    def log_path(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def pod_resources_socket(self, node: str) -> Path:
        return self.socket_dir / f"{node}.sock"

    def state(self) -> LabState | None:
        try:
            return LabState.from_json(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise LabError(f"{self.state_path} is unreadable ({exc}); remove the directory to start over") from exc

    def control_url(self, node: str | None = None) -> str:
        """The fault API of the node simulator, or of ``node``'s device plugin when it is a real node."""
        state = self.state()
        if state is None:
            raise LabError(f"no lab is running in {self.dir} (start one with `devheal lab up`)")
        plugin = state.ports.get(f"deviceplugin/{node}") if node else None
        return f"http://127.0.0.1:{plugin or state.ports['nodesim']}"

    # ---- start -------------------------------------------------------------------------------

    def up(self, spec: LabSpec, progress: ProgressFn | None = None, timeout: float = 180.0) -> LabState:
        spec.validate()
        say = progress or (lambda msg: None)
        self._reap_children()
        existing = self.state()
        if existing is not None and any(self._running(pid) for pid in existing.pids.values()):
            raise LabError(
                f"a lab is already running in {self.dir} (pids {sorted(existing.pids.values())}); "
                "stop it with `devheal lab down` first"
            )
        say("checking control-plane binaries")
        toolchain.ensure_binaries(lambda step, done, total: say(f"building {step} {done}/{total}" if total else step))
        node_images: list[images.ImageArchive] = []
        if spec.real_nodes:
            realnode.check_machine()
            say("checking real-node binaries")
            toolchain.ensure_node_binaries(
                lambda step, done, total: say(f"building {step} {done}/{total}" if total else step)
            )
            node_images = [images.pause_image(), images.busybox_image()]
        if spec.kueue:
            say("checking Kueue's binary")
            toolchain.ensure_kueue(lambda step, done, total: say(f"building {step} {done}/{total}" if total else step))
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        # Every `up` is a fresh cluster: no objects or device faults from an earlier run.
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        self.devices_path.unlink(missing_ok=True)
        self.pki.ensure()
        ports = {
            name: free_port()
            for name in (
                "etcd",
                "etcd-peer",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok",
                "nodesim",
            )
        }
        if spec.kueue:
            ports.update({name: free_port() for name in kueue.PORTS})
        state = LabState(spec=spec, ports=ports, started_at=time.time())
        if spec.real_nodes:
            state.pod_network = str(realnode.pick_pod_network(self.dir))
            state.host_sysctls = realnode.read_sysctls()
            for node in state.real_nodes(self.dir):
                ports[f"kubelet/{node.name}"] = free_port()
                ports[f"kubelet-server/{node.name}"] = free_port()
                if spec.gpus_per_node:
                    ports[f"deviceplugin/{node.name}"] = free_port()
        self.kubeconfig.write_text(self.pki.kubeconfig(f"https://127.0.0.1:{ports['kube-apiserver']}"))
        self.kubeconfig.chmod(0o600)
        started = time.monotonic()
        deadline = started + timeout
        try:
            self._start(state, "etcd", commands.etcd(self.dir, ports))
            self._wait(state, "etcd", deadline, say)
            self._start(state, "kube-apiserver", commands.apiserver(self.pki, ports))
            self._wait(state, "kube-apiserver", deadline, say)
            self._start(state, "kube-controller-manager", commands.controller_manager(self.kubeconfig, self.pki, ports))
            self._start(state, "kube-scheduler", commands.scheduler(self.dir, self.kubeconfig, ports))
            self._start(state, "kwok", commands.kwok(self.dir, self.kubeconfig, ports))
            self._start(state, "nodesim", self._nodesim_cmd(state))
            for component in ("kube-controller-manager", "kube-scheduler", "kwok", "nodesim"):
                self._wait(state, component, deadline, say)
            self._wait_nodes_ready(state, deadline, say)
            for node in state.real_nodes(self.dir):
                self._start_real_node(state, node, node_images, deadline, say)
            self._wait_real_nodes_ready(state, deadline, say)
            if spec.kueue:
                self._start_kueue(state, deadline, say)
            # A component that exited once its health check passed (another process answering on its port).
            for component, proc in self._children.items():
                if proc.poll() is not None:
                    raise self._failure(component, f"exited with code {proc.returncode} during start-up")
        except BaseException:
            self._teardown_real_nodes(state)
            self._stop(state.pids)
            self.state_path.unlink(missing_ok=True)
            raise
        state.ready_seconds = time.monotonic() - started
        self.state_path.write_text(state.to_json())
        dra = f" ({spec.dra_nodes} through DRA)" if spec.dra_nodes else ""
        real = f", {spec.real_nodes} real" if spec.real_nodes else ""
        with_kueue = f", Kueue {versions.KUEUE}" if spec.kueue else ""
        say(
            f"lab ready in {state.ready_seconds:.1f}s: "
            f"{spec.nodes} nodes x {spec.gpus_per_node} GPUs{dra}{real}{with_kueue}"
        )
        return state

    def _kubectl(self, component: str, *args: str) -> None:
        """Run the lab's kubectl against the lab, appending to ``component``'s log; fail ``up`` with its tail."""
        cmd = [str(toolchain.CONTROL_PLANE.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        with self.log_path(component).open("ab") as handle:
            handle.write(f"\n==== {' '.join(cmd)}\n".encode())
            handle.flush()
            rc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, check=False).returncode
        if rc != 0:
            raise self._failure(component, f"could not run `kubectl {' '.join(args[:2])}` (exit {rc})")

    def _start_kueue(self, state: LabState, deadline: float, say: ProgressFn) -> None:
        say("installing Kueue's CRDs")
        try:
            config = kueue.prepare(self.dir, self.pki, state.ports)
        except kueue.KueueSetupError as exc:
            raise LabError(str(exc)) from exc
        crds = str(kueue.crd_dir())
        self._kubectl("kueue", "apply", "--server-side", "--force-conflicts", "-f", crds)
        wait = max(1, int(deadline - time.monotonic()))
        self._kubectl("kueue", "wait", "--for=condition=Established", f"--timeout={wait}s", "-f", crds)
        self._kubectl("kueue", "apply", "--server-side", "-f", str(config.parent / "namespace.yaml"))
        self._start(state, "kueue", kueue.command(self.dir, self.kubeconfig))
        self._wait(state, "kueue", deadline, say)
        self._kubectl(
            "kueue", "apply", "--server-side", "--force-conflicts", "-f", str(config.parent / "webhooks.yaml")
        )

    def _start(self, state: LabState, component: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = self.log_path(component)
        log.parent.mkdir(parents=True, exist_ok=True)
        handle = log.open("ab")
        handle.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        handle.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.dir,
            env=env,
        )
        handle.close()
        self._children[component] = proc
        state.pids[component] = proc.pid
        # Written after every start, so `down` finds a half-started lab too.
        self.state_path.write_text(state.to_json())

    def _nodesim_cmd(self, state: LabState) -> list[str]:
        spec = state.spec
        cmd = [
            sys.executable,
            "-m",
            "devheal.lab.nodesim",
            f"--kubeconfig={self.kubeconfig}",
            f"--nodes={spec.simulated_nodes}",
            f"--gpus-per-node={spec.gpus_per_node}",
            f"--gpu-model={spec.gpu_model}",
            f"--state-file={self.devices_path}",
            f"--http-port={state.ports['nodesim']}",
            f"--dra-nodes={spec.dra_nodes}",
        ]
        if spec.pod_resources_sockets:
            cmd.append(f"--socket-dir={self.socket_dir}")
        return cmd

    def _start_real_node(
        self,
        state: LabState,
        node: RealNode,
        node_images: list[images.ImageArchive],
        deadline: float,
        say: ProgressFn,
    ) -> None:
        """containerd (its images imported), then kubelet with the node's own client identity."""
        say(f"starting real node {node.name}")
        self.pki.ensure_node(node.name)
        kubeconfig = self.pki.kubeconfig(
            f"https://127.0.0.1:{state.ports['kube-apiserver']}",
            user=f"system:node:{node.name}",
            cert=self.pki.node_cert(node.name),
            key=self.pki.node_key(node.name),
        )
        realnode.prepare(
            node,
            self.pki.ca_cert,
            kubeconfig,
            port=state.ports[f"kubelet-server/{node.name}"],
            healthz_port=state.ports[f"kubelet/{node.name}"],
            apiserver_port=state.ports["kube-apiserver"],
        )
        containerd = node.containerd_component()
        self._start(state, containerd, realnode.containerd_command(node), env=realnode.node_environment())
        self._wait(state, containerd, deadline, say)
        state.mount_namespaces[node.name] = realnode.mount_namespace(state.pids[containerd])
        self.state_path.write_text(state.to_json())
        for image in node_images:
            say(f"{node.name}: importing {image.name}")
            images.import_image(image, toolchain.NODE.binary("ctr"), node.containerd_socket)
        kubelet = node.kubelet_component()
        self._start(state, kubelet, realnode.kubelet_command(node, state.pids[containerd]))
        self._wait(state, kubelet, deadline, say)
        if state.spec.gpus_per_node:
            plugin = f"deviceplugin/{node.name}"
            self._start(state, plugin, self._gpu_plugin_cmd(state, node))
            self._wait(state, plugin, deadline, say)

    def _gpu_plugin_cmd(self, state: LabState, node: RealNode) -> list[str]:
        return [
            sys.executable,
            "-m",
            "devheal.lab.gpuplugin",
            f"--node={node.name}",
            f"--gpus={state.spec.gpus_per_node}",
            f"--gpu-model={state.spec.gpu_model}",
            f"--plugin-dir={node.device_plugin_dir}",
            f"--http-port={state.ports[f'deviceplugin/{node.name}']}",
            f"--state-file={node.dir / 'gpus.json'}",
        ]

    def import_image(self, image: images.ImageArchive) -> list[str]:
        """Import ``image`` into every real node's containerd (pods then run it with ``imagePullPolicy: Never``);
        return the nodes it went to. An image of the same name is replaced."""
        state = self.state()
        if state is None:
            raise LabError(f"no lab is running in {self.dir} (start one with `devheal lab up`)")
        nodes = state.real_nodes(self.dir)
        if not nodes:
            raise LabError(f"the lab in {self.dir} has no real nodes to import {image.name} into (--real-nodes K)")
        for node in nodes:
            pid = state.pids.get(node.containerd_component())
            if pid is None or not self._running(pid):
                raise LabError(f"{node.name}: containerd is not running, so {image.name} cannot be imported")
            images.import_image(image, toolchain.NODE.binary("ctr"), node.containerd_socket)
        return [node.name for node in nodes]

    def _real_node(self, node: str) -> tuple[LabState, RealNode]:
        state = self.state()
        if state is None:
            raise LabError(f"no lab is running in {self.dir} (start one with `devheal lab up`)")
        for real in state.real_nodes(self.dir):
            if real.name == node:
                return state, real
        raise LabError(f"{node} is not a real node of this lab (real: {[n.name for n in state.real_nodes(self.dir)]})")

    def is_real_node(self, node: str) -> bool:
        state = self.state()
        return state is not None and any(n.name == node for n in state.real_nodes(self.dir))

    def stop_device_plugin(self, node: str) -> None:
        """Stop a real node's device plugin process, as a crash or a rollout does (kubelet sees its socket go)."""
        state, _ = self._real_node(node)
        component = f"deviceplugin/{node}"
        pid = state.pids.get(component)
        if pid is not None and self._running(pid):
            leftover = self._stop({component: pid})
            if leftover:
                raise LabError(f"could not stop {', '.join(leftover)}")

    def stop_kubelet(self, node: str) -> None:
        """Stop a real node's kubelet (its containers keep running, as when kubelet dies on a machine)."""
        state, real = self._real_node(node)
        component = real.kubelet_component()
        pid = state.pids.get(component)
        if pid is not None and self._running(pid):
            leftover = self._stop({component: pid})
            if leftover:
                raise LabError(f"could not stop {', '.join(leftover)}")

    def start_kubelet(self, node: str, timeout: float = 60.0) -> None:
        """Start a real node's kubelet again (unless it runs), in its containerd's mount namespace."""
        state, real = self._real_node(node)
        kubelet, containerd = real.kubelet_component(), real.containerd_component()
        pid = state.pids.get(kubelet)
        if pid is not None and self._running(pid):
            return
        containerd_pid = state.pids.get(containerd)
        if containerd_pid is None or not self._running(containerd_pid):
            raise LabError(f"{node}: containerd is not running, so kubelet cannot start again; restart the lab")
        self._start(state, kubelet, realnode.kubelet_command(real, containerd_pid))
        self._wait(state, kubelet, time.monotonic() + timeout, lambda msg: None)

    def start_device_plugin(self, node: str, timeout: float = 30.0) -> None:
        """Start a real node's device plugin process again (unless it runs): it registers with kubelet anew."""
        state, real = self._real_node(node)
        component = f"deviceplugin/{node}"
        pid = state.pids.get(component)
        if component not in state.ports:
            raise LabError(f"{node} has no device plugin (the lab was started with --gpus-per-node 0)")
        if pid is not None and self._running(pid):
            return
        self._start(state, component, self._gpu_plugin_cmd(state, real))
        self._wait(state, component, time.monotonic() + timeout, lambda msg: None)

    def _wait_real_nodes_ready(self, state: LabState, deadline: float, say: ProgressFn) -> None:
        nodes = state.real_nodes(self.dir)
        ready: set[str] = set()
        while nodes and time.monotonic() < deadline:
            for node in nodes:
                for component in (node.containerd_component(), node.kubelet_component()):
                    proc = self._children.get(component)
                    if proc is not None and proc.poll() is not None:
                        raise self._failure(component, f"exited with code {proc.returncode}")
            try:
                items = self._get_json(state, f"/api/v1/nodes?labelSelector={realnode.REAL_NODE_LABEL}%3Dtrue")
                ready = {
                    n["metadata"]["name"]
                    for n in items["items"]
                    if _node_ready(n) and _gpus(n) == state.spec.gpus_per_node
                }
            except (urllib.error.URLError, OSError, ValueError, KeyError):
                ready = set()
            say(f"real nodes ready: {len(ready)}/{len(nodes)}")
            if len(ready) >= len(nodes):
                return
            time.sleep(0.5)
        if nodes:
            late = [n.name for n in nodes if n.name not in ready]
            raise self._failure(nodes[0].kubelet_component(), f"left real node(s) {', '.join(late)} NotReady")

    def _teardown_real_nodes(self, state: LabState) -> list[str]:
        # The device plugins first: they talk to kubelet.
        leftover = self._stop({c: pid for c, pid in state.pids.items() if c.startswith("deviceplugin/")})
        for node in state.real_nodes(self.dir):
            kubelet = state.pids.get(node.kubelet_component())
            containerd = state.pids.get(node.containerd_component())
            leftover += realnode.teardown(
                node,
                state.mount_namespaces.get(node.name, ""),
                kubelet if kubelet and self._running(kubelet) else None,
                containerd if containerd and self._running(containerd) else None,
            )
        if not leftover:
            leftover += realnode.restore_sysctls(state.host_sysctls)
        self._reap_children()
        return leftover

    # ---- health ------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _health_url(self, state: LabState, component: str) -> tuple[str, ssl.SSLContext | None]:
        port = state.ports.get(component, 0)
        if component == "etcd":
            return f"http://127.0.0.1:{port}/health", None
        if component == "kube-apiserver":
            return f"https://127.0.0.1:{port}/readyz", self.ssl_context()
        if component in ("kube-controller-manager", "kube-scheduler"):
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE
            return f"https://127.0.0.1:{port}/healthz", insecure
        if component == "kwok":
            return f"http://127.0.0.1:{port}/healthz", None
        if component == "kueue":
            # Ready once its webhook server serves: the lab registers the webhooks only then.
            return f"http://127.0.0.1:{port}/readyz", None
        return f"http://127.0.0.1:{port}/healthz", None

    def healthy(self, state: LabState, component: str) -> tuple[bool, str]:
        if component.startswith("containerd/"):
            node = next((n for n in state.real_nodes(self.dir) if n.containerd_component() == component), None)
            if node is not None and realnode.containerd_answers(node):
                return True, "socket answers"
            return False, "socket does not answer"
        url, ctx = self._health_url(state, component)
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                return resp.status == 200, f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            return False, f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return False, str(getattr(exc, "reason", exc))

    def _log_tail(self, component: str, lines: int = 20) -> str:
        try:
            text = self.log_path(component).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    def _failure(self, component: str, what: str) -> LabError:
        tail = self._log_tail(component)
        hint = ""
        if "address already in use" in tail:
            hint = " (a port it needs is taken by another process)"
        return LabError(f"{component} {what}{hint}; last lines of {self.log_path(component)}:\n{tail}")

    def _wait(self, state: LabState, component: str, deadline: float, say: ProgressFn) -> None:
        say(f"waiting for {component}")
        proc = self._children.get(component)
        last = ""
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise self._failure(component, f"exited with code {proc.returncode} during start-up")
            ok, last = self.healthy(state, component)
            if ok:
                return
            time.sleep(0.1)
        raise self._failure(component, f"did not become healthy in time (last answer: {last})")

    def _get_json(self, state: LabState, path: str) -> Any:
        url = f"https://127.0.0.1:{state.ports['kube-apiserver']}{path}"
        with urllib.request.urlopen(url, timeout=10, context=self.ssl_context()) as resp:
            return json.loads(resp.read())

    def _wait_nodes_ready(self, state: LabState, deadline: float, say: ProgressFn) -> None:
        want = state.spec.simulated_nodes
        ready = 0
        while time.monotonic() < deadline:
            for component in ("kwok", "nodesim"):
                proc = self._children.get(component)
                if proc is not None and proc.poll() is not None:
                    raise self._failure(component, f"exited with code {proc.returncode}")
            try:
                nodes = self._get_json(state, "/api/v1/nodes?labelSelector=type%3Dkwok")["items"]
            except (urllib.error.URLError, OSError, ValueError):
                nodes = []
            ready = sum(1 for n in nodes if _node_ready(n) and _gpus(n) == _expected_gpus(n, state.spec))
            say(f"simulated nodes ready: {ready}/{want}")
            if ready >= want:
                return
            time.sleep(0.5)
        raise LabError(
            f"only {ready} of {want} nodes became Ready with {state.spec.gpus_per_node} GPUs in time; "
            f"see {self.log_path('kwok')} and {self.log_path('nodesim')}"
        )

    def status(self) -> dict[str, Any]:
        state = self.state()
        if state is None:
            return {"running": False, "dir": str(self.dir)}
        components = {}
        real = state.real_nodes(self.dir)
        node_components = [c for c in state.pids if c.startswith(("containerd/", "kubelet/", "deviceplugin/"))]
        extra = ["kueue"] if "kueue" in state.pids else []
        for component in (*COMPONENTS, *extra, *node_components):
            pid = state.pids.get(component)
            alive = pid is not None and self._running(pid)
            ok, detail = self.healthy(state, component) if alive else (False, "not running")
            components[component] = {
                "pid": pid,
                "alive": alive,
                "healthy": ok,
                "detail": detail,
                "port": state.ports.get(component),
            }
        return {
            "running": any(c["alive"] for c in components.values()),
            "dir": str(self.dir),
            "kubeconfig": str(self.kubeconfig),
            "spec": asdict(state.spec),
            "components": components,
            "nodes": {
                "simulated": [node_name(i) for i in range(state.spec.simulated_nodes)],
                "real": [
                    {
                        "name": n.name,
                        "address": str(n.gateway),
                        "pod_subnet": str(n.subnet),
                        "containerd_socket": str(n.containerd_socket),
                        "pod_resources_socket": str(n.pod_resources_socket),
                    }
                    for n in real
                ],
            },
            "versions": {
                "kubernetes": versions.KUBERNETES,
                "etcd": versions.ETCD,
                "kwok": versions.KWOK,
                **(
                    {"containerd": versions.CONTAINERD, "runc": versions.RUNC, "cni_plugins": versions.CNI_PLUGINS}
                    if real
                    else {}
                ),
                **({"kueue": versions.KUEUE} if state.spec.kueue else {}),
            },
        }

    def spawn_devheal(
        self,
        command: str,
        *args: str,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        main: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run ``devheal <command> --kubeconfig <this lab> ARGS`` detached, logging to ``log``
        (default ``logs/<command>.log``). The caller owns the process.

        ``main``: a Python script run instead of ``-m devheal`` (tests use one that installs a fault, such as a
        crash, and then runs devheal's command line)."""
        path = log or self.log_path(command)
        entry = [str(main)] if main is not None else ["-m", "devheal"]
        with path.open("ab") as handle:
            return subprocess.Popen(
                [sys.executable, *entry, command, f"--kubeconfig={self.kubeconfig}", *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )

    # ---- stop --------------------------------------------------------------------------------

    def down(self, grace: float = STOP_GRACE) -> list[str]:
        """Stop every process of the lab in dependency order; return the components that were running.

        Idempotent: components already gone are skipped, and without a lab there is nothing to do.
        Works from any process: our own children are reaped, other processes are polled in /proc."""
        state = self.state()
        if state is None:
            self._reap_children()
            return []
        running = [c for c, pid in state.pids.items() if self._running(pid)]
        leftover = self._teardown_real_nodes(state)
        leftover += self._stop(state.pids, grace)
        if state.spec.kueue:
            kueue.release_metrics_cert(self.dir)
        if leftover:
            raise LabError(
                f"could not stop {', '.join(leftover)}: still there {KILL_WAIT:.0f}s after SIGKILL; "
                f"see the logs in {self.dir / 'logs'}"
            )
        self.state_path.unlink(missing_ok=True)
        return running

    def _stop(self, pids: dict[str, int], grace: float = STOP_GRACE) -> list[str]:
        """Stop ``pids`` tier by tier; return 'component (pid N)' for each process that outlived SIGKILL."""
        known = {c for tier in STOP_ORDER for c in tier}
        tiers = [tuple(c for c in pids if c not in known), *STOP_ORDER]
        leftover: list[str] = []
        for tier in tiers:
            # Ours if its command line says so; from then on the pid cannot be recycled before it is gone.
            alive = {c: pids[c] for c in tier if c in pids and self._running(pids[c])}
            for pid in alive.values():
                _signal_group(pid, signal.SIGTERM)
            alive = self._wait_gone(alive, time.monotonic() + grace)
            for pid in alive.values():
                _signal_group(pid, signal.SIGKILL)
            alive = self._wait_gone(alive, time.monotonic() + KILL_WAIT)
            leftover += [f"{c} (pid {pid})" for c, pid in alive.items()]
        self._reap_children()
        return leftover

    def _wait_gone(self, alive: dict[str, int], deadline: float) -> dict[str, int]:
        """Wait until every process in ``alive`` is gone or ``deadline`` passes; return those still there."""
        alive = dict(alive)
        while alive:
            alive = {c: pid for c, pid in alive.items() if not self._gone(c, pid)}
            if not alive or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return alive

    def _gone(self, component: str, pid: int) -> bool:
        proc = self._children.get(component)
        if proc is not None and proc.pid == pid:
            return proc.poll() is not None  # reaps our own child
        # Not self._running: an exiting process's command line reads empty while its threads still exit.
        return not pid_alive(pid)

    def _running(self, pid: int) -> bool:
        """Whether ``pid`` is a live process of this lab; a recycled pid (another command line) is not."""
        if not pid_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        # Every component's command line names a file in the lab directory.
        return f"{self.dir}{os.sep}".encode() in cmdline

    def _reap_children(self) -> None:
        """Forget (and reap) the processes we started that have exited, whoever stopped them."""
        self._children = {c: proc for c, proc in self._children.items() if proc.poll() is None}


def node_name(index: int) -> str:
    """The lab's name of node ``index``, simulated or real (imported late: the simulator's package is heavy)."""
    from devheal.lab.nodesim.nodes import node_name as name

    return name(index)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # Each component leads its own session (start_new_session), so its group is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _node_ready(node: dict[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _expected_gpus(node: dict[str, Any], spec: LabSpec) -> int:
    """A DRA node publishes no ``nvidia.com/gpu`` (its GPUs are in its ResourceSlice)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return 0 if labels.get("devheal.io/gpu-api") == "dra" else spec.gpus_per_node


def _gpus(node: dict[str, Any]) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
    try:
        return int(value)
    except ValueError:
        return 0
