"""The devheal image's pure parts: Debian's package closure, apt's answers read, the wheel tags for the
packages' glibc, the entry point script, the Dockerfile's settings, and the content key."""

from __future__ import annotations

from pathlib import Path

import pytest

from devheal.lab.devheal_image import (
    EXCLUDED_PACKAGES,
    ImageError,
    closure,
    content_key,
    entry_point_scripts,
    image_config,
    manylinux_platforms,
    parse_depends,
    parse_print_uris,
    source_files,
    upstream_version,
)

DEPENDS = """\
python3.11-minimal
  PreDepends: libc6
  Depends: libpython3.11-minimal
  Depends: zlib1g
readline-common
 |Depends: dpkg
  Depends: install-info
tzdata
 |Depends: debconf
  Depends: <debconf-2.0>
    cdebconf
    debconf
libc6
  Depends: libgcc-s1:any
"""


def test_apt_cache_depends_is_read_as_groups_of_alternatives_with_virtual_packages_resolved() -> None:
    parsed = parse_depends(DEPENDS)
    assert parsed["python3.11-minimal"] == [["libc6"], ["libpython3.11-minimal"], ["zlib1g"]]
    assert parsed["readline-common"] == [["dpkg", "install-info"]]
    assert parsed["tzdata"] == [["debconf", "cdebconf", "debconf"]]
    assert parsed["libc6"] == [["libgcc-s1"]]


def test_the_closure_takes_each_groups_first_alternative_not_excluded() -> None:
    graph = {
        "root": [["a"], ["b"], ["x", "y"]],
        "a": [["shared"]],
        "x": [["shared"]],
        "y": [["z"]],
        "shared": [],
        "b": [],
        "z": [],
    }
    asked: list[list[str]] = []

    def depends(batch: list[str]) -> dict[str, list[list[str]]]:
        asked.append(batch)
        return {name: graph[name] for name in batch}

    assert closure(["root"], depends) == ["a", "b", "root", "shared", "x"]
    assert all(len(set(batch)) == len(batch) for batch in asked)
    assert sum(len(batch) for batch in asked) == 5  # each package asked about once
    assert closure(["root"], depends, excluded={"x"}) == ["a", "b", "root", "shared", "y", "z"]


def test_a_group_whose_alternatives_are_all_excluded_is_dropped() -> None:
    graph = {**parse_depends(DEPENDS), "dpkg": [], "install-info": []}
    found = closure(["readline-common"], lambda batch: {n: graph[n] for n in batch}, EXCLUDED_PACKAGES)
    assert found == ["readline-common"]


def test_a_package_apt_does_not_know_is_an_error_naming_it() -> None:
    with pytest.raises(ImageError, match=r"python3\.11-minimal is unknown to apt"):
        closure(["python3.11-minimal"], lambda batch: {})


def test_print_uris_gives_each_files_name_version_size_and_hash_without_the_uri() -> None:
    text = (
        "'http://mirror.invalid/debian/pool/main/g/glibc/libc6_2.36-9%2bdeb12u14_amd64.deb' "
        "libc6_2.36-9+deb12u14_amd64.deb 2759320 SHA256:ba4f88\n"
        "'http://mirror.invalid/x/e_1%3a2.0-1_amd64.deb' e_1%3a2.0-1_amd64.deb 10 SHA256:00ff\n"
        "W: a warning\n"
    )
    (epoch, libc) = parse_print_uris(text)
    assert (libc.name, libc.version, libc.filename, libc.size, libc.sha256) == (
        "libc6",
        "2.36-9+deb12u14",
        "libc6_2.36-9+deb12u14_amd64.deb",
        2759320,
        "ba4f88",
    )
    assert epoch.version == "1:2.0-1"
    assert "mirror" not in repr(libc)


def test_upstream_versions_drop_the_epoch_and_debian_revision() -> None:
    assert upstream_version("3.11.2-6+deb12u9") == "3.11.2"
    assert upstream_version("2.36-9+deb12u14") == "2.36"
    assert upstream_version("1:2.0-1-2") == "2.0-1"


def test_wheels_for_a_glibc_are_every_manylinux_tag_up_to_it() -> None:
    tags = manylinux_platforms("2.36", "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_37_x86_64" not in tags
    assert "manylinux2014_x86_64" not in manylinux_platforms("2.12", "x86_64")
    with pytest.raises(ImageError, match=r"glibc 3\.0"):
        manylinux_platforms("3.0", "x86_64")


def test_the_entry_point_script_runs_the_console_script_with_the_images_python() -> None:
    scripts = entry_point_scripts("[console_scripts]\ndevheal = devheal.cli.app:main\n", "/opt/devheal/bin/python")
    assert scripts == {
        "devheal": "#!/opt/devheal/bin/python\nimport sys\nfrom devheal.cli.app import main\n\n"
        'if __name__ == "__main__":\n    sys.exit(main())\n'
    }
    assert entry_point_scripts("[other]\nx = y:z\n", "/py") == {}


def test_the_image_has_the_dockerfiles_runtime_settings() -> None:
    config = image_config("3.11.2")
    assert config["Entrypoint"] == ["devheal"] and config["Cmd"] == ["--help"]
    assert config["User"] == "65532:65532" and config["WorkingDir"] == "/tmp"
    env = dict(str(item).split("=", 1) for item in config["Env"])  # type: ignore[attr-defined]
    assert env["PATH"].startswith("/opt/devheal/bin:")
    assert (env["PYTHONDONTWRITEBYTECODE"], env["PYTHONUNBUFFERED"], env["HOME"]) == ("1", "1", "/tmp")


def test_the_source_files_leave_out_byte_code_and_the_generated_grpc_modules(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "hatch_build.py", "README.md"):
        (tmp_path / name).write_text(name)
    package = tmp_path / "src/devheal/kubelet/podresources"
    (package / "__pycache__").mkdir(parents=True)
    (package / ".codegen-x").mkdir()
    for name in ("api.proto", "client.py", "api_pb2.py", "api_pb2_grpc.pyi", "__pycache__/client.cpython-311.pyc"):
        (package / name).write_text(name)
    (package / ".codegen-x/api_pb2.py").write_text("partial")
    relative = [str(p.relative_to(tmp_path)) for p in source_files(tmp_path)]
    assert relative == [
        "pyproject.toml",
        "hatch_build.py",
        "README.md",
        "src/devheal/kubelet/podresources/api.proto",
        "src/devheal/kubelet/podresources/client.py",
    ]


def test_the_content_key_changes_with_any_name_or_byte_and_cannot_be_shifted() -> None:
    key = content_key([("a", b"1"), ("b", b"2")])
    assert key == content_key([("a", b"1"), ("b", b"2")])
    assert key != content_key([("a", b"1"), ("b", b"3")])
    assert key != content_key([("a", b"1"), ("c", b"2")])
    assert content_key([("a", b"12")]) != content_key([("a", b"1"), ("2", b"")])
