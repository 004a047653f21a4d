"""etcd on loopback: one member or a cluster of three, each with its own data and log.

Member i listens for clients on `client_port + 10*i` and for peers on
`peer_port + 10*i`. The health check is a real put and get through etcd's
JSON gateway. Tests use `EtcdMember.kill/pause/resume` to lose a member or the
leader.
"""

from __future__ import annotations

import base64
import os
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from controlplane.errors import StackError
from controlplane.stack import install
from controlplane.stack.model import ServiceStatus
from controlplane.stack.process import ManagedProcess, require_free_ports, wait_healthy


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def put_and_get(client_url: str, timeout_s: float = 2.0) -> None:
    """Write a unique key and read it back; raise if either fails."""
    key, value = "/meridian/stack/health", uuid.uuid4().hex
    with httpx.Client(timeout=timeout_s) as http:
        http.post(f"{client_url}/v3/kv/put", json={"key": _b64(key), "value": _b64(value)})
        got = http.post(f"{client_url}/v3/kv/range", json={"key": _b64(key)})
        got.raise_for_status()
        kvs = got.json().get("kvs", [])
    if not kvs or base64.b64decode(kvs[0]["value"]).decode() != value:
        raise StackError(f"etcd at {client_url} did not return the value just written")


@dataclass
class EtcdMember:
    name: str
    run_dir: Path
    client_port: int
    peer_port: int
    argv: list[str] = field(default_factory=list)

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def process(self) -> ManagedProcess:
        return ManagedProcess(
            name=f"etcd member {self.name}",
            pid_file=self.run_dir / f"{self.name}.pid",
            log_file=self.run_dir / f"{self.name}.log",
            marker=str(self.run_dir / self.name) + ".data",
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid()

    def start(self) -> None:
        if self.pid is not None:
            return
        require_free_ports(f"etcd member {self.name}", [self.client_port, self.peer_port])
        self.process.start(self.argv, env={"ETCD_UNSUPPORTED_ARCH": ""})

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        pid = self.pid
        if pid is not None:
            os.kill(pid, sig)


@dataclass
class EtcdCluster:
    members: list[EtcdMember]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def leader_index(self, timeout_s: float = 2.0) -> int | None:
        """Index of the member that is leader now, or None if none answers."""
        for index, member in enumerate(self.members):
            try:
                with httpx.Client(timeout=timeout_s) as http:
                    status = http.post(f"{member.client_url}/v3/maintenance/status", json={})
                    body = status.json()
            except httpx.HTTPError:
                continue
            if body.get("leader") and body.get("header", {}).get("member_id") == body["leader"]:
                return index
        return None

    def wait_healthy(self, timeout_s: float) -> None:
        for member in self.members:
            wait_healthy(
                f"etcd member {member.name}",
                member.process,
                lambda m=member: put_and_get(m.client_url),  # type: ignore[misc]
                timeout_s,
            )

    def stop(self) -> None:
        for member in self.members:
            member.stop()


def plan_etcd_cluster(
    run_dir: Path,
    members: int = 1,
    client_port: int = 2379,
    peer_port: int = 2380,
    heartbeat_ms: int | None = None,
    election_ms: int | None = None,
    cluster_name: str = "meridian",
) -> EtcdCluster:
    """Describe (without starting) a cluster whose members live under `run_dir`."""
    if members not in (1, 3, 5):
        raise StackError(f"etcd members must be 1, 3 or 5, not {members}")
    binary = install.etcd_binary()
    run_dir = run_dir.resolve()
    names = [f"{cluster_name}-{i}" for i in range(members)]
    initial = ",".join(
        f"{name}=http://127.0.0.1:{peer_port + 10 * i}" for i, name in enumerate(names)
    )
    result: list[EtcdMember] = []
    for i, name in enumerate(names):
        member = EtcdMember(name, run_dir, client_port + 10 * i, peer_port + 10 * i)
        data_dir = run_dir / f"{name}.data"
        member.argv = [
            str(binary),
            f"--name={name}",
            f"--data-dir={data_dir}",
            f"--listen-client-urls=http://127.0.0.1:{member.client_port}",
            f"--advertise-client-urls=http://127.0.0.1:{member.client_port}",
            f"--listen-peer-urls=http://127.0.0.1:{member.peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{member.peer_port}",
            f"--initial-cluster={initial}",
            f"--initial-cluster-token={cluster_name}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if heartbeat_ms is not None:
            member.argv.append(f"--heartbeat-interval={heartbeat_ms}")
        if election_ms is not None:
            member.argv.append(f"--election-timeout={election_ms}")
        result.append(member)
    return EtcdCluster(result)


SIZE_FILE = "cluster-size"


def _recorded_size(base_dir: Path, cluster_name: str) -> int | None:
    """How many members the data under `base_dir` was created with (None: no data yet)."""
    try:
        return int((base_dir / SIZE_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    found = len(list(base_dir.glob(f"{cluster_name}-*.data")))
    return found or None


def _recorded_peer_port(base_dir: Path) -> int | None:
    """The first member's peer port the data was created with (None: not recorded)."""
    try:
        fields = (base_dir / SIZE_FILE).read_text().split()
        return int(fields[1]) if len(fields) > 1 else None
    except (OSError, ValueError):
        return None


def start_etcd_cluster(
    base_dir: Path,
    members: int = 1,
    client_port: int = 2379,
    peer_port: int = 2380,
    heartbeat_ms: int | None = None,
    election_ms: int | None = None,
    timeout_s: float = 30.0,
    cluster_name: str = "meridian",
) -> EtcdCluster:
    """Start (or find running) a cluster and wait until every member serves a put and a get.

    etcd ignores its --initial-cluster flags once a member has data, so restarting old
    data with another member count would leave members in different clusters, each
    healthy on its own (a split brain). That is refused, and a multi-member cluster is
    only called up when every member reports the same cluster and all the members.
    """
    recorded = _recorded_size(base_dir, cluster_name)
    if recorded is not None and recorded != members:
        raise StackError(
            f"the etcd data in {base_dir} holds a {recorded}-member cluster; start it with "
            f"{recorded} member(s), or delete that folder to begin afresh with {members}"
        )
    recorded_port = _recorded_peer_port(base_dir) if recorded is not None else None
    if members > 1 and recorded_port is not None and recorded_port != peer_port:
        # The members' data names their peers' old addresses, which etcd keeps over
        # --initial-cluster: started on new ports they would never find each other.
        raise StackError(
            f"the etcd data in {base_dir} was created with peer port {recorded_port}; start "
            f"it with that port, or delete that folder to begin afresh on {peer_port}"
        )
    cluster = plan_etcd_cluster(
        base_dir, members, client_port, peer_port, heartbeat_ms, election_ms, cluster_name
    )
    base_dir.mkdir(parents=True, exist_ok=True)
    (base_dir / SIZE_FILE).write_text(f"{members} {peer_port}\n")
    try:
        for member in cluster.members:
            member.start()
        cluster.wait_healthy(timeout_s)
        if members > 1:
            _check_one_cluster(cluster)
    except BaseException:  # Ctrl-C and SIGTERM too: never leave half a cluster running
        cluster.stop()
        raise
    return cluster


def _check_one_cluster(cluster: EtcdCluster) -> None:
    seen: set[tuple[str, int]] = set()
    with httpx.Client(timeout=2.0) as http:
        for member in cluster.members:
            body = http.post(f"{member.client_url}/v3/cluster/member/list", json={}).json()
            seen.add((str(body["header"]["cluster_id"]), len(body.get("members", []))))
    if len(seen) != 1 or next(iter(seen))[1] != len(cluster.members):
        raise StackError(
            f"etcd members {', '.join(cluster.endpoints)} do not form one cluster of "
            f"{len(cluster.members)} (they report {sorted(seen)}); delete their data and retry"
        )


class EtcdService:
    """The stack's etcd: `members` members from the stack's client port upward."""

    name = "etcd"

    def __init__(self, run_dir: Path, members: int, client_port: int, timeout_s: float) -> None:
        self.run_dir = run_dir / "etcd"
        self.members = members
        self.client_port = client_port
        self.timeout_s = timeout_s

    def cluster(self) -> EtcdCluster:
        return plan_etcd_cluster(self.run_dir, self.members, self.client_port, self.client_port + 1)

    def install(self) -> None:
        install.etcd_binary()

    def start(self) -> bool:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        running = sorted(p.stem for p in self.run_dir.glob("*.pid") if _alive_pidfile(p))
        wanted = sorted(m.name for m in self.cluster().members)
        if running and running != wanted:
            raise StackError(
                f"etcd is already running with {len(running)} member(s); run "
                "`meridian stack down` before changing --etcd-members"
            )
        if running == wanted:
            self.cluster().wait_healthy(self.timeout_s)
            return False
        start_etcd_cluster(
            self.run_dir,
            self.members,
            self.client_port,
            self.client_port + 1,
            timeout_s=self.timeout_s,
        )
        return True

    def status(self) -> list[ServiceStatus]:
        cluster = self.cluster()
        rows = []
        for member in cluster.members:
            pid = member.pid
            if (
                pid is None
                and not member.process.pid_file.exists()
                and member is not cluster.members[0]
            ):
                continue  # a member of a larger cluster that this stack never started
            rows.append(
                ServiceStatus(
                    service="etcd" if len(cluster.members) == 1 else f"etcd/{member.name}",
                    state="up" if pid is not None else "down",
                    endpoint=member.endpoint,
                    pid=pid,
                    log=str(member.process.log_file),
                )
            )
        return rows

    def stop(self) -> bool:
        stopped = False
        for pid_file in self.run_dir.glob("*.pid"):
            proc = ManagedProcess(
                name=f"etcd member {pid_file.stem}",
                pid_file=pid_file,
                log_file=pid_file.with_suffix(".log"),
                marker=str(self.run_dir.resolve() / pid_file.stem) + ".data",
            )
            stopped = proc.stop() or stopped
        return stopped


def _alive_pidfile(pid_file: Path) -> bool:
    proc = ManagedProcess(
        name=pid_file.stem,
        pid_file=pid_file,
        log_file=pid_file.with_suffix(".log"),
        marker=str(pid_file.parent.resolve() / pid_file.stem) + ".data",
    )
    return proc.pid() is not None
