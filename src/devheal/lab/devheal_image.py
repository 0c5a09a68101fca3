"""The devheal image for the lab's real nodes, built here from Debian's packages and the wheel: nothing is pulled.

What ``Dockerfile`` makes, without Docker or a registry, as an OCI image archive ``ctr images import``
takes (like the pause and busybox images of devheal.lab.images), in two layers:

- **base**: the root file system of Debian's Python 3.11 (``python3.11-minimal``,
  ``libpython3.11-minimal``, ``libpython3.11-stdlib``, ``libstdc++6`` and the closure of their Depends and
  Pre-Depends, fetched with ``apt-get download``, which checks them against apt's signed index, and
  unpacked with ``dpkg-deb -x``), a user 65532, and the virtual environment ``/opt/devheal`` holding the
  locked runtime dependencies (``requirements-runtime.lock``, hash-checked, the manylinux wheels for
  CPython 3.11 and the packages' glibc);
- **devheal**: the wheel built from the source tree (its build hook generates the gRPC code),
  installed into that environment, with the ``devheal`` entry point.

Both are byte-compiled at build time (hash-based ``.pyc``: nothing is compiled or written at run time,
so the root file system can be read-only). Each layer is cached under a hash of what goes into it, the
image under both: with nothing changed a build only hashes the sources and reads apt's index; a
source change rebuilds the devheal layer alone.

The closure takes the first alternative of each ``a | b`` (what apt picks on an empty system) and leaves
out what only a package manager uses (``EXCLUDED_PACKAGES``); documentation other than each package's
copyright file is not copied.
"""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from devheal.lab import toolchain
from devheal.lab.images import ImageArchive, ImageError, go_arch, tree_layer, write_oci_archive

IMAGE_REPOSITORY = "devheal.local/lab/devheal"
"""The image's name without its tag; the tag is the project's version and the content key."""

BASE_PACKAGES = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libstdc++6")
"""Debian's Python 3.11: the interpreter, and the standard library with the C libraries it loads; and the C++
runtime, which the manylinux policy lets a wheel take from the system (grpcio's extension does). The other
system libraries that policy allows a headless wheel (glibc's, libgcc_s, libz, libexpat) are in the closure."""

EXCLUDED_PACKAGES: Mapping[str, str] = {
    "dpkg": "readline-common's `dpkg | install-info` registers its info manual; the image installs no packages",
    "install-info": "the other alternative of that dependency, for the same manual",
}
"""Packages of the closure the image leaves out, and why: both serve package installation, not Python."""

PYTHON = "3.11"
VENV = "/opt/devheal"
SITE_PACKAGES = f"{VENV}/lib/python{PYTHON}/site-packages"
USER = "65532:65532"
RECIPE = "1"
"""Part of every cache key: bump it when the way the image is made changes."""

_DEPENDS_FLAGS = ("--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances")
_KEPT_DOCS = "copyright"
_PRUNED = ("usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale")

Progress = Callable[[str], None]


# ---- pure parts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DebPackage:
    """One .deb as apt names it: the file ``apt-get download`` writes, its size and SHA-256."""

    name: str
    version: str
    filename: str
    size: int
    sha256: str


def parse_depends(text: str) -> dict[str, list[list[str]]]:
    """``apt-cache depends`` output -> each package's dependency groups (a group lists its alternatives;
    a virtual package ``<name>`` is replaced by its providers, in apt's order)."""
    result: dict[str, list[list[str]]] = {}
    groups: list[list[str]] = []
    open_group = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            groups = result.setdefault(line.strip().split(":")[0], [])
            open_group = False
            continue
        if line.startswith("    "):  # a provider of the virtual package on the line above
            if groups:
                groups[-1].append(line.strip().split(":")[0])
            continue
        match = re.match(r"^ ([ |])(Pre)?Depends: (.+)$", line)
        if match is None:
            continue
        name = match.group(3).strip()
        alternative = [] if name.startswith("<") else [name.split(":")[0]]
        if open_group:
            groups[-1].extend(alternative)
        else:
            groups.append(alternative)
        open_group = match.group(1) == "|"
    return result


