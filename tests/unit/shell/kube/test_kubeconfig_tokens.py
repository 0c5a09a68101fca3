"""Which file a kubeconfig's bearer token comes from (``tokenFile``), as kubectl merges kubeconfigs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devheal.kube import tokens


def test_the_kubeconfig_users_token_file_is_found_relative_to_its_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "current-context: c\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "users: [{name: other, user: {tokenFile: /nope}}, {name: u, user: {token: inline, tokenFile: tok}}]\n"
    )
    assert tokens.kubeconfig_token_file([config]) == tmp_path / "tok"


def test_merged_kubeconfigs_take_the_first_value_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = tmp_path / "first"
    first.write_text("current-context: c\n")
    second = tmp_path / "second"
    second.write_text(
        "current-context: ignored\n"
        "contexts: [{name: c, context: {user: u}}]\n"
        f"users: [{{name: u, user: {{tokenFile: {tmp_path / 'abs'}}}}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    assert tokens.kubeconfig_paths(None) == [first, second]
    assert tokens.kubeconfig_token_file(tokens.kubeconfig_paths(None)) == tmp_path / "abs"


def test_a_user_without_a_token_file_has_none(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("current-context: c\ncontexts: [{name: c, context: {user: u}}]\nusers: [{name: u, user: {}}]\n")
    assert tokens.kubeconfig_token_file([config]) is None
    assert tokens.kubeconfig_token_file([tmp_path / "missing"]) is None
