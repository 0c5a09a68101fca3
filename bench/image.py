"""Benchmark and check: build the image with buildah, then run it as its user on a read-only root.

    python -m bench.image                            # the Dockerfile's base, pulled
    python -m bench.image --base-rootfs /srv/rootfs  # a stand-in base where no registry is reachable

Needs root and buildah (Debian: ``apt-get install buildah``); no daemon. ``--base-rootfs``
commits a root file system (say, ``debootstrap bookworm`` plus python3, python3-venv,
python3-pip, python-is-python3 and the machine's CA certificates) as the base image in
place of the Dockerfile's ``PYTHON_IMAGE``. The image is then run without a container
runtime, the way a pod with ``readOnlyRootFilesystem`` would run it: in a private mount
namespace, its root bind-mounted read-only, ``chroot`` as the image's ``USER`` with the
image's ``ENV`` and ``WORKDIR`` only. It times ``devheal --help`` and ``devheal barrier
--help``, checks every entry point the manifests use, the generated gRPC modules and a
pod-resources round trip (a server here, the image's client over a unix socket in a
writable ``/tmp``, as an emptyDir would give), and that the root cannot be written.
Prints a table and writes bench/results/image.json. Not part of the test suite: CI has no
container engine (tests/unit/packaging checks the Dockerfile as data).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.report import write_results
from devheal import __version__
from devheal.kubelet.podresources import ContainerDevices, ContainerResources, PodResources, PodResourcesServer

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
ENTRY_POINTS = ("controller", "agent", "launch", "barrier", "sidecar")
PROBE = """\
import asyncio, sys
from pathlib import Path
from devheal.kubelet.podresources import PodResourcesClient
async def main():
    async with PodResourcesClient(Path(sys.argv[1])) as client:
        pods = await client.list_pods()
    print(",".join(f"{p.namespace}/{p.name}:{len(p.containers[0].devices[0].device_ids)}" for p in pods))