def closure(
    roots: Iterable[str],
    depends: Callable[[list[str]], dict[str, list[list[str]]]],
    excluded: Iterable[str] = (),
) -> list[str]:
    """Every package ``roots`` need, sorted: of each dependency group the first alternative not excluded
    (a group with none left is dropped). ``depends`` answers for a batch of packages."""
    skip = set(excluded)
    seen: set[str] = set()
    todo = [name for name in roots if name not in skip]
    while todo:
        batch = sorted(set(todo) - seen)
        seen |= set(batch)
        todo = []
        answers = depends(batch) if batch else {}
        for name in batch:
            if name not in answers:
                raise ImageError(f"Debian package {name} is unknown to apt (run `apt-get update`)")
            for group in answers[name]:
                chosen = next((alt for alt in group if alt not in skip), None)
                if chosen is not None and chosen not in seen:
                    todo.append(chosen)
    return sorted(seen)


def parse_print_uris(text: str) -> list[DebPackage]:
    """``apt-get download --print-uris`` output -> the packages (the URIs themselves are not kept)."""
    packages = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 4 or not fields[3].startswith("SHA256:"):
            continue
        filename = fields[1]
        parts = filename.removesuffix(".deb").split("_")
        if len(parts) != 3:
            raise ImageError(f"apt named a package file {filename!r}, expected <name>_<version>_<arch>.deb")
        version = parts[1].replace("%3a", ":")
        packages.append(DebPackage(parts[0], version, filename, int(fields[2]), fields[3].removeprefix("SHA256:")))
    return sorted(packages, key=lambda p: p.name)


def upstream_version(debian_version: str) -> str:
    """``3.11.2-6+deb12u9`` -> ``3.11.2``; ``2.36-9+deb12u14`` -> ``2.36`` (no epoch, no Debian revision)."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def manylinux_platforms(glibc: str, arch: str) -> list[str]:
    """The manylinux tags a wheel may carry to run on ``glibc`` (e.g. ``2.36``), newest first."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    if major != 2:
        raise ImageError(f"glibc {glibc}: only glibc 2.x is known to manylinux")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for m, name in legacy.items() if m <= minor]
    return tags


def entry_point_scripts(entry_points: str, python: str) -> dict[str, str]:
    """A wheel's ``entry_points.txt`` -> ``{script name: script text}`` for its console scripts."""
    parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(entry_points)
    scripts = {}
    for name, target in parser["console_scripts"].items() if parser.has_section("console_scripts") else []:
        module, _, attribute = target.strip().partition(":")
        scripts[name] = (
            f"#!{python}\nimport sys\nfrom {module} import {attribute.split('.')[0]}\n\n"
            f'if __name__ == "__main__":\n    sys.exit({attribute.strip()}())\n'
        )
    return scripts


def pyvenv_cfg(python_version: str) -> str:
    return f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python_version}\n"


PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin\n"
GROUP = "root:x:0:\nnonroot:x:65532:\n"


def image_config(python_version: str) -> dict[str, object]:
    """The Dockerfile's runtime settings: non-root, no byte-code writes, a home under /tmp."""
    return {
        "Entrypoint": ["devheal"],
        "Cmd": ["--help"],
        "User": USER,
        "WorkingDir": "/tmp",
        "Env": [
            f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONDONTWRITEBYTECODE=1",
            "PYTHONUNBUFFERED=1",
            "HOME=/tmp",
        ],
        "Labels": {"org.opencontainers.image.title": "devheal", "devheal.io/python": python_version},
    }


def _is_generated(path: Path) -> bool:
    return path.name.startswith("api_pb2") or any(part.startswith(".codegen-") for part in path.parts)


def source_files(project: Path) -> list[Path]:
    """What the wheel is built from: the build files and every source file (not byte code, not the
    generated gRPC modules, which the build writes from the ``.proto`` files counted here)."""
    files = [project / name for name in ("pyproject.toml", "hatch_build.py", "README.md")]
    for path in sorted((project / "src").rglob("*")):
        relative = path.relative_to(project)
        byte_code = "__pycache__" in relative.parts or path.suffix == ".pyc"
        if path.is_file() and not byte_code and not _is_generated(relative):
            files.append(path)
    return files


def content_key(parts: Iterable[tuple[str, bytes]]) -> str:
    """A SHA-256 over named parts (names and lengths framed, so no two different inputs collide)."""
    digest = hashlib.sha256()
    for name, data in parts:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


# ---- the machine's side -------------------------------------------------------------------------


def cache_dir() -> Path:
    return toolchain.cache_root() / "lab" / "devheal-image"


