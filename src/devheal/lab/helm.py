"""Build ``helm`` from its pinned Go module, once, into its own cache directory.

The chart (deploy/helm/devheal) is linted and rendered with this binary. It lives
apart from the lab's control-plane binaries (``<cache>/tools/helm-<version>/helm``)
so that pinning another helm never rebuilds the lab, and it is built on first use
only: nothing in the lab's fast path waits for it. helm's go.mod has no replace
directives, so ``go install module/cmd@version`` builds it as released.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from devheal.lab.toolchain import ToolchainError, build_lock, cache_root

HELM = "3.22.0"
"""helm.sh/helm/v3: the newest v3 release (``go list -m -versions helm.sh/helm/v3``)."""

_MODULE = "helm.sh/helm/v3"
_PACKAGE = f"{_MODULE}/cmd/helm"


def helm_dir() -> Path:
    return cache_root() / "tools" / f"helm-{HELM}"


def helm_path() -> Path:
    return helm_dir() / "helm"


def _kubernetes_minor(go: str, env: dict[str, str], cwd: Path) -> str:
    """The Kubernetes minor version of the client-go helm's go.mod requires (v0.37.x -> "37")."""
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"{_MODULE}@v{HELM}"], cwd=cwd, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise ToolchainError(f"downloading {_MODULE}@v{HELM} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    gomod = Path(json.loads(proc.stdout)["GoMod"]).read_text()
    match = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", gomod, flags=re.MULTILINE)
    if match is None:
        raise ToolchainError(f"{_MODULE}@v{HELM}: its go.mod requires no k8s.io/client-go v0.x")
    return match.group(1)


def _ldflags(kubernetes_minor: str) -> str:
    """What helm's Makefile stamps: the release for `helm version`, and the Kubernetes version `helm template`
    and `helm lint` assume (else 1.20, older than the chart's kubeVersion allows)."""
    flags = [
        "-s",
        "-w",
        f"-X {_MODULE}/internal/version.version=v{HELM}",
        f"-X {_MODULE}/internal/version.gitTreeState=clean",
    ]
    for pkg in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X {_MODULE}/{pkg}.k8sVersionMajor=1", f"-X {_MODULE}/{pkg}.k8sVersionMinor={kubernetes_minor}"]
    return " ".join(flags)


def _build(root: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise ToolchainError(f"the Go toolchain is needed to build helm {HELM}: 'go' is not on PATH")
    work = root / "tmp"
    shutil.rmtree(work, ignore_errors=True)
    stage = work / "bin"
    stage.mkdir(parents=True)
    log = root / "build.log"
    env = dict(os.environ)
    env.update(
        {
            "CGO_ENABLED": "0",
            "GOFLAGS": "-mod=mod -buildvcs=false -trimpath",
            "GOWORK": "off",
            "GO111MODULE": "on",
            "GOBIN": str(stage),
            "TMPDIR": str(work),
        }
    )
    env.setdefault("GOTOOLCHAIN", "auto")
    try:
        cmd = [go, "install", "-ldflags", _ldflags(_kubernetes_minor(go, env, work)), f"{_PACKAGE}@v{HELM}"]
        with log.open("w") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            proc = subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise ToolchainError(f"building helm {HELM} failed (exit {proc.returncode}); log {log}:\n{tail}")
        # Moved into place only once whole: an interrupted build leaves no binary behind.
        (stage / "helm").replace(helm_path())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_helm() -> Path:
    """The path of the pinned helm, built first if missing (minutes once, then instant)."""
    if os.access(helm_path(), os.X_OK):
        return helm_path()
    root = helm_dir()
    with build_lock(root):
        if not os.access(helm_path(), os.X_OK):
            _build(root)
    return helm_path()


def main() -> None:
    """Entry point for scripts: build helm if needed and print its path."""
    try:
        path = ensure_helm()
    except ToolchainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(path)


if __name__ == "__main__":
    main()
