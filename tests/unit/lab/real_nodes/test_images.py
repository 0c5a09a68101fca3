"""The lab's OCI image archives: reproducible, and a valid image layout that names its image."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

from devheal.lab.images import Entry, go_arch, layer_tar, oci_archive

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
