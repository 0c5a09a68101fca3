"""The lab's OCI image archives: reproducible, and a valid image layout that names its image."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from devheal.lab.images import Entry, go_arch, layer_tar, oci_archive, tree_layer, write_oci_archive

ENTRIES = [Entry("bin"), Entry("bin/tool", 0o755, b"\x7fELF..."), Entry("bin/sh", 0o777, link="tool")]


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_same_content_gives_the_same_archive_and_digest() -> None:
    first = oci_archive("devheal.local/lab/x:1", ENTRIES, {"Cmd": ["/bin/sh"]})
    again = oci_archive("devheal.local/lab/x:1", list(reversed(ENTRIES)), {"Cmd": ["/bin/sh"]})
    assert first == again
    changed = oci_archive("devheal.local/lab/x:1", [*ENTRIES, Entry("etc")], {"Cmd": ["/bin/sh"]})
    assert changed[0] != first[0]


def test_the_archive_is_an_image_layout_whose_blobs_match_their_digests() -> None:
    digest, archive = oci_archive("devheal.local/lab/x:1", ENTRIES, {"Cmd": ["/bin/sh"]})
    files = _members(archive)
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "devheal.local/lab/x:1"
    assert entry["platform"] == {"architecture": go_arch(), "os": "linux"}
    manifest = json.loads(files[f"blobs/sha256/{digest[7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    (layer,) = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    assert config["config"] == {"Cmd": ["/bin/sh"]}


def test_a_layer_holds_files_links_and_directories_owned_by_root_at_time_zero() -> None:
    with tarfile.open(fileobj=io.BytesIO(layer_tar(ENTRIES))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin"].isdir()
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "tool"
    assert members["bin/tool"].isfile() and members["bin/tool"].mode == 0o755
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}


def test_a_tree_layer_keeps_modes_and_links_and_is_the_same_for_the_same_tree(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3.11").write_bytes(b"\x7fELF")
    (tmp_path / "usr/bin/python3.11").chmod(0o755)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp").chmod(0o1777)
    (tmp_path / "usr/bin/python").symlink_to("python3.11")
    first, again = io.BytesIO(), io.BytesIO()
    tree_layer(tmp_path, first)
    os.utime(tmp_path / "usr/bin/python3.11", (1, 1))  # times are not kept
    tree_layer(tmp_path, again)
    assert first.getvalue() == again.getvalue()
    with tarfile.open(fileobj=io.BytesIO(first.getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members) == ["tmp", "usr", "usr/bin", "usr/bin/python", "usr/bin/python3.11"]
    assert members["tmp"].mode == 0o1777 and members["usr/bin/python3.11"].mode == 0o755
    assert members["usr/bin/python"].issym() and members["usr/bin/python"].linkname == "python3.11"
    assert {(m.uid, m.gid, m.mtime) for m in members.values()} == {(0, 0, 0)}


def test_an_archive_of_layer_files_lists_them_bottom_first_in_manifest_and_config(tmp_path: Path) -> None:
    base, top = tmp_path / "base.tar", tmp_path / "top.tar"
    base.write_bytes(layer_tar([Entry("bin")]))
    top.write_bytes(layer_tar([Entry("bin/tool", 0o755, b"x")]))
    out = io.BytesIO()
    digest = write_oci_archive(out, "devheal.local/lab/x:2", [base, top], {"User": "65532:65532"})
    files = _members(out.getvalue())
    manifest = json.loads(files[f"blobs/sha256/{digest[7:]}"])
    layers = [layer["digest"] for layer in manifest["layers"]]
    assert layers == ["sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() for path in (base, top)]
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["rootfs"]["diff_ids"] == layers and len(config["history"]) == 2
    assert files[f"blobs/sha256/{layers[1][7:]}"] == top.read_bytes()
