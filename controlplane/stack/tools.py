"""Install the tools that check the deployment modules (deploy/), cached like the engines.

The tools come only from the registries this project may reach, so most are built from
the Go module proxy (the recipe is issue 15's, found to work here):

- OpenTofu v1.12.6: `go install` refuses it (its go.mod has replace directives), so its
  module is fetched with `go mod download -json`, copied somewhere writable, and built
  there with `go build ./cmd/tofu`.
- the providers `hashicorp/kubernetes` v1.13.4 and `hashicorp/helm` v1.3.2: the proxy
  serves only these old releases (newer tags lack the `/vN` module suffix); each builds
  from a copy of its module once `vbom.ml/util`, whose host is out of reach, is replaced
  by a folder holding only a go.mod (nothing the binaries link comes from it). They land
  in a filesystem mirror laid out as OpenTofu expects, named by a CLI configuration
  (`TF_CLI_CONFIG_FILE`) that installs from that mirror only, so no registry is asked.
- helm v3.22.0: plain `go install`.
- promtool: Debian's `prometheus` package.
- checkov: from PyPI, into a virtualenv of its own under the cache (it pins many
  libraries that the project's own environment must not be held to).

Every tool is built into a temporary folder and renamed into place when complete, under
a file lock, so an interrupted or concurrent build is never taken for a cached one; a
second run costs a stat per tool. `ensure_all` builds the missing ones in parallel.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import StackError
from controlplane.logs import get_logger
from controlplane.stack.install import debian_binary

log = get_logger(__name__)

TOFU_MODULE = "github.com/opentofu/opentofu"
TOFU_VERSION = "1.12.6"
HELM_MODULE = "helm.sh/helm/v3/cmd/helm"
HELM_VERSION = "3.22.0"
CHECKOV_VERSION = "3.3.30"
# name -> (Go module, version); the versions CI tests (docs/deploy.md says so too).
PROVIDERS: dict[str, tuple[str, str]] = {
    "kubernetes": ("github.com/hashicorp/terraform-provider-kubernetes", "1.13.4"),
    "helm": ("github.com/hashicorp/terraform-provider-helm", "1.3.2"),
}
PROVIDER_HOST = "registry.opentofu.org"
PROVIDER_NAMESPACE = "hashicorp"
PLATFORM = "linux_amd64"
# Long enough for a cold OpenTofu build on a loaded 2-core machine, short enough that a
# hung download ends the run with a message rather than CI's own limit.
BUILD_TIMEOUT_S = 2400
GO_HINT = "check that the Go module proxy is reachable (GOPROXY) and that `go` is 1.22+"


@dataclass(frozen=True)
class Tools:
    """Paths of the installed tools; `env()` is what a subprocess of tofu needs."""

    tofu: Path
    helm: Path
    promtool: Path
    checkov: Path
    cli_config: Path

    def env(self) -> dict[str, str]:
        """The environment for `tofu`: the offline CLI configuration, no telemetry."""
        return {
            **os.environ,
            "TF_CLI_CONFIG_FILE": str(self.cli_config),
            "TF_IN_AUTOMATION": "1",
            "CHECKPOINT_DISABLE": "1",
        }


def tools_dir(cache_dir: Path) -> Path:
    return (cache_dir / "tools").resolve()


def _run(
    what: str,
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    hint: str = GO_HINT,
) -> str:
    log.info("building tool", what=what, command=" ".join(argv))
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=BUILD_TIMEOUT_S,
            env={**os.environ, **(env or {})},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"building {what} failed ({exc}); {hint}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-4:]
        raise StackError(f"building {what} failed: {' | '.join(tail)}; {hint}")
    return done.stdout


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Locks and scratch folders live beside the tools, never in the provider mirror,
    # where OpenTofu would take any `terraform-provider-*` file for a provider.
    locks = _work_dir(path) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{path.parent.name}-{path.name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_once(binary: Path, build: Callable[[Path], None]) -> Path:
    """`build(tmp_binary)` under a lock unless `binary` exists; renamed in when complete."""
    if binary.exists():
        return binary
    with _locked(binary):
        if binary.exists():  # another process built it while we waited
            return binary
        binary.parent.mkdir(parents=True, exist_ok=True)
        scratch_root = _work_dir(binary) / "scratch"
        scratch_root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{binary.name}-", dir=scratch_root))
        try:
            build(scratch / binary.name)
            (scratch / binary.name).rename(binary)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return binary


def _work_dir(path: Path) -> Path:
    """The tools folder that holds `path` (the parent of its `tools` component)."""
    for folder in path.parents:
        if folder.name == "tools":
            return folder / ".work"
    return path.parent / ".work"


def _need_go(what: str) -> str:
    go = shutil.which("go")
    if go is None:
        raise StackError(f"{what} is built from source and `go` is not on PATH; install Go 1.22+")
    return go


def _module_copy(module: str, version: str, into: Path) -> Path:
    """A writable copy of a module's source from the Go module proxy."""
    go = _need_go(module)
    out = _run(
        f"{module}@v{version} download", [go, "mod", "download", "-json", f"{module}@v{version}"]
    )
    try:
        source = Path(json.loads(out)["Dir"])
    except (ValueError, KeyError) as exc:
        raise StackError(f"`go mod download` of {module} printed no module folder") from exc
    copy = into / "src"
    shutil.copytree(source, copy, symlinks=True)
    # The module cache is read-only; go build writes go.mod/go.sum edits here.
    for folder, _dirs, files in os.walk(copy):
        os.chmod(folder, 0o700)
        for name in files:
            file = Path(folder) / name
            file.chmod(file.stat().st_mode | stat.S_IWUSR)
    return copy


