"""``devheal lab ...``: the local lab cluster and its fault injection."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

# rich and the lab's modules (cryptography for its certificates) are imported when a command
# runs: `devheal --help` does not pay for them.


@cache
def _console(stderr: bool) -> Console:
    from rich.console import Console

    return Console(stderr=stderr)


def err() -> Console:
    """Messages and progress (stderr)."""
    return _console(True)


def out() -> Console:
    """Results (stdout)."""
    return _console(False)


app = typer.Typer(
    help="A real local Kubernetes control plane with simulated GPU nodes and fault injection.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
)
inject_app = typer.Typer(
    help="Inject a device or node fault into the running lab.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
)
app.add_typer(inject_app, name="inject")
image_app = typer.Typer(
    help="The devheal image for the real nodes, built here from Debian's packages and the wheel.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=False,
)
app.add_typer(image_app, name="image")

LabDir = Annotated[
    Path | None,
    typer.Option("--dir", help="Lab directory (default: $DEVHEAL_LAB_DIR or ~/.local/state/devheal/lab)."),
]
NodeOpt = Annotated[str, typer.Option("--node", help="Node name, e.g. gpu-node-000.")]
GpuOpt = Annotated[int, typer.Option("--gpu", help="GPU index on the node (0-based).")]


def _fail(exc: Exception) -> typer.Exit:
    err().print(f"[red]error:[/red] {exc}")
    return typer.Exit(1)


@app.command()
def build(
    real_nodes: Annotated[
        bool,
        typer.Option(
            "--real-nodes",
            help="Also build the real nodes' binaries: kubelet, kube-proxy, containerd, runc, CNI plugins.",
        ),
    ] = False,
    kueue: Annotated[
        bool, typer.Option("--kueue", help="Also build Kueue's controller manager (for `lab up --kueue`).")
    ] = False,
) -> None:
    """Build (or find cached) the pinned control-plane binaries: etcd, kube-*, kubectl, kwok."""
    from devheal.lab import toolchain

    with err().status("checking binaries") as status:
        try:

            def show(step: str, done: int, total: int) -> None:
                status.update(f"{step} {done}/{total}" if total else step)

            path = toolchain.ensure_binaries(show)
            if real_nodes:
                out().print(str(path))
                path = toolchain.ensure_node_binaries(show)
            if kueue:
                out().print(str(path))
                path = toolchain.ensure_kueue(show)
        except toolchain.ToolchainError as exc:
            raise _fail(exc) from exc
    out().print(str(path))


@app.command()
def up(
    nodes: Annotated[int, typer.Option(help="Number of simulated GPU nodes.")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    gpu_model: Annotated[str, typer.Option(help="GPU model name reported by the nodes.")] = "NVIDIA H100 80GB HBM3",
    dra_nodes: Annotated[
        int,
        typer.Option(help="The last N simulated nodes expose their GPUs through a simulated DRA driver."),
    ] = 0,
    real_nodes: Annotated[
        int,
        typer.Option(
            help="The last N of the nodes are real: kubelet, containerd and runc, pods in their own network "
            "namespaces (root; built on first use, minutes)."
        ),
    ] = 0,
    kueue: Annotated[
        bool,
        typer.Option(
            "--kueue",
            help="Also run Kueue's controller manager against the lab, its webhooks on loopback "
            "(built on first use, minutes).",
        ),
    ] = False,
    directory: LabDir = None,
) -> None:
    """Start etcd, kube-apiserver, controller manager, scheduler, kwok and the node simulator, detached
    (and, with --real-nodes, a containerd and a kubelet per real node; with --kueue, Kueue)."""
    from devheal.lab import images, realnode, toolchain, versions
    from devheal.lab.cluster import Lab, LabError, LabSpec

    lab = Lab(directory)
    spec = LabSpec(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu_model=gpu_model,
        dra_nodes=dra_nodes,
        real_nodes=real_nodes,
        kueue=kueue,
    )
    with err().status("starting lab") as status:
        try:
            state = lab.up(spec, progress=lambda msg: status.update(msg))
        except (LabError, toolchain.ToolchainError, images.ImageError, realnode.RealNodeError) as exc:
            raise _fail(exc) from exc
    err().print(
        f"[green]lab ready[/green] in {state.ready_seconds:.1f}s: {nodes} nodes x {gpus_per_node} GPUs "
        f"({versions.KUBERNETES=}, {versions.ETCD=}, {versions.KWOK=}".replace("versions.", "")
        + (f", KUEUE='{versions.KUEUE}')" if kueue else ")")
    )
    err().print(f"  export KUBECONFIG={lab.kubeconfig}")
    err().print(f"  {toolchain.CONTROL_PLANE.binary('kubectl')} get nodes")


@app.command()
def down(directory: LabDir = None) -> None:
    """Stop every process of the lab (its directory, with logs, stays)."""
    from devheal.lab.cluster import Lab, LabError

    lab = Lab(directory)
    try:
        stopped = lab.down()
    except LabError as exc:
        raise _fail(exc) from exc
    err().print(f"stopped: {', '.join(stopped)}" if stopped else "no lab was running")


@app.command()
def status(
    directory: LabDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show each component's process and health."""
    from rich.table import Table

    from devheal.lab.cluster import Lab, LabError

    lab = Lab(directory)
    try:
        info = lab.status()
    except LabError as exc:
        raise _fail(exc) from exc
    if as_json:
        out().print_json(json.dumps(info))
        return
    if not info.get("components"):
        out().print(f"no lab in {info['dir']}")
        raise typer.Exit(1)
    table = Table("component", "pid", "port", "health")
    for name, comp in info["components"].items():
        health = "[green]ok[/green]" if comp["healthy"] else f"[red]{comp['detail']}[/red]"
        table.add_row(name, str(comp["pid"] or "-"), str(comp["port"] or "-"), health)
    out().print(table)
    simulated, real = info["nodes"]["simulated"], info["nodes"]["real"]
    if simulated:
        out().print(f"simulated nodes (kwok): {simulated[0]}..{simulated[-1]} ({len(simulated)})")
    for node in real:
        out().print(f"real node: {node['name']} (address {node['address']}, pods {node['pod_subnet']})")
    out().print(f"kubeconfig: {info['kubeconfig']}")
    if not all(c["healthy"] for c in info["components"].values()):
        raise typer.Exit(1)


