"""The tool installer's caching: a build lands whole or not at all, and leaves nothing
in the provider mirror but the provider (OpenTofu takes any terraform-provider-* file
there for one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.errors import StackError
from controlplane.stack import tools


def mirror_binary(cache: Path) -> Path:
    folder = tools.tools_dir(cache) / "providers" / "registry.opentofu.org" / "hashicorp"
    return folder / "helm" / "1.3.2" / "linux_amd64" / "terraform-provider-helm_v1.3.2"


def test_a_failed_build_leaves_no_binary_and_no_scratch(tmp_path: Path) -> None:
    binary = mirror_binary(tmp_path)

    def build(out: Path) -> None:
        out.write_text("half a binary")
        raise StackError("the build broke")

    with pytest.raises(StackError, match="the build broke"):
        tools._build_once(binary, build)
    assert not binary.exists()
    assert list(binary.parent.iterdir()) == []
    assert list((tools.tools_dir(tmp_path) / ".work" / "scratch").iterdir()) == []


def test_a_build_lands_alone_in_the_mirror_and_is_not_redone(tmp_path: Path) -> None:
    binary = mirror_binary(tmp_path)
    calls: list[Path] = []

    def build(out: Path) -> None:
        calls.append(out)
        out.write_text("provider")

    assert tools._build_once(binary, build) == binary
    assert tools._build_once(binary, build) == binary
    assert len(calls) == 1
    assert [p.name for p in binary.parent.iterdir()] == [binary.name]


def test_cli_config_names_only_the_mirror(tmp_path: Path) -> None:
    path = tools.cli_config(tmp_path)
    text = path.read_text()
    assert f'path    = "{tools.tools_dir(tmp_path) / "providers"}"' in text
    assert "direct" not in text
    assert tools.cli_config(tmp_path).read_text() == text