def project_root() -> Path:
    """The source checkout this devheal runs from: the image is built from it."""
    import devheal

    root = Path(devheal.__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "requirements-runtime.lock").is_file():
        raise ImageError(
            f"the devheal image is built from a source checkout (pyproject.toml, requirements-runtime.lock), "
            f"and devheal runs from {root}, which is none"
        )
    return root


def _run(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> str:
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(cmd)}\n")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    except OSError as exc:
        raise ImageError(f"{what}: cannot run {cmd[0]} ({exc.strerror})") from exc
    with log.open("a") as handle:
        handle.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ImageError(f"{what} failed (exit {proc.returncode}; log {log}):\n{tail}")
    return proc.stdout


def _apt_lists_state() -> bytes:
    """What apt's index looks like now (names, sizes, times of its package lists): the resolved closure is
    reused until an `apt-get update` changes it."""
    lists = Path("/var/lib/apt/lists")
    entries = sorted(p for p in lists.glob("*_Packages*")) if lists.is_dir() else []
    return "\n".join(f"{p.name} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in entries).encode()


def resolve_packages(log: Path, progress: Progress) -> list[DebPackage]:
    """The base layer's packages at apt's candidate versions (cached until apt's index changes)."""
    if shutil.which("apt-cache") is None or shutil.which("apt-get") is None:
        raise ImageError("the devheal image's base is made of Debian's packages: apt-get and apt-cache are missing")
    key = content_key(
        [
            ("recipe", RECIPE.encode()),
            ("roots", " ".join(BASE_PACKAGES).encode()),
            ("excluded", " ".join(sorted(EXCLUDED_PACKAGES)).encode()),
            ("apt", _apt_lists_state()),
        ]
    )
    cached = cache_dir() / f"packages-{key[:16]}.json"
    if cached.is_file():
        return [DebPackage(**item) for item in json.loads(cached.read_text())]
    progress("resolving Debian packages (apt-cache depends)")

    def depends(batch: list[str]) -> dict[str, list[list[str]]]:
        return parse_depends(_run(["apt-cache", "depends", *_DEPENDS_FLAGS, *batch], log, "apt-cache depends"))

    names = closure(BASE_PACKAGES, depends, EXCLUDED_PACKAGES)
    packages = parse_print_uris(_run(["apt-get", "download", "--print-uris", *names], log, "apt-get download"))
    missing = set(names) - {p.name for p in packages}
    if missing:
        raise ImageError(f"apt has no package file for {', '.join(sorted(missing))} (run `apt-get update`)")
    for stale in cache_dir().glob("packages-*.json"):
        stale.unlink()
    cached.write_text(json.dumps([p.__dict__ for p in packages], indent=1))
    return packages


def download(packages: list[DebPackage], debs: Path, log: Path, progress: Progress) -> None:
    """Fetch the .debs not yet in ``debs`` (apt checks each against its signed index; so do we, after)."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if not (debs / p.filename).is_file()]
    if missing:
        progress(f"downloading {len(missing)} Debian packages ({sum(p.size for p in missing) / 2**20:.1f} MiB)")
        _run(["apt-get", "download", *(f"{p.name}={p.version}" for p in missing)], log, "apt-get download", cwd=debs)
    for package in packages:
        path = debs / package.filename
        with path.open("rb") as handle:
            actual = hashlib.file_digest(handle, "sha256").hexdigest()
        if actual != package.sha256:
            path.unlink()
            raise ImageError(f"{path}: SHA-256 {actual}, apt's index says {package.sha256}; removed it, build again")


def _python311() -> str:
    """A CPython 3.11 to byte-compile with: the .pyc format is the same in every 3.11 release."""
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        raise ImageError(
            "byte-compiling the image needs a CPython 3.11 (this is not one, and python3.11 is not on PATH)"
        )
    return found


def _pip() -> list[str]:
    """A pip to install with (any Python's: ``--target`` with ``--python-version`` decides what is installed)."""
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or ""]
    for python in dict.fromkeys(c for c in candidates if c):
        if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return [python, "-m", "pip"]
    raise ImageError("installing the image's Python packages needs pip (python3 -m pip), and none was found")


def _pip_install(args: list[str], target: Path, log: Path, what: str) -> None:
    cmd = [*_pip(), "install", "--disable-pip-version-check", "--no-compile", "--no-deps", "--target", str(target)]
    _run([*cmd, *args], log, what)
    shutil.rmtree(target / "bin", ignore_errors=True)  # its console scripts name this machine's Python


def _compile(rootfs: Path, directories: list[str], log: Path, strict: bool) -> None:
    """Byte-compile ``directories`` (paths in the image) with hash-based .pyc that are never re-checked:
    the image's files do not change, and its root file system may be read-only."""
    cmd = [_python311(), "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash"]
    cmd += ["-s", str(rootfs), "-p", "/", *(str(rootfs / d.lstrip("/")) for d in directories)]
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(cmd)}\n")
        proc = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT)
    # Debian's standard library holds a few files that are not Python 3 on purpose (test data): skipped, as
    # Debian's own py3compile skips them; the runtime dependencies and devheal must compile.
    if proc.returncode != 0 and strict:
        raise ImageError(f"byte-compiling {', '.join(directories)} failed; log {log}")


