"""Fixtures of the deployment tests: the tools, from the cached installer.

A tool that is missing is installed or built (controlplane/stack/tools.py; the first run
on a fresh machine takes minutes, later ones milliseconds). One that cannot be had fails
the tests with the installer's sentence: nothing here is ever skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.settings import load_settings
from controlplane.stack import tools as tool_install


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return load_settings(check_endpoints=False).cache_dir


@pytest.fixture(scope="session")
def promtool() -> Path:
    return tool_install.promtool_binary()


@pytest.fixture(scope="session")
def tools(cache_dir: Path) -> tool_install.Tools:
    # Every tool at once: a cold machine builds them in parallel, whichever test asks first.
    return tool_install.ensure_all(cache_dir)


@pytest.fixture(scope="session")
def helm(tools: tool_install.Tools) -> Path:
    return tools.helm


@pytest.fixture(scope="session")
def checkov(tools: tool_install.Tools) -> Path:
    return tools.checkov
