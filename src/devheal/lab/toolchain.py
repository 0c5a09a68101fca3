"""Build the lab's binaries from pinned Go modules, once, into a cache.

Kubernetes cannot be ``go install``-ed: its go.mod points the staging modules
(k8s.io/api, k8s.io/client-go, ...) at local directories. So, per component, we
write a tiny wrapper module that requires the pinned release, replaces every
staging module with its published ``v0.x.y`` twin, and ``go build``-s the
commands we need. Binaries land in a per-version directory under the user's
cache; a build goes to a temporary directory first and is moved into place, so
an interrupted build never leaves a half-written binary behind.

Three sets, each in its own cache directory: the control plane (``ensure_binaries``,
every lab), the real nodes (``ensure_node_binaries``: kubelet, kube-proxy,
containerd, runc, the CNI plugins), built only when a lab asks for real nodes, and
Kueue (``ensure_kueue``: its controller manager plus a copy of the release's CRDs
and webhook manifests), built only when a lab asks for Kueue.
runc is the one cgo build: it needs a C compiler and libseccomp's headers, and
``node_prerequisites`` names the Debian packages when they are missing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from devheal.lab import versions

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)

NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "bridge",
    "host-local",
    "loopback",
    "portmap",
    "pause",
)
"""What a real node runs: kubelet and kube-proxy, the container runtime, the CNI plugins, and the pod
sandbox process (``pause``, from ``data/pause/main.go``) that devheal.lab.images packs into an image."""

NODE_BUILD_PACKAGES = ("gcc", "pkg-config", "libseccomp-dev")
"""Debian packages runc's cgo build needs (``node_prerequisites`` checks them)."""

ProgressFn = Callable[[str, int, int], None]
"""Called as ``progress(step, done, total)``; total is 0 when unknown."""


class ToolchainError(RuntimeError):
    """The binaries could not be built; the message says which step and shows its log tail."""


