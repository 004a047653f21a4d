"""Configure structlog for a command only if the command loads Meridian's logging.

Importing structlog costs more than the whole of `meridian --version` may take
(about 0.1 s: it pulls in asyncio and rich's traceback machinery), and most quick
commands (`delta`, `policy validate`) never log. Every logger of Meridian comes
from `controlplane.logs`, so configuring logging when that module is first imported
is as good as configuring it up front: no log line can be written before. If it is
already imported (in tests, say), logging is configured at once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import importlib.abc
    import importlib.machinery

LOGS_MODULE = "controlplane.logs"


def configure_logging_on_use(level: str) -> None:
    """Have `controlplane.logs.configure_logging(level)` run before anything can log."""
    for finder in [f for f in sys.meta_path if isinstance(f, _ConfigureOnImport)]:
        sys.meta_path.remove(finder)  # a previous run() in this process armed one
    logs = sys.modules.get(LOGS_MODULE)
    if logs is not None:
        logs.configure_logging(level)
        return
    sys.meta_path.insert(0, _ConfigureOnImport(level))


class _ConfigureOnImport:
    """A one-shot finder: finds `controlplane.logs` as usual, then configures it once loaded.

    Duck-typed, not an importlib.abc subclass: importing importlib.abc costs ~15 ms."""

    def __init__(self, level: str) -> None:
        self.level = level

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != LOGS_MODULE:
            return None
        with contextlib.suppress(ValueError):  # before searching, so it does not find us
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = cast("importlib.abc.Loader", _ConfiguringLoader(spec.loader, self.level))
        return spec


class _ConfiguringLoader:
    """The usual loader of the module, and a call to `configure_logging` once it ran."""

    def __init__(self, inner: importlib.abc.Loader, level: str) -> None:
        self.inner = inner
        self.level = level

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        module.configure_logging(self.level)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package... as the usual loader answers them.
        return getattr(self.inner, name)
