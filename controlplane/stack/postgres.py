"""PostgreSQL from Debian's packages, on loopback, with its own cluster under the run folder.

PostgreSQL refuses to run as root; when we are root the cluster is owned by and
run as the `postgres` user (through `setpriv`, which execs, so the pid we record
is the postmaster's own).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import psycopg

from controlplane.errors import StackError
from controlplane.settings import Settings
from controlplane.stack import install
from controlplane.stack.single import SingleProcessService

DB_USER = "meridian"
DB_NAME = "meridian"


def postgres_url(port: int, database: str = DB_NAME) -> str:
    return f"postgresql+psycopg://{DB_USER}@127.0.0.1:{port}/{database}"


class PostgresService(SingleProcessService):
    name = "postgres"
    stop_timeout_s = 30.0

    def __init__(self, settings: Settings, run_dir: Path) -> None:
        super().__init__(settings, run_dir)
        self.data_dir = self.run_dir / "data"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def port(self) -> int:
        return self.settings.stack_postgres_port

    @property
    def url(self) -> str:
        return postgres_url(self.port)

    def install(self) -> None:
        install.postgres_bin_dir()

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", *argv]

    def _prepare(self, bin_dir: Path) -> None:
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise StackError(
                    "running as root needs the `postgres` user of Debian's package"
                ) from exc
            os.chown(self.run_dir, owner.pw_uid, owner.pw_gid)
            if not _traversable_by(self.run_dir, owner.pw_uid):
                raise StackError(
                    f"the postgres user cannot reach {self.run_dir}; put MERIDIAN_HOME in a "
                    "folder that other users may traverse"
                )
        if (self.data_dir / "PG_VERSION").exists():
            return
        shutil.rmtree(self.data_dir, ignore_errors=True)
        done = subprocess.run(
            self._as_owner(
                [
                    str(bin_dir / "initdb"),
                    f"--pgdata={self.data_dir}",
                    f"--username={DB_USER}",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ]
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise StackError(
                f"initdb of PostgreSQL in {self.data_dir} failed: "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}"
            )

    def health(self) -> None:
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=DB_USER,
            dbname="postgres",
            connect_timeout=2,
            autocommit=True,
        ) as conn:
            conn.execute("SELECT 1").fetchone()
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)
            ).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{DB_NAME}"')

    def ports(self) -> list[int]:
        return [self.port]

    def prepare(self) -> list[str]:
        bin_dir = install.postgres_bin_dir()
        self._prepare(bin_dir)
        return self._as_owner(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-k",
                str(self.data_dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=256MB",
            ]
        )


def _traversable_by(path: Path, uid: int) -> bool:
    for parent in [path, *path.parents]:
        try:
            st = parent.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            continue
        if not st.st_mode & 0o001:
            return False
    return True