def cache_root() -> Path:
    """Where devheal keeps built binaries: $DEVHEAL_CACHE_DIR, else $XDG_CACHE_HOME/devheal."""
    explicit = os.environ.get("DEVHEAL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "devheal"


@dataclass(frozen=True)
class BinaryCache:
    """One set of built binaries in a cache directory of its own, named by the versions they are built from."""

    key: Callable[[], str]
    names: tuple[str, ...]

    @property
    def root(self) -> Path:
        return cache_root() / "lab" / self.key()

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def binary(self, name: str) -> Path:
        return self.bin_dir / name

    def missing(self) -> list[str]:
        return [name for name in self.names if not os.access(self.binary(name), os.X_OK)]


CONTROL_PLANE = BinaryCache(versions.cache_key, BINARIES)
"""The binaries every lab runs."""
NODE = BinaryCache(versions.node_cache_key, NODE_BINARIES)
"""The binaries real nodes run, built only when a lab asks for real nodes."""
KUEUE = BinaryCache(versions.kueue_cache_key, ("kueue",))
"""Kueue's controller manager, built only when a lab asks for Kueue."""

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_MANIFESTS = ("config/components/crd/bases", "config/components/webhook/manifests.yaml")
"""What ``ensure_kueue`` copies from the Kueue module into its cache (``manifests/``): the CRDs and the
webhook configurations of the very release the binary is built from."""


@dataclass(frozen=True)
class _Target:
    """One wrapper module and the commands it builds."""

    name: str
    module: str
    version: str
    packages: tuple[str, ...]
    outputs: tuple[str, ...]
    ldflags: str = "-s -w"
    staging_replacements: bool = False
    cgo: bool = False
    tags: tuple[str, ...] = ()


def _kubernetes_ldflags() -> str:
    major, minor, _ = versions.KUBERNETES.split(".")
    stamp = {
        "gitVersion": f"v{versions.KUBERNETES}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.{key}={value}" for key, value in stamp.items()]
    return " ".join(flags)


def _targets() -> tuple[_Target, ...]:
    return (
        _Target(
            name="etcd",
            module="go.etcd.io/etcd/server/v3",
            version=f"v{versions.ETCD}",
            packages=("go.etcd.io/etcd/server/v3",),
            outputs=("etcd",),
        ),
        _Target(
            name="kwok",
            module="sigs.k8s.io/kwok",
            version=f"v{versions.KWOK}",
            packages=("sigs.k8s.io/kwok/cmd/kwok",),
            outputs=("kwok",),
        ),
        _Target(
            name="kubernetes",
            module="k8s.io/kubernetes",
            version=f"v{versions.KUBERNETES}",
            packages=tuple(
                f"k8s.io/kubernetes/cmd/{cmd}"
                for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
            ),
            outputs=("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
            ldflags=_kubernetes_ldflags(),
            staging_replacements=True,
        ),
    )


def _node_targets() -> tuple[_Target, ...]:
    containerd = "github.com/containerd/containerd/v2"
    plugins = "github.com/containernetworking/plugins"
    return (
        _Target(
            name="kubelet",
            module="k8s.io/kubernetes",
            version=f"v{versions.KUBERNETES}",
            packages=("k8s.io/kubernetes/cmd/kubelet", "k8s.io/kubernetes/cmd/kube-proxy"),
            outputs=("kubelet", "kube-proxy"),
            ldflags=_kubernetes_ldflags(),
            staging_replacements=True,
        ),
        _Target(
            name="containerd",
            module=containerd,
            version=f"v{versions.CONTAINERD}",
            packages=tuple(f"{containerd}/cmd/{cmd}" for cmd in ("containerd", "containerd-shim-runc-v2", "ctr")),
            outputs=("containerd", "containerd-shim-runc-v2", "ctr"),
            ldflags=(
                f"-s -w -X {containerd}/version.Version=v{versions.CONTAINERD} "
                f"-X {containerd}/version.Package={containerd}"
            ),
            # No btrfs snapshotter: it needs cgo and btrfs headers, and the lab uses overlayfs.
            tags=("no_btrfs",),
        ),
        _Target(
            name="runc",
            module="github.com/opencontainers/runc",
            version=f"v{versions.RUNC}",
            packages=("github.com/opencontainers/runc",),
            outputs=("runc",),
            ldflags=f"-s -w -X main.version={versions.RUNC} -X main.gitCommit=v{versions.RUNC}",
            cgo=True,
            tags=("seccomp", "urfave_cli_no_docs"),
        ),
        _Target(
            name="cni-plugins",
            module=plugins,
            version=f"v{versions.CNI_PLUGINS}",
            packages=tuple(
                f"{plugins}/plugins/{path}"
                for path in ("main/bridge", "ipam/host-local", "main/loopback", "meta/portmap")
            ),
            outputs=("bridge", "host-local", "loopback", "portmap"),
        ),
    )


def node_prerequisites() -> None:
    """Raise ToolchainError naming the apt-get command when runc's cgo build cannot work here."""
    missing = []
    if shutil.which("gcc") is None:
        missing.append("gcc")
    if shutil.which("pkg-config") is None:
        missing.append("pkg-config")
    elif subprocess.run(["pkg-config", "--exists", "libseccomp"], check=False).returncode != 0:
        missing.append("libseccomp-dev")
    if missing:
        raise ToolchainError(
            f"building runc {versions.RUNC} (cgo, seccomp) for the lab's real nodes needs "
            f"{', '.join(missing)}: run `apt-get install -y {' '.join(missing)}` (scripts/bootstrap does, as root)"
        )


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ToolchainError(
            "the Go toolchain is needed to build the lab binaries: 'go' is not on PATH "
            f"(Go >= {versions.GO_MINIMUM[0]}.{versions.GO_MINIMUM[1]})"
        )
    return go


def _go_env(work: Path, cgo: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CGO_ENABLED": "1" if cgo else "0",
            "GOFLAGS": "-mod=mod -buildvcs=false -trimpath",
            "GOWORK": "off",
            "GO111MODULE": "on",
        }
    )
    env.setdefault("GOTOOLCHAIN", "auto")
    env["TMPDIR"] = str(work)
    return env


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, step: str) -> str:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=out, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"{step} failed (exit {proc.returncode}); log {log}:\n{_tail(log)}")
    return proc.stdout


def _staging_modules(go: str, src: Path, env: dict[str, str], log: Path, target: _Target) -> list[str]:
    """Read the staging module list from k8s.io/kubernetes's own go.mod."""
    out = _run(
        [go, "mod", "download", "-json", f"{target.module}@{target.version}"],
        src,
        env,
        log,
        f"downloading {target.module}@{target.version}",
    )
    info = json.loads(out)
    gomod = Path(info["GoMod"]).read_text()
    return re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", gomod, flags=re.MULTILINE)