def _prune_docs(rootfs: Path) -> None:
    for relative in _PRUNED:
        shutil.rmtree(rootfs / relative, ignore_errors=True)
    docs = rootfs / "usr/share/doc"
    for path in sorted(docs.rglob("*"), reverse=True) if docs.is_dir() else []:
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.name != _KEPT_DOCS:
            path.unlink()


def build_base_layer(
    packages: list[DebPackage], debs: Path, lock: Path, dest: Path, log: Path, progress: Progress
) -> None:
    """Debian's Python, a user, and the virtual environment with the locked dependencies, as a layer tar."""
    python_version = upstream_version(_package(packages, "python3.11-minimal").version)
    glibc = upstream_version(_package(packages, "libc6").version)
    with tempfile.TemporaryDirectory(prefix="base-", dir=dest.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        progress(f"unpacking {len(packages)} Debian packages (Python {python_version}, glibc {glibc})")
        for package in packages:
            _run(["dpkg-deb", "-x", str(debs / package.filename), str(rootfs)], log, f"unpacking {package.filename}")
        _prune_docs(rootfs)
        for directory, mode in (("tmp", 0o1777), ("etc", 0o755), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755)):
            (rootfs / directory).mkdir(exist_ok=True)
            (rootfs / directory).chmod(mode)
        (rootfs / "etc/passwd").write_text(PASSWD)
        (rootfs / "etc/group").write_text(GROUP)
        venv = rootfs / VENV.lstrip("/")
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text(pyvenv_cfg(python_version))
        (venv / "bin/python").symlink_to(f"/usr/bin/python{PYTHON}")
        (venv / "bin/python3").symlink_to("python")
        (venv / f"bin/python{PYTHON}").symlink_to("python")
        progress("installing the locked runtime dependencies (pip, hash-checked wheels)")
        platforms = [arg for tag in manylinux_platforms(glibc, _machine()) for arg in ("--platform", tag)]
        _pip_install(
            ["--python-version", PYTHON, "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}",
             *platforms, "--only-binary", ":all:", "--require-hashes", "-r", str(lock)],
            rootfs / SITE_PACKAGES.lstrip("/"),
            log,
            "installing requirements-runtime.lock",
        )  # fmt: skip
        progress("byte-compiling the standard library and the dependencies")
        _compile(rootfs, [f"/usr/lib/python{PYTHON}"], log, strict=False)
        _compile(rootfs, [SITE_PACKAGES], log, strict=True)
        progress("writing the base layer")
        _write_layer(rootfs, dest)


