"""The chaos suite's private stack, once per test session (reused if already up).

Its ports are the stack's plus `chaos.stack.PORT_OFFSET`; `meridian chaos run`
in the tests finds it up, uses it and leaves it to this fixture to stop.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chaos.stack import PrivateStack
from controlplane.settings import load_settings


@pytest.fixture(scope="session")
def private_stack() -> Iterator[PrivateStack]:
    stack = PrivateStack(load_settings(check_endpoints=False))
    stack.up()
    yield stack
    stack.down()