asyncio.run(main())
"""


class Failed(Exception):
    """A step of the build or of a check did not go as expected."""


def sh(args: Sequence[str], **kwargs: Any) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise Failed(f"{' '.join(args[:4])} ... exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def standin_base(rootfs: Path) -> str:
    """Commit ``rootfs`` as a base image; return its name."""
    ctr = sh(["buildah", "from", "scratch"]).strip()
    try:
        mnt = Path(sh(["buildah", "mount", ctr]).strip())
        sh(["cp", "-a", f"{rootfs}/.", f"{mnt}/"])
        sh(["buildah", "umount", ctr])
        env = ["--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        cert = rootfs / "etc/ssl/certs/ca-certificates.crt"
        if cert.exists():  # pip in the build trusts what the stand-in's system store trusts
            env += ["--env", "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"]
        sh(["buildah", "config", *env, ctr])
        sh(["buildah", "commit", "-q", ctr, "localhost/devheal-bench-base:latest"])
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
    return "localhost/devheal-bench-base:latest"


def build(tag: str, base: str | None) -> float:
    args = ["buildah", "bud", "--layers=false", "-t", tag]
    if base:
        args += ["--build-arg", f"PYTHON_IMAGE={base}"]
    started = time.perf_counter()
    sh([*args, "."], cwd=REPO)
    return time.perf_counter() - started


@contextmanager
def mounted(image: str) -> Iterator[Path]:
    ctr = sh(["buildah", "from", image]).strip()
    try:
        yield Path(sh(["buildah", "mount", ctr]).strip())
    finally:
        subprocess.run(["buildah", "umount", ctr], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)


def image_config(image: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(sh(["buildah", "inspect", image]))["OCIv1"]["config"]
    return config


def in_image(mnt: Path, config: dict[str, Any], argv: Sequence[str], tmp: Path | None = None) -> list[str]:
    """The command line running ``argv`` in the image as a pod with a read-only root would."""
    user = config.get("User") or "0:0"
    uid, _, gid = user.partition(":")
    mounts = [
        'mount --bind "$0" "$0"',
        'mount --rbind /proc "$0/proc"',
        'mount --rbind /dev "$0/dev"',
        'mount -o remount,bind,ro "$0"',
    ]
    if tmp is not None:
        mounts.append(f'mount --bind "{tmp}" "$0/tmp"')
    script = " && ".join([*mounts, 'exec chroot --userspec="$1" "$0" /usr/bin/env -i "${@:2}"'])
    env = ["-C", config.get("WorkingDir") or "/", *config.get("Env", [])]
    return ["unshare", "-m", "bash", "-c", script, str(mnt), f"{uid}:{gid or uid}", *env, *argv]


def timed(cmd: Sequence[str], runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs + 1):  # the first warms the file cache
        started = time.perf_counter()
        sh(cmd)
        times.append(time.perf_counter() - started)
    return {"median_s": round(statistics.median(times[1:]), 3), "max_s": round(max(times[1:]), 3)}


class _Node:
    pods = (
        PodResources(
            "training",
            "llm-0",
            (ContainerResources("train", (ContainerDevices("nvidia.com/gpu", ("GPU-0", "GPU-1")),)),),
        ),
    )

    def list_pods(self) -> Sequence[PodResources]:
        return self.pods

    def allocatable(self) -> Sequence[ContainerDevices]:
        return [ContainerDevices("nvidia.com/gpu", ("GPU-0", "GPU-1", "GPU-2"))]

    def get_pod(self, namespace: str, name: str) -> PodResources | None:
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)


async def pod_resources_round_trip(mnt: Path, config: dict[str, Any], python: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o1777)  # an emptyDir: writable by the image's user
        async with PodResourcesServer(_Node(), Path(tmp) / "kubelet.sock") as server:
            server.socket_path.chmod(0o666)
            proc = await asyncio.create_subprocess_exec(
                *in_image(mnt, config, [python, "-c", PROBE, "/tmp/kubelet.sock"], tmp=Path(tmp)),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    if proc.returncode != 0:
        raise Failed(f"pod-resources client in the image exited {proc.returncode}: {err.decode()[-500:]}")
    return out.decode().strip()


def checks(mnt: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    entry = list(config.get("Entrypoint") or [])
    python = "/opt/devheal/bin/python"
    rows: list[dict[str, Any]] = []

    def check(name: str, run: Any) -> None:
        try:
            rows.append({"check": name, "ok": True, "detail": str(run())[:80]})
        except Failed as exc:
            rows.append({"check": name, "ok": False, "detail": str(exc)})

    check("user", lambda: sh(in_image(mnt, config, ["id", "-u"])).strip())
    check("devheal version", lambda: sh(in_image(mnt, config, [*entry, "version"])).strip())
    for command in ENTRY_POINTS:
        check(f"devheal {command} --help", lambda c=command: len(sh(in_image(mnt, config, [*entry, c, "--help"]))))
    imports = "from devheal.kubelet.podresources import api_pb2, api_pb2_grpc; print(api_pb2_grpc.__file__)"
    check("generated modules import", lambda: sh(in_image(mnt, config, [python, "-c", imports])).strip())
    check("pod-resources round trip", lambda: asyncio.run(pod_resources_round_trip(mnt, config, python)))

    def root_is_read_only() -> str:
        done = subprocess.run(in_image(mnt, config, ["touch", "/opt/devheal/x"]), capture_output=True, text=True)
        if done.returncode == 0 or "Read-only" not in done.stderr:
            raise Failed(f"writing /opt/devheal/x: exit {done.returncode} {done.stderr.strip()}")
        return done.stderr.strip()

    check("root file system refuses writes", root_is_read_only)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--base-rootfs", type=Path, help="a root file system to use as the base image")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tag", default=f"localhost/devheal:{__version__}")
    parser.add_argument("--out", type=Path, default=RESULTS / "image.json")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        sys.exit("bench.image: needs root and buildah (apt-get install buildah)")
    os.environ.setdefault("STORAGE_DRIVER", "vfs")  # works inside a container, no kernel overlay needed
    os.environ.setdefault("BUILDAH_ISOLATION", "chroot")
    base = standin_base(args.base_rootfs) if args.base_rootfs else None
    print(f"building {args.tag} (base: {base or 'the Dockerfile default'}) ...", flush=True)
    build_s = build(args.tag, base)
    config = image_config(args.tag)
    with mounted(args.tag) as mnt:
        size = int(sh(["du", "-sb", str(mnt)]).split()[0])
        venv = int(sh(["du", "-sb", str(mnt / "opt/devheal")]).split()[0])
        entry = list(config.get("Entrypoint") or [])
        startup = {
            "devheal --help": timed(in_image(mnt, config, [*entry, "--help"]), args.runs),
            "devheal barrier --help": timed(in_image(mnt, config, [*entry, "barrier", "--help"]), args.runs),
        }
        rows = checks(mnt, config)
    print(
        f"build {build_s:.0f} s; root file system {size / 2**20:.0f} MiB, of which /opt/devheal {venv / 2**20:.0f} MiB"
    )
    for name, t in startup.items():
        print(
            f"{name:<24} median {t['median_s']:.3f} s  max {t['max_s']:.3f} s (read-only root, user {config['User']})"
        )
    for row in rows:
        print(f"{'ok ' if row['ok'] else 'FAIL'} {row['check']:<34} {row['detail']}")
    write_results(
        args.out,
        "image",
        {
            "base": base or "Dockerfile default",
            "build_s": round(build_s, 1),
            "rootfs_bytes": size,
            "venv_bytes": venv,
            "config": {k: config.get(k) for k in ("User", "Entrypoint", "Cmd", "WorkingDir", "Env")},
            "startup": startup,
            "checks": rows,
        },
    )
    if not all(row["ok"] for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
