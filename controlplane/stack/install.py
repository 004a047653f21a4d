"""Install the real engines on first use, from the registries this project may reach.

- etcd and PostgreSQL: Debian's `etcd-server` and `postgresql` packages (apt-get).
- Kafka: jars resolved from Maven Central by `kafka/pom.xml` with `mvn
  dependency:copy-dependencies`, cached under the cache folder.
- Toxiproxy: `go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0` into
  the cache folder.

Everything is cached, so a second `stack up` installs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from controlplane.errors import StackError
from controlplane.logs import get_logger

log = get_logger(__name__)

KAFKA_POM = Path(__file__).parent / "kafka" / "pom.xml"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0"


def _run(what: str, argv: Sequence[str], *, hint: str, env: dict[str, str] | None = None) -> None:
    log.info("installing", what=what, command=" ".join(argv))
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
            env={**os.environ, **(env or {})},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"installing {what} failed ({exc}); {hint}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise StackError(f"installing {what} failed: {' | '.join(tail)}; {hint}")


def _apt_install(packages: Sequence[str]) -> None:
    if shutil.which("apt-get") is None:
        raise StackError(
            f"{' and '.join(packages)} are missing and apt-get is not available; "
            "install them by hand"
        )
    if os.geteuid() != 0:
        raise StackError(
            f"{' and '.join(packages)} are missing; install them with "
            f"`sudo apt-get install {' '.join(packages)}` and run again"
        )
    env_hint = "check that Debian's package mirror is reachable and run `apt-get update`"
    _run("apt package lists", ["apt-get", "update", "-qq"], hint=env_hint)
    _run(
        " ".join(packages),
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        hint=env_hint,
    )


def debian_binary(name: str, package: str) -> Path:
    """`name` on PATH, installing Debian's `package` when it is missing."""
    found = shutil.which(name)
    if found is None:
        _apt_install([package])
        found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} is still missing after installing the {package} package")
    return Path(found)


def etcd_binary() -> Path:
    """The etcd server binary (Debian's etcd-server package)."""
    return debian_binary("etcd", "etcd-server")


def postgres_bin_dir() -> Path:
    """The bin folder of Debian's newest PostgreSQL, installing it when missing."""

    def find() -> Path | None:
        roots = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=_version_key)
        return roots[-1].parent if roots else None

    found = find()
    if found is None:
        _apt_install(["postgresql"])
        found = find()
    if found is None:
        raise StackError("PostgreSQL is still missing after installing the postgresql package")
    return found


def _version_key(path: Path) -> int:
    name = path.parent.parent.name
    return int(name) if name.isdigit() else 0


def kafka_classpath(cache_dir: Path) -> str:
    """The classpath of the Kafka broker, resolving its jars with Maven on first use."""
    if shutil.which("java") is None:
        raise StackError("Kafka needs Java 17 or newer and `java` is not on PATH; install a JDK 17")
    libs = cache_dir / "kafka" / "libs"
    done_marker = libs / ".complete"
    if not done_marker.exists():
        if shutil.which("mvn") is None:
            raise StackError(
                "Kafka's jars are not cached yet and `mvn` is not on PATH; install Maven "
                "(Debian package maven) and run again"
            )
        tmp = libs.with_name("libs.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        _run(
            "Kafka jars from Maven Central",
            [
                "mvn",
                "-q",
                "-B",
                "-f",
                str(KAFKA_POM),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={tmp.resolve()}",
                "-DincludeScope=runtime",
            ],
            hint="check that Maven Central is reachable (a proxy may need ~/.m2/settings.xml)",
        )
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)  # atomic: a half-finished download is never taken for a cache
        done_marker.write_text("ok\n")
    return f"{libs.resolve()}/*"


def toxiproxy_binary(cache_dir: Path) -> Path:
    """The toxiproxy server binary, built with `go install` on first use."""
    gobin = (cache_dir / "bin").resolve()
    binary = gobin / "toxiproxy-server"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise StackError("Toxiproxy is built from source and `go` is not on PATH; install Go 1.22+")
    gobin.mkdir(parents=True, exist_ok=True)
    build_dir = gobin / "build"
    build_dir.mkdir(exist_ok=True)
    _run(
        "Toxiproxy 2.12 with go install",
        ["go", "install", TOXIPROXY_MODULE],
        hint="check that the Go module proxy is reachable (GOPROXY)",
        env={"GOBIN": str(build_dir)},
    )
    (build_dir / "server").rename(binary)
    shutil.rmtree(build_dir, ignore_errors=True)
    return binary
