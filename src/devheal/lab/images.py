"""Container images for the lab's real nodes, built here: nothing is pulled from a registry.

Each image is one uncompressed layer written as a reproducible tar (sorted entries, owner
root, time 0) inside an OCI image layout archive, which ``ctr images import`` takes. An
archive's file name carries its manifest digest, so an image is rebuilt only when its
content changes. Two images so far:

- ``pause``: the pod sandbox, the static ``pause`` binary devheal.lab.toolchain builds;
- ``busybox``: a small workload image, the static busybox of Debian's ``busybox-static``
  package with a link per applet (``/bin/sh``, ``/bin/sleep``, ...).
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from devheal.lab import toolchain

PAUSE_IMAGE = "devheal.local/lab/pause:1"
"""The sandbox image's name; containerd's CRI is told it (``pinned_images.sandbox``)."""

BUSYBOX_PACKAGE = "busybox-static"
"""The Debian package whose static busybox the workload image is made of."""

_LAYER = "application/vnd.oci.image.layer.v1.tar"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_INDEX = "application/vnd.oci.image.index.v1+json"


class ImageError(RuntimeError):
    """An image could not be built; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Entry:
    """One file, directory or symbolic link of a layer."""

    path: str
    mode: int = 0o755
    data: bytes | None = None
    link: str | None = None

    def tarinfo(self) -> tarfile.TarInfo:
        info = tarfile.TarInfo(self.path)
        info.mode = self.mode
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        if self.link is not None:
            info.type = tarfile.SYMTYPE
            info.linkname = self.link
        elif self.data is None:
            info.type = tarfile.DIRTYPE
        else:
            info.size = len(self.data)
        return info


@dataclass(frozen=True)
class ImageArchive:
    """An OCI image layout archive on disk and the name it is imported under."""

    name: str
    path: Path


def go_arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def layer_tar(entries: list[Entry]) -> bytes:
    """A reproducible layer: the same entries always give the same bytes (and digest)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            tar.addfile(entry.tarinfo(), io.BytesIO(entry.data) if entry.data is not None else None)
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()


def tree_layer(root: Path, out: BinaryIO) -> None:
    """A reproducible layer of everything under ``root``: its files, directories and symbolic links
    in path order, with their modes, owned by root at time 0 (hard links become separate files)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
            stat = path.lstat()
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.mode = stat.st_mode & 0o7777
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if path.is_symlink():
                info.type = tarfile.SYMTYPE
                info.linkname = str(path.readlink())
                tar.addfile(info)
            elif path.is_dir():
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif path.is_file():
                info.size = stat.st_size
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                raise ImageError(f"{path}: neither a file, a directory nor a symbolic link; a layer cannot hold it")


Layer = bytes | Path
"""A layer's uncompressed tar: in memory (small images) or in a file (large ones)."""


