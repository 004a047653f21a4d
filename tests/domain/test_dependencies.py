"""The domain package depends on nothing else of ours (ARCHITECTURE.md), except the
exception tree, itself a leaf; and importing it loads no heavy dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import controlplane.domain

DOMAIN = Path(controlplane.domain.__file__).parent
ALLOWED = ("controlplane.domain", "controlplane.errors")
OURS = ("controlplane", "agents", "replicator", "chaos", "native", "migrations")


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
    return found


def test_domain_imports_only_itself_and_the_error_tree() -> None:
    modules = sorted(DOMAIN.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        for name in imported_modules(path):
            if name.split(".")[0] in OURS:
                assert name.startswith(ALLOWED), f"{path.name} imports {name}"
    leaf = imported_modules(Path(controlplane.domain.__file__).parent.parent / "errors.py")
    assert not {n for n in leaf if n.split(".")[0] in OURS}


def test_importing_the_types_loads_neither_blake3_nor_protobuf_nor_sqlalchemy() -> None:
    code = (
        "import sys\n"
        "import controlplane.domain.placement, controlplane.domain.hlc, "
        "controlplane.domain.version\n"
        "print(sorted(m for m in ('blake3', 'google.protobuf', 'sqlalchemy', 'grpc', "
        "'pydantic') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
