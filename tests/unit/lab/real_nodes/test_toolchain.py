"""The real nodes' binaries: pinned, in a cache of their own, built only when asked for."""

from __future__ import annotations

from devheal.lab import toolchain, versions


def test_real_node_binaries_have_their_own_cache_directory() -> None:
    assert versions.node_cache_key() != versions.cache_key()
    assert toolchain.NODE.root != toolchain.CONTROL_PLANE.root
    for pinned in (versions.KUBERNETES, versions.CONTAINERD, versions.RUNC, versions.CNI_PLUGINS):
        assert pinned in versions.node_cache_key()


def test_every_real_node_binary_comes_from_a_pinned_target_or_the_pause_source() -> None:
    built = {name for target in toolchain._node_targets() for name in target.outputs}
    assert built | {"pause"} == set(toolchain.NODE_BINARIES)
    assert not built & set(toolchain.BINARIES)


def test_only_runc_is_a_cgo_build_with_seccomp() -> None:
    cgo = [target for target in toolchain._node_targets() if target.cgo]
    assert [target.name for target in cgo] == ["runc"]
    assert "seccomp" in cgo[0].tags


def test_the_control_plane_build_never_includes_a_real_node_binary() -> None:
    control_plane = {name for target in toolchain._targets() for name in target.outputs}
    assert control_plane == set(toolchain.BINARIES)