def write_oci_archive(out: BinaryIO, name: str, layers: list[Layer], config: dict[str, object]) -> str:
    """Write the OCI image layout archive of an image of ``layers`` (bottom first) to ``out``; return its
    manifest digest. Layer files are streamed, never held in memory."""
    described = [
        (_digest(layer), len(layer)) if isinstance(layer, bytes) else (_file_digest(layer), layer.stat().st_size)
        for layer in layers
    ]
    image_config = json.dumps(
        {
            "architecture": go_arch(),
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [digest for digest, _ in described]},
            "history": [{"created_by": "devheal.lab.images"}] * len(layers),
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": {"mediaType": _CONFIG, "digest": _digest(image_config), "size": len(image_config)},
            "layers": [{"mediaType": _LAYER, "digest": digest, "size": size} for digest, size in described],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": _INDEX,
            "manifests": [
                {
                    "mediaType": _MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": go_arch(), "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    blobs: dict[str, Layer] = {
        f"blobs/sha256/{digest[7:]}": layer for (digest, _), layer in zip(described, layers, strict=True)
    }
    blobs |= {f"blobs/sha256/{_digest(blob)[7:]}": blob for blob in (image_config, manifest)}
    blobs |= {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(Entry(directory).tarinfo())
        for path in sorted(blobs):
            blob = blobs[path]
            info = Entry(path, 0o644, b"").tarinfo()
            if isinstance(blob, bytes):
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
            else:
                info.size = blob.stat().st_size
                with blob.open("rb") as handle:
                    tar.addfile(info, handle)
    return _digest(manifest)


def oci_archive(name: str, entries: list[Entry], config: dict[str, object]) -> tuple[str, bytes]:
    """The OCI image layout archive of a one-layer image: (manifest digest, archive bytes)."""
    buffer = io.BytesIO()
    digest = write_oci_archive(buffer, name, [layer_tar(entries)], config)
    return digest, buffer.getvalue()


def _store(name: str, entries: list[Entry], config: dict[str, object]) -> ImageArchive:
    digest, archive = oci_archive(name, entries, config)
    directory = toolchain.NODE.root / "images"
    directory.mkdir(parents=True, exist_ok=True)
    stem = name.rsplit("/", 1)[1].replace(":", "-")
    path = directory / f"{stem}-{digest[7:19]}.tar"
    if not path.exists():
        partial = path.with_suffix(".partial")
        partial.write_bytes(archive)
        partial.replace(path)
    return ImageArchive(name, path)


def _base_dirs() -> list[Entry]:
    return [Entry("bin"), Entry("etc"), Entry("tmp", 0o1777), Entry("proc"), Entry("sys"), Entry("dev")]


def pause_image() -> ImageArchive:
    """The sandbox image: the lab's static ``pause`` as ``/pause``, run as nobody."""
    binary = toolchain.NODE.binary("pause")
    if not binary.is_file():
        raise ImageError(f"{binary} is missing: build the real nodes' binaries first (devheal lab build --real-nodes)")
    entries = [Entry("pause", 0o755, binary.read_bytes())]
    return _store(PAUSE_IMAGE, entries, {"Entrypoint": ["/pause"], "User": "65535:65535"})


def _busybox() -> tuple[Path, str]:
    """The static busybox binary of Debian's package and the package's version."""
    try:
        version = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", BUSYBOX_PACKAGE], capture_output=True, text=True, check=True
        ).stdout.strip()
        files = subprocess.run(["dpkg", "-L", BUSYBOX_PACKAGE], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ImageError(
            f"the lab's workload image is made of Debian's {BUSYBOX_PACKAGE}, which is not installed: "
            f"run `apt-get install -y {BUSYBOX_PACKAGE}` (scripts/bootstrap does, as root)"
        ) from exc
    for line in files.splitlines():
        path = Path(line)
        if path.name == "busybox" and path.is_file():
            return path, version
    raise ImageError(f"{BUSYBOX_PACKAGE} {version} is installed but has no busybox binary (dpkg -L {BUSYBOX_PACKAGE})")


def busybox_image() -> ImageArchive:
    """The workload image: busybox as ``/bin/busybox`` and a link per applet, tagged with the package version."""
    binary, version = _busybox()
    applets = subprocess.run([str(binary), "--list"], capture_output=True, text=True, check=True).stdout.split()
    entries = [*_base_dirs(), Entry("bin/busybox", 0o755, binary.read_bytes())]
    entries += [Entry(f"bin/{applet}", 0o777, link="busybox") for applet in applets if applet != "busybox"]
    entries += [
        Entry("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
        Entry("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n"),
    ]
    tag = "".join(c if c.isalnum() or c in "._-" else "_" for c in version)
    return _store(f"devheal.local/lab/busybox:{tag}", entries, {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]})


def import_image(image: ImageArchive, ctr: Path, address: Path) -> None:
    """Import ``image`` into a containerd's CRI namespace (``k8s.io``), where kubelet finds it."""
    cmd = [str(ctr), f"--address={address}", "--namespace=k8s.io", "images", "import", str(image.path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"importing {image.name} ({image.path}) failed: {proc.stderr.strip() or proc.stdout.strip()}")


def have_busybox() -> bool:
    """Whether the workload image can be built here (tests that need it skip otherwise)."""
    return shutil.which("dpkg-query") is not None and _installed(BUSYBOX_PACKAGE)


def _installed(package: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    return proc.returncode == 0 and "install ok installed" in proc.stdout