def build_devheal_layer(project: Path, dest: Path, log: Path, progress: Progress) -> None:
    """The devheal wheel installed into the base layer's virtual environment, as a layer tar."""
    with tempfile.TemporaryDirectory(prefix="devheal-", dir=dest.parent) as tmp:
        missing = [module for module in ("hatchling", "grpc_tools") if importlib.util.find_spec(module) is None]
        if missing:
            raise ImageError(
                f"building the devheal wheel needs the build requirements in this Python ({sys.executable}): "
                f"{', '.join(missing)} missing (pip install --require-hashes -r requirements-build.lock)"
            )
        progress("building the devheal wheel (hatchling; its hook generates the gRPC code)")
        wheels = Path(tmp) / "dist"
        _run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(wheels)], log, "the wheel", project)
        built = sorted(wheels.glob("devheal-*.whl"))
        if len(built) != 1:
            raise ImageError(f"building the wheel wrote {len(built)} devheal-*.whl, expected one; log {log}")
        wheel = built[0]
        rootfs = Path(tmp) / "rootfs"
        site = rootfs / SITE_PACKAGES.lstrip("/")
        progress(f"installing {wheel.name}")
        _pip_install([str(wheel)], site, log, f"installing {wheel.name}")
        (entry_points,) = site.glob("devheal-*.dist-info/entry_points.txt")
        bin_dir = rootfs / VENV.lstrip("/") / "bin"
        bin_dir.mkdir(parents=True)
        for name, text in entry_point_scripts(entry_points.read_text(), f"{VENV}/bin/python").items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        progress("byte-compiling devheal")
        _compile(rootfs, [SITE_PACKAGES], log, strict=True)
        progress("writing the devheal layer")
        _write_layer(rootfs, dest)


def _write_layer(rootfs: Path, dest: Path) -> None:
    partial = dest.with_suffix(".partial")
    with partial.open("wb") as out:
        tree_layer(rootfs, out)
    partial.replace(dest)


def _package(packages: list[DebPackage], name: str) -> DebPackage:
    for package in packages:
        if package.name == name:
            return package
    raise ImageError(f"the base packages lack {name}; resolved: {', '.join(p.name for p in packages)}")


def _machine() -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(go_arch(), go_arch())


def _project_version(project: Path) -> str:
    try:
        return str(tomllib.loads((project / "pyproject.toml").read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise ImageError(f"{project / 'pyproject.toml'}: no [project] version ({exc})") from exc


def devheal_image(progress: Progress | None = None) -> ImageArchive:
    """Build (or find) the devheal image archive for the current sources; seconds when nothing changed."""
    say = progress or (lambda message: None)
    project = project_root()
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with toolchain.build_lock(directory):
        log = directory / "build.log"
        if log.is_file() and log.stat().st_size > 2**20:
            log.unlink()  # the log of many builds: start again
        packages = resolve_packages(log, say)
        lock = project / "requirements-runtime.lock"
        base_key = content_key(
            [("recipe", RECIPE.encode()), ("lock", lock.read_bytes())]
            + [(f"deb {p.filename}", p.sha256.encode()) for p in packages]
        )[:16]
        say("hashing the sources")
        source = [(str(path.relative_to(project)), path.read_bytes()) for path in source_files(project)]
        image_key = content_key([("base", base_key.encode()), *source])[:16]
        name = f"{IMAGE_REPOSITORY}:{_project_version(project)}-{image_key[:12]}"
        archive = directory / f"devheal-{image_key}.tar"
        if archive.is_file():
            return ImageArchive(name, archive)
        with log.open("a") as handle:
            handle.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} building {name}\n")
        base = directory / f"base-{base_key}.tar"
        if not base.is_file():
            download(packages, directory / "debs", log, say)
            build_base_layer(packages, directory / "debs", lock, base, log, say)
        app = directory / f"app-{image_key}.tar"
        build_devheal_layer(project, app, log, say)
        say("writing the image archive")
        python_version = upstream_version(_package(packages, "python3.11-minimal").version)
        partial = archive.with_suffix(".partial")
        with partial.open("wb") as out:
            write_oci_archive(out, name, [base, app], image_config(python_version))
        partial.replace(archive)
        # Only the current image and its base stay: every source change would leave ~200 MB otherwise.
        for stale in [*directory.glob("devheal-*.tar"), *directory.glob("base-*.tar"), *directory.glob("app-*.tar")]:
            if stale not in (archive, base):
                stale.unlink()
    return ImageArchive(name, archive)


def main(argv: list[str] | None = None) -> None:
    """Build (or find) the devheal image archive, with plain-text progress on stderr; print its name and path."""
    import argparse

    argparse.ArgumentParser(prog="python -m devheal.lab.devheal_image", description=main.__doc__).parse_args(argv)
    started = time.monotonic()
    try:
        image = devheal_image(lambda message: print(f"[devheal image] {message}", file=sys.stderr, flush=True))
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    size = image.path.stat().st_size / 2**20
    print(f"[devheal image] ready in {time.monotonic() - started:.1f}s ({size:.0f} MiB)", file=sys.stderr)
    print(image.name)
    print(image.path)


if __name__ == "__main__":
    main()