@app.command()
def kubeconfig(directory: LabDir = None) -> None:
    """Print the path of the lab's admin kubeconfig."""
    from devheal.lab.cluster import Lab, LabError

    lab = Lab(directory)
    if lab.state() is None:
        raise _fail(LabError(f"no lab in {lab.dir} (start one with `devheal lab up`)"))
    out().print(str(lab.kubeconfig), soft_wrap=True)


@app.command()
def devices(
    node: Annotated[str | None, typer.Option("--node", help="Only this node.")] = None,
    directory: LabDir = None,
) -> None:
    """Print the simulated device state (health, XIDs, holders) as JSON."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    faults = Faults(Lab(directory))
    try:
        data = faults.devices(node) if node else faults.all_devices()
    except LabError as exc:
        raise _fail(exc) from exc
    out().print_json(json.dumps(data))


def _show(result: dict[str, Any], gpu: int | None = None) -> None:
    line = f"{result['node']}: allocatable {result['allocatable']}/{result['capacity']}"
    if gpu is not None:
        dev = result["devices"][gpu]
        holder = dev.get("holder")
        held = f", held by {holder['namespace']}/{holder['pod']}" if holder else ""
        line += f"; gpu {gpu} ({dev['uuid']}) {dev['health']}" + (f": {dev['reason']}" if dev["reason"] else "") + held
    out().print(line)


@inject_app.command("xid")
def inject_xid(
    node: NodeOpt,
    gpu: GpuOpt,
    code: Annotated[int, typer.Option("--code", help="NVIDIA XID, e.g. 79 (fell off the bus), 48 (DBE ECC).")],
    directory: LabDir = None,
) -> None:
    """An XID error on one GPU. Hardware XIDs make it Unhealthy; application XIDs (13, 31, 43, 45, 68) are counted."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        _show(Faults(Lab(directory)).xid(node, gpu, code), gpu)
    except LabError as exc:
        raise _fail(exc) from exc


@inject_app.command("degrade")
def inject_degrade(
    node: NodeOpt,
    gpu: GpuOpt,
    slowdown: Annotated[float, typer.Option("--slowdown", help="How much slower, e.g. 1.3 = 30% slower.")] = 1.3,
    directory: LabDir = None,
) -> None:
    """The GPU stays allocatable but is throttled (reported as Degraded in the device state)."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        _show(Faults(Lab(directory)).degrade(node, gpu, slowdown), gpu)
    except LabError as exc:
        raise _fail(exc) from exc


@inject_app.command("recover")
def inject_recover(node: NodeOpt, gpu: GpuOpt, directory: LabDir = None) -> None:
    """The GPU is healthy again (health, speed)."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        _show(Faults(Lab(directory)).recover(node, gpu), gpu)
    except LabError as exc:
        raise _fail(exc) from exc