def _write_wrapper(go: str, src: Path, env: dict[str, str], log: Path, target: _Target) -> None:
    src.mkdir(parents=True, exist_ok=True)
    lines = [
        f"module devheal.local/labbuild/{target.name}",
        "",
        f"go {versions.GO_MINIMUM[0]}.{versions.GO_MINIMUM[1]}",
        "",
        f"require {target.module} {target.version}",
    ]
    if target.staging_replacements:
        staging_version = "v0." + versions.KUBERNETES.split(".", 1)[1]
        modules = _staging_modules(go, src, env, log, target)
        if not modules:
            raise ToolchainError(f"found no staging modules in {target.module}@{target.version}'s go.mod")
        lines += ["", "replace ("]
        lines += [f"\t{mod} => {mod} {staging_version}" for mod in modules]
        lines += [")"]
    (src / "go.mod").write_text("\n".join(lines) + "\n")
    imports = "\n".join(f'\t_ "{pkg}"' for pkg in target.packages)
    (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")


def _build_target(go: str, target: _Target, root: Path, work: Path, progress: ProgressFn) -> None:
    src = root / "src" / target.name
    log = root / "logs" / f"build-{target.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    env = _go_env(work, target.cgo)
    progress(f"{target.name}: resolving modules", 0, 0)
    _write_wrapper(go, src, env, log, target)
    _run([go, "mod", "download"], src, env, log, f"{target.name}: module download")
    env_tags = dict(env, GOFLAGS=env["GOFLAGS"] + " -tags=tools")
    _run([go, "mod", "tidy"], src, env_tags, log, f"{target.name}: go mod tidy")
    tags = ["-tags", ",".join(target.tags)] if target.tags else []
    deps = _run(
        [go, "list", *tags, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *target.packages],
        src,
        env,
        log,
        f"{target.name}: listing packages",
    )
    total = sum(1 for line in deps.splitlines() if line.strip())
    stage = work / f"out-{target.name}"
    stage.mkdir(parents=True, exist_ok=True)
    cmd = [go, "build", "-v", *tags, "-ldflags", target.ldflags, "-o", str(stage) + os.sep, *target.packages]
    done = 0
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:
            out.write(line)
            if re.fullmatch(r"[\w.\-/~]+", line.strip()) and done < total:
                done += 1
                progress(f"{target.name}: compiling", min(done, total), total)
        rc = proc.wait()
    if rc != 0:
        raise ToolchainError(f"{target.name}: go build failed (exit {rc}); log {log}:\n{_tail(log)}")
    built = {p.name: p for p in stage.iterdir()}
    # go names a binary after its import path minus the major-version suffix.
    renames = {"server": "etcd"}
    bins = root / "bin"
    bins.mkdir(parents=True, exist_ok=True)
    for name, path in built.items():
        final = renames.get(name, name)
        if final in target.outputs:
            path.replace(bins / final)
    absent = [name for name in target.outputs if not (bins / name).exists()]
    if absent:
        raise ToolchainError(f"{target.name}: build produced no {', '.join(absent)}; log {log}")
    progress(f"{target.name}: done", total, total)


@contextmanager
def build_lock(root: Path) -> Iterator[None]:
    """Hold ``root``'s build lock: one build at a time, across processes (parallel test sessions)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ensure(root: Path, targets: tuple[_Target, ...], progress: ProgressFn | None) -> Path:
    """Build every target with a missing output under ``root``; return ``root/bin``."""
    report: ProgressFn = progress or (lambda step, done, total: None)
    bins = root / "bin"

    def missing() -> list[str]:
        return [name for t in targets for name in t.outputs if not os.access(bins / name, os.X_OK)]

    if not missing():
        return bins
    go = _go()
    with build_lock(root):
        for target in targets:
            if all(os.access(bins / name, os.X_OK) for name in target.outputs):
                continue
            work = root / "tmp"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            try:
                _build_target(go, target, root, work, report)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    still = missing()
    if still:
        raise ToolchainError(f"binaries still missing after build: {', '.join(still)}")
    return bins


def ensure_binaries(progress: ProgressFn | None = None) -> Path:
    """Build whatever control-plane binary is missing; return the bin directory. Seconds when the cache is warm."""
    return _ensure(CONTROL_PLANE.root, _targets(), progress)


def _build_pause(go: str, root: Path, progress: ProgressFn) -> None:
    """The pod sandbox process: one static Go file of ours, no dependencies."""
    src = root / "src" / "pause"
    src.mkdir(parents=True, exist_ok=True)
    log = root / "logs" / "build-pause.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    (src / "go.mod").write_text(
        f"module devheal.local/labbuild/pause\n\ngo {versions.GO_MINIMUM[0]}.{versions.GO_MINIMUM[1]}\n"
    )
    (src / "main.go").write_text(resources.files("devheal.lab").joinpath("data/pause/main.go").read_text())
    work = root / "tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        progress("pause: compiling", 0, 0)
        _run([go, "build", "-ldflags", "-s -w", "-o", str(work / "pause"), "."], src, _go_env(work), log, "pause")
        (root / "bin").mkdir(parents=True, exist_ok=True)
        (work / "pause").replace(root / "bin" / "pause")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_node_binaries(progress: ProgressFn | None = None) -> Path:
    """Build whatever real-node binary is missing; return their bin directory.

    Minutes the first time (kubelet and kube-proxy share most of their packages with the control plane's
    build, containerd and the CNI plugins are new), seconds after."""
    if not NODE.missing():
        return NODE.bin_dir
    node_prerequisites()
    root = NODE.root
    bins = _ensure(root, _node_targets(), progress)
    if not os.access(bins / "pause", os.X_OK):
        with build_lock(root):
            if not os.access(bins / "pause", os.X_OK):
                _build_pause(_go(), root, progress or (lambda step, done, total: None))
    still = NODE.missing()
    if still:
        raise ToolchainError(f"real-node binaries still missing after build: {', '.join(still)}")
    return bins


def _kueue_target() -> _Target:
    return _Target(
        name="kueue",
        module=KUEUE_MODULE,
        version=f"v{versions.KUEUE}",
        packages=(f"{KUEUE_MODULE}/cmd/kueue",),
        outputs=("kueue",),
        ldflags=f"-s -w -X {KUEUE_MODULE}/pkg/version.GitVersion=v{versions.KUEUE}",
    )


def kueue_manifests() -> Path:
    """Where ``ensure_kueue`` put the release's manifests: ``crd/`` (one YAML per CRD) and ``webhooks.yaml``."""
    return KUEUE.root / "manifests"


def ensure_kueue(progress: ProgressFn | None = None) -> Path:
    """Build Kueue's controller manager and copy its release's manifests, when missing; return the bin directory.

    Minutes the first time (controller-runtime and client-go are shared with nothing else we build), seconds after."""
    manifests = kueue_manifests()
    if not KUEUE.missing() and (manifests / "webhooks.yaml").exists():
        return KUEUE.bin_dir
    root = KUEUE.root
    bins = _ensure(root, (_kueue_target(),), progress)
    with build_lock(root):
        if not (manifests / "webhooks.yaml").exists():
            _copy_kueue_manifests(root, manifests)
    return bins


def _copy_kueue_manifests(root: Path, manifests: Path) -> None:
    work = root / "tmp"
    work.mkdir(parents=True, exist_ok=True)
    log = root / "logs" / "build-kueue.log"
    target = _kueue_target()
    out = _run(
        [_go(), "mod", "download", "-json", f"{target.module}@{target.version}"],
        root / "src" / target.name,
        _go_env(work),
        log,
        f"downloading {target.module}@{target.version}",
    )
    module_dir = Path(json.loads(out)["Dir"])
    crds, webhooks = (module_dir / rel for rel in KUEUE_MANIFESTS)
    staging = root / "manifests.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(crds, staging / "crd")
    shutil.copyfile(webhooks, staging / "webhooks.yaml")
    for path in staging.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the module cache is read-only
    shutil.rmtree(manifests, ignore_errors=True)
    staging.replace(manifests)
    shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point for scripts: build with plain-text progress on stderr; ``--real-nodes`` builds the
    real nodes' binaries instead of the control plane's."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m devheal.lab.toolchain", description=main.__doc__)
    parser.add_argument("--real-nodes", action="store_true", help="build kubelet, containerd, runc, CNI plugins")
    parser.add_argument("--kueue", action="store_true", help=f"build Kueue {versions.KUEUE}'s controller manager")
    args = parser.parse_args(argv)

    last_time = [0.0]
    last_step = [""]

    def show(step: str, done: int, total: int) -> None:
        now = time.monotonic()
        if step != last_step[0] or now - last_time[0] > 5:
            frac = f" {done}/{total}" if total else ""
            print(f"[lab build] {step}{frac}", file=sys.stderr, flush=True)
            last_time[0], last_step[0] = now, step

    started = time.monotonic()
    try:
        if args.kueue:
            path = ensure_kueue(show)
        elif args.real_nodes:
            path = ensure_node_binaries(show)
        else:
            path = ensure_binaries(show)
    except ToolchainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(f"[lab build] ready in {time.monotonic() - started:.0f}s", file=sys.stderr)
    print(path)


if __name__ == "__main__":
    main()