def tofu_binary(cache_dir: Path) -> Path:
    """OpenTofu, built from its module's source on first use."""
    binary = tools_dir(cache_dir) / f"tofu-{TOFU_VERSION}" / "tofu"

    def build(out: Path) -> None:
        source = _module_copy(TOFU_MODULE, TOFU_VERSION, out.parent)
        _run(
            f"OpenTofu v{TOFU_VERSION}",
            [_need_go("OpenTofu"), "build", "-o", str(out), "./cmd/tofu"],
            cwd=source,
            env={"CGO_ENABLED": "0"},
        )

    return _build_once(binary, build)


def helm_binary(cache_dir: Path) -> Path:
    """helm, built with `go install` on first use."""
    binary = tools_dir(cache_dir) / f"helm-{HELM_VERSION}" / "helm"

    def build(out: Path) -> None:
        _run(
            f"helm v{HELM_VERSION}",
            [_need_go("helm"), "install", f"{HELM_MODULE}@v{HELM_VERSION}"],
            env={"GOBIN": str(out.parent), "CGO_ENABLED": "0"},
        )

    return _build_once(binary, build)


def provider_mirror(cache_dir: Path) -> Path:
    """The filesystem mirror root, building every provider in PROVIDERS into it."""
    root = tools_dir(cache_dir) / "providers"
    for name in PROVIDERS:
        provider_binary(cache_dir, name)
    return root


def provider_binary(cache_dir: Path, name: str) -> Path:
    module, version = PROVIDERS[name]
    folder = (
        tools_dir(cache_dir)
        / "providers"
        / PROVIDER_HOST
        / PROVIDER_NAMESPACE
        / name
        / version
        / PLATFORM
    )
    binary = folder / f"terraform-provider-{name}_v{version}"

    def build(out: Path) -> None:
        source = _module_copy(module, version, out.parent)
        stub = out.parent / "vbom-util"
        stub.mkdir()
        (stub / "go.mod").write_text("module vbom.ml/util\n")
        go = _need_go(f"the {name} provider")
        _run(
            f"{name} provider replace",
            [go, "mod", "edit", f"-replace=vbom.ml/util={stub}"],
            cwd=source,
        )
        _run(
            f"the {name} provider v{version}",
            [go, "build", "-mod=mod", "-o", str(out), "."],
            cwd=source,
            env={"CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"},
        )

    return _build_once(binary, build)


def cli_config(cache_dir: Path) -> Path:
    """A CLI configuration that installs providers from the mirror only (never a registry)."""
    mirror = tools_dir(cache_dir) / "providers"
    path = tools_dir(cache_dir) / "tofu-offline.tfrc"
    text = (
        "# Written by controlplane/stack/tools.py: providers come from the local mirror only.\n"
        "provider_installation {\n"
        "  filesystem_mirror {\n"
        f'    path    = "{mirror}"\n'
        f'    include = ["{PROVIDER_HOST}/{PROVIDER_NAMESPACE}/*"]\n'
        "  }\n"
        "}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        # Per process: the background build of scripts/test.sh and a test may both write it.
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.rename(path)
    return path


def promtool_binary() -> Path:
    """promtool (Debian's prometheus package)."""
    return debian_binary("promtool", "prometheus")


def prometheus_binary() -> Path:
    """The Prometheus server (same Debian package as promtool), for the demo."""
    promtool_binary()
    found = shutil.which("prometheus")
    if found is None:
        raise StackError("prometheus is missing although its Debian package is installed")
    return Path(found)


def checkov_binary(cache_dir: Path) -> Path:
    """checkov from PyPI, in a virtualenv of its own under the cache."""
    venv = tools_dir(cache_dir) / f"checkov-{CHECKOV_VERSION}"
    binary = venv / "bin" / "checkov"
    if binary.exists():
        return binary
    with _locked(venv):
        if binary.exists():
            return binary
        hint = "check that PyPI is reachable (pip's index settings)"
        # A venv's scripts name their interpreter by path, so it is built where it stays
        # and marked complete by its `checkov` script appearing last (pip writes it last).
        _run("checkov's virtualenv", [sys.executable, "-m", "venv", str(venv)], hint=hint)
        _run(
            f"checkov {CHECKOV_VERSION}",
            [str(venv / "bin" / "pip"), "install", "-q", f"checkov=={CHECKOV_VERSION}"],
            hint=hint,
        )
    if not binary.exists():
        raise StackError(f"checkov is missing from {venv} after installing it")
    return binary


def ensure_all(cache_dir: Path) -> Tools:
    """Every tool, building the missing ones in parallel (a warm call takes milliseconds)."""
    # Go builds share the two cores; checkov is mostly a download, so all five go at once.
    with ThreadPoolExecutor(max_workers=5) as pool:
        tofu = pool.submit(tofu_binary, cache_dir)
        helm = pool.submit(helm_binary, cache_dir)
        providers = [pool.submit(provider_binary, cache_dir, name) for name in PROVIDERS]
        checkov = pool.submit(checkov_binary, cache_dir)
        promtool = promtool_binary()
        for future in providers:
            future.result()
        return Tools(
            tofu=tofu.result(),
            helm=helm.result(),
            promtool=promtool,
            checkov=checkov.result(),
            cli_config=cli_config(cache_dir),
        )


def main() -> None:
    """`python -m controlplane.stack.tools`: install everything, print where it is."""
    from controlplane.settings import load_settings

    found = ensure_all(load_settings(check_endpoints=False).cache_dir)
    for name in ("tofu", "helm", "promtool", "checkov", "cli_config"):
        sys.stdout.write(f"{name}\t{getattr(found, name)}\n")


if __name__ == "__main__":
    main()
