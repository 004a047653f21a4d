"""The OpenTofu modules, offline: fmt, validate, and `tofu test` (mock providers plan and
apply each module and the three-region example) with providers from the local mirror."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from deploy_helpers import DEPLOY, explain, run_tool

from controlplane.stack.tools import Tools

TERRAFORM = DEPLOY / "terraform"
ROOTS = ["modules/etcd", "modules/region", "modules/kafka", "examples/three-regions"]
# The first run on a fresh machine builds OpenTofu and the providers (minutes).
pytestmark = pytest.mark.timeout(3000)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, tools: Tools) -> Path:
    """A copy of deploy/ (init writes .terraform/ and a lock file), each root initialised."""
    copy = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns(".terraform*"))
    for root in ROOTS:
        done = run_tool(
            [tools.tofu, "init", "-backend=false", "-input=false", "-no-color"],
            cwd=copy / "terraform" / root,
            env=tools.env(),
        )
        assert done.returncode == 0, f"{root}: {explain(done)}"
    return copy


def test_fmt(tools: Tools) -> None:
    done = run_tool(
        [tools.tofu, "fmt", "-check", "-recursive", "-diff", "-no-color", TERRAFORM],
        env=tools.env(),
    )
    assert done.returncode == 0, explain(done)


@pytest.mark.parametrize("root", ROOTS)
def test_validate(tools: Tools, workdir: Path, root: str) -> None:
    done = run_tool(
        [tools.tofu, "validate", "-no-color"], cwd=workdir / "terraform" / root, env=tools.env()
    )
    assert done.returncode == 0, f"{root}: {explain(done)}"
    assert "Success" in done.stdout


@pytest.mark.parametrize("root", ROOTS)
def test_tofu_test(tools: Tools, workdir: Path, root: str) -> None:
    folder = workdir / "terraform" / root
    files = sorted((folder / "tests").glob("*.tftest.hcl"))
    runs = sum(path.read_text().count('\nrun "') for path in files)
    assert runs, f"{root} has no tofu tests"
    done = run_tool([tools.tofu, "test", "-no-color"], cwd=folder, env=tools.env())
    assert done.returncode == 0, f"{root}: {explain(done)}"
    assert f"{runs} passed, 0 failed" in done.stdout, explain(done)


def test_providers_come_from_the_mirror_only(tools: Tools) -> None:
    text = tools.cli_config.read_text()
    assert "filesystem_mirror" in text
    assert "direct" not in text, "a direct installation would reach for a registry"