@inject_app.command("recovery-action")
def inject_recovery_action(
    node: NodeOpt,
    gpu: GpuOpt,
    action: Annotated[
        str,
        typer.Option(
            "--action",
            help="NVML's recovery action: None, GPUReset, NodeReboot, DrainP2P, DrainAndReset, RecoverIMEXDomain, "
            "BusReset, SystemReboot (or NVML's name or number); 'unset': the driver does not report it.",
        ),
    ],
    directory: LabDir = None,
) -> None:
    """The GPU's driver reports this recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), as the agent reads it."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        result = Faults(Lab(directory)).recovery_action(node, gpu, None if action == "unset" else action)
    except LabError as exc:
        raise _fail(exc) from exc
    _show(result, gpu)
    reported = result["devices"][gpu].get("recoveryAction")
    out().print(f"recovery action: {'not reported' if reported is None else reported}")


@inject_app.command("plugin-restart")
def inject_plugin_restart(
    node: NodeOpt,
    seconds: Annotated[float, typer.Option("--seconds", help="How long the device plugin is away.")] = 5.0,
    directory: LabDir = None,
) -> None:
    """The device plugin restarts: the node's GPU capacity and allocatable drop to 0, then return.

    On a real node the plugin process is stopped and started again after --seconds (the command waits)."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        _show(Faults(Lab(directory)).plugin_restart(node, seconds))
    except LabError as exc:
        raise _fail(exc) from exc


@inject_app.command("node-notready")
def inject_node_notready(node: NodeOpt, directory: LabDir = None) -> None:
    """The node's kubelet stops reporting Ready (undo with `inject node-ready`); on a real node kubelet stops."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        Faults(Lab(directory)).node_not_ready(node)
    except LabError as exc:
        raise _fail(exc) from exc
    out().print(f"{node}: NotReady injected")


@inject_app.command("node-ready")
def inject_node_ready(node: NodeOpt, directory: LabDir = None) -> None:
    """Undo `node-notready`: the node reports Ready again."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.faults import Faults

    try:
        Faults(Lab(directory)).node_ready(node)
    except LabError as exc:
        raise _fail(exc) from exc
    out().print(f"{node}: Ready again")


def _devheal_image() -> Any:
    """Build (or find) the devheal image with progress on stderr; its archive."""
    from devheal.lab import devheal_image

    with err().status("devheal image") as status:
        return devheal_image.devheal_image(lambda message: status.update(message))


@image_app.command("build")
def image_build() -> None:
    """Build (or find cached) the devheal image archive for the current sources: Debian's Python 3.11, the
    locked runtime dependencies and the wheel, non-root, for a read-only root file system. Prints the
    image's name and the archive's path (a minute or two the first time, under a second when nothing changed)."""
    from devheal.lab.images import ImageError

    try:
        image = _devheal_image()
    except ImageError as exc:
        raise _fail(exc) from exc
    err().print(f"[green]built[/green] {image.path.stat().st_size / 2**20:.0f} MiB")
    out().print(image.name)
    out().print(str(image.path))


@image_app.command("import")
def image_import(directory: LabDir = None) -> None:
    """Build (or find) the devheal image and import it into every real node of the running lab; prints its name."""
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.images import ImageError

    try:
        image = _devheal_image()
        nodes = Lab(directory).import_image(image)
    except (ImageError, LabError) as exc:
        raise _fail(exc) from exc
    err().print(f"imported into {', '.join(nodes)}")
    out().print(image.name)


ReleaseOpt = Annotated[str, typer.Option("--release", help="Helm release name.")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Namespace of the release (created if missing).")]


@app.command()
def install(
    directory: LabDir = None,
    release: ReleaseOpt = "devheal",
    namespace: NamespaceOpt = "devheal-system",
    set_values: Annotated[
        list[str] | None,
        typer.Option("--set", help="A chart value, as helm's --set takes it (repeatable), over the lab's values."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the controller and the agents.")] = 300.0,
) -> None:
    """Install devheal into the running lab with its Helm chart (deploy/helm/devheal), as pods on the real
    nodes: builds (or finds) the devheal image, imports it into the real nodes, runs `helm upgrade --install`
    with the lab's values (docs/lab.md) and waits until the controller is Available and every agent Ready."""
    from devheal.lab import install as lab_install
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.images import ImageError
    from devheal.lab.toolchain import ToolchainError

    try:
        with err().status("devheal install") as status:
            image = lab_install.install(
                Lab(directory),
                release=release,
                namespace=namespace,
                sets=set_values or (),
                progress=lambda message: status.update(message),
                timeout=timeout,
            )
    except (ImageError, LabError, ToolchainError) as exc:
        raise _fail(exc) from exc
    out().print(f"{release} installed in namespace {namespace} ({image})")


@app.command()
def uninstall(
    directory: LabDir = None, release: ReleaseOpt = "devheal", namespace: NamespaceOpt = "devheal-system"
) -> None:
    """Remove what `devheal lab install` installed (`helm uninstall --wait`; the CRDs stay, as with helm)."""
    from devheal.lab import install as lab_install
    from devheal.lab.cluster import Lab, LabError
    from devheal.lab.toolchain import ToolchainError

    try:
        lab_install.uninstall(Lab(directory), release=release, namespace=namespace)
    except (LabError, ToolchainError) as exc:
        raise _fail(exc) from exc
    out().print(f"{release} uninstalled from namespace {namespace}")
