"""Build the lab's control-plane binaries from pinned Go modules, once, into a cache.

Kubernetes cannot be ``go install``-ed: its go.mod points the staging modules
(k8s.io/api, k8s.io/client-go, ...) at local directories. So, per component, we
write a tiny wrapper module that requires the pinned release, replaces every
staging module with its published ``v0.x.y`` twin, and ``go build``-s the
commands we need. Binaries land in a per-version directory under the user's
cache; a build goes to a temporary directory first and is moved into place, so
an interrupted build never leaves a half-written binary behind.
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


def version_dir() -> Path:
    return cache_root() / "lab" / versions.cache_key()


def bin_dir() -> Path:
    return version_dir() / "bin"


def binary(name: str) -> Path:
    return bin_dir() / name


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if not os.access(binary(name), os.X_OK)]


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


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ToolchainError(
            "the Go toolchain is needed to build the lab binaries: 'go' is not on PATH "
            f"(Go >= {versions.GO_MINIMUM[0]}.{versions.GO_MINIMUM[1]})"
        )
    return go


def _go_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CGO_ENABLED": "0",
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


def _build_target(go: str, target: _Target, work: Path, progress: ProgressFn) -> None:
    src = version_dir() / "src" / target.name
    log = version_dir() / "logs" / f"build-{target.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    env = _go_env(work)
    progress(f"{target.name}: resolving modules", 0, 0)
    _write_wrapper(go, src, env, log, target)
    _run([go, "mod", "download"], src, env, log, f"{target.name}: module download")
    env_tags = dict(env, GOFLAGS=env["GOFLAGS"] + " -tags=tools")
    _run([go, "mod", "tidy"], src, env_tags, log, f"{target.name}: go mod tidy")
    deps = _run(
        [go, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", *target.packages],
        src,
        env,
        log,
        f"{target.name}: listing packages",
    )
    total = sum(1 for line in deps.splitlines() if line.strip())
    stage = work / f"out-{target.name}"
    stage.mkdir(parents=True, exist_ok=True)
    cmd = [go, "build", "-v", "-ldflags", target.ldflags, "-o", str(stage) + os.sep, *target.packages]
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
    bins = bin_dir()
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


def ensure_binaries(progress: ProgressFn | None = None) -> Path:
    """Build whatever binary is missing; return the bin directory. Seconds when the cache is warm."""
    report: ProgressFn = progress or (lambda step, done, total: None)
    if not missing_binaries():
        return bin_dir()
    go = _go()
    with build_lock(version_dir()):
        for target in _targets():
            if all(os.access(binary(name), os.X_OK) for name in target.outputs):
                continue
            work = version_dir() / "tmp"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            try:
                _build_target(go, target, work, report)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    still = missing_binaries()
    if still:
        raise ToolchainError(f"binaries still missing after build: {', '.join(still)}")
    return bin_dir()


def main() -> None:
    """Entry point for scripts: build with plain-text progress on stderr."""
    import sys

    last_time = [0.0]
    last_step = [""]

    def show(step: str, done: int, total: int) -> None:
        now = time.monotonic()
        if step != last_step[0] or now - last_time[0] > 5:
            frac = f" {done}/{total}" if total else ""
            print(f"[lab build] {step}{frac}", file=sys.stderr, flush=True)
            last_time[0], last_step[0] = now, step

    try:
        path = ensure_binaries(show)
    except ToolchainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(path)


if __name__ == "__main__":
    main()
