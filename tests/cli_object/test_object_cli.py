"""`meridian object put | get | ls | rm` as a user runs them: the CLI against a real agent
process, the stack's etcd and a PostgreSQL catalog."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from harness.agent_process import AgentProcess
from harness.cli_schema import check_output
from harness.controllers import ControllerProcess, meridian_argv, run_cli
from waiting import WaitTimeoutError, until

from controlplane.adapters.etcd import EtcdCoordination
from controlplane.coordination.protocols.ownership import Ownership
from controlplane.domain.version import ContentHasher
from controlplane.loopback import free_port

pytestmark = pytest.mark.integration

GIB = 1024**3


def cli(
    agent: AgentProcess,
    *args: str,
    timeout_s: float = 120,
    cwd: Path | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """`meridian ARGS` talking to `agent`, in `cwd`."""
    return subprocess.run(
        [*meridian_argv(), *args],
        cwd=cwd,
        env={**os.environ, **agent.env, "MERIDIAN_AGENT": agent.address, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> object:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def digest_of(path: Path) -> str:
    hasher = ContentHasher()
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * 1024 * 1024):
            hasher.update(chunk)
    return str(hasher.digest())


def disk_bytes(path: Path) -> int:
    """Bytes a file or folder really occupies on disk (holes cost nothing)."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum((Path(d) / f).stat().st_blocks * 512 for d, _, files in os.walk(path) for f in files)


def test_round_trips_of_an_empty_and_a_small_file(agent: AgentProcess, tmp_path: Path) -> None:
    empty, small = tmp_path / "empty.bin", tmp_path / "notes.txt"
    empty.write_bytes(b"")
    small.write_bytes(b"hello, meridian\n" * 100)
    [put_empty] = ok(
        cli(agent, "object", "put", "--dataset", "corpus/rt", str(empty), "-o", "json")
    )
    assert (put_empty["key"], put_empty["size"]) == ("empty.bin", 0)
    [put_small] = ok(
        cli(
            agent, "object", "put", "--dataset", "corpus/rt", str(small), "docs/notes", "-o", "json"
        )
    )
    assert put_small["key"] == "docs/notes" and put_small["digest"] == digest_of(small)

    listed = ok(cli(agent, "object", "ls", "--dataset", "corpus/rt", "--output", "json"))
    check_output("object_ls", listed)
    assert [(r["key"], r["size"], r["regions"]) for r in listed] == [
        ("docs/notes", 1600, ["eu-west"]),
        ("empty.bin", 0, ["eu-west"]),
    ]
    assert {r["version"] for r in listed} == {put_empty["version"], put_small["version"]}
    prefixed = ok(cli(agent, "object", "ls", "--dataset", "corpus/rt", "--prefix", "docs/"))
    assert [r["key"] for r in prefixed] == ["docs/notes"]

    for key, original in (("empty.bin", empty), ("docs/notes", small)):
        out = tmp_path / f"back-{original.name}"
        ok(cli(agent, "object", "get", "--dataset", "corpus/rt", key, str(out), "-o", "json"))
        assert out.read_bytes() == original.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]

    [gone] = ok(cli(agent, "object", "rm", "--dataset", "corpus/rt", "docs/notes", "-o", "json"))
    assert gone["op"] == "delete" and gone["version"] > put_small["version"]
    listed = ok(cli(agent, "object", "ls", "--dataset", "corpus/rt", "-o", "json"))
    assert [r["key"] for r in listed] == ["empty.bin"]
    line = one_error(cli(agent, "object", "get", "--dataset", "corpus/rt", "docs/notes", "x"))
    assert "docs/notes" in line
    assert not (Path.cwd() / "x").exists()


def test_ls_says_so_when_the_catalog_cannot_be_read(agent: AgentProcess, tmp_path: Path) -> None:
    small = tmp_path / "a.txt"
    small.write_bytes(b"a")
    ok(cli(agent, "object", "put", "--dataset", "corpus/nocat", str(small)))
    port = free_port()  # nobody listens there (and it is no outgoing connection's port)
    done = cli(
        agent,
        "object",
        "ls",
        "--dataset",
        "corpus/nocat",
        "-o",
        "json",
        MERIDIAN_CATALOG=f"postgresql+psycopg://meridian@127.0.0.1:{port}/meridian",
    )
    listed = ok(done)
    check_output("object_ls", listed)
    assert [r["regions"] for r in listed] == [["eu-west"]]
    assert "note: the catalog cannot be read (" in done.stderr
    assert "regions show only this agent's region (eu-west)" in done.stderr


def test_a_4_gib_sparse_file_keeps_its_holes_and_its_digest(
    agent: AgentProcess, tmp_path: Path
) -> None:
    big = tmp_path / "sparse.img"
    with open(big, "wb") as fh:
        for at in (0, GIB, 3 * GIB + 12345):
            fh.seek(at)
            fh.write(os.urandom(4096))
        fh.truncate(4 * GIB)
    original = digest_of(big)
    [put] = ok(
        cli(
            agent, "object", "put", "--dataset", "corpus/big", str(big), "-o", "json", timeout_s=600
        )
    )
    assert put["size"] == 4 * GIB and put["digest"] == original
    # The store kept the holes: a few pages of data, not 4 GiB.
    assert disk_bytes(agent.root / "objects") < 64 * 1024 * 1024

    out = tmp_path / "back.img"
    ok(
        cli(
            agent, "object", "get", "--dataset", "corpus/big", "sparse.img", str(out), timeout_s=600
        )
    )
    assert out.stat().st_size == 4 * GIB
    assert disk_bytes(out) < 64 * 1024 * 1024
    assert digest_of(out) == original


def test_a_many_file_set_is_read_back_whole_at_its_versions(
    agent: AgentProcess, tmp_path: Path
) -> None:
    src = tmp_path / "ckpt"
    names = []
    for i in range(120):
        path = src / f"shard-{i // 40}" / f"part-{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1 + i * 37))
        names.append(str(path.relative_to(tmp_path)))
    put = ok(
        cli(
            agent,
            *("object", "put", "--dataset", "corpus/sets", "--set", "step-100", *names),
            *("-o", "json"),
            cwd=tmp_path,
            timeout_s=300,
        )
    )
    assert isinstance(put, list) and sorted(r["key"] for r in put) == sorted(names)
    assert len({r["set"] for r in put}) == 1 and put[0]["set"].startswith("step-100@")

    # A newer version of one member, outside any set, is not what the set holds.
    first = tmp_path / names[0]
    original = first.read_bytes()
    first.write_bytes(b"rewritten after the set")
    ok(cli(agent, "object", "put", "--dataset", "corpus/sets", str(first), names[0]))

    out = tmp_path / "restored"
    got = ok(cli(agent, "object", "get", "--dataset", "corpus/sets", "--set", "latest", str(out)))
    assert isinstance(got, list) and len(got) == len(names)
    first.write_bytes(original)
    for name in names:
        assert (out / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_bad_input_is_refused_with_one_sentence_and_stores_nothing(
    agent: AgentProcess, tmp_path: Path
) -> None:
    a = tmp_path / "a.txt"
    a.write_bytes(b"a")
    line = one_error(cli(agent, "object", "put", "--dataset", "corpus/bad", str(a), "k", str(a)))
    assert "give --set SET" in line
    line = one_error(
        cli(
            agent,
            "object",
            "put",
            "--dataset",
            "corpus/bad",
            "--set",
            "s",
            "a.txt",
            "b.txt",
            cwd=tmp_path,
        )
    )
    assert line == "error: b.txt does not exist; nothing was stored"
    line = one_error(cli(agent, "object", "put", "--dataset", "corpus/bad", str(a), "../up"))
    assert "'..' segment" in line
    line = one_error(cli(agent, "object", "put", "--dataset", "secret/x", str(a)))
    assert "secret/x is governed by no policy" in line
    listed = ok(cli(agent, "object", "ls", "--dataset", "corpus/bad", "-o", "json"))
    assert listed == []

    done = run_cli(["object", "ls", "--dataset", "corpus/bad"], {**agent.env, "MERIDIAN_AGENT": ""})
    assert "pass --agent HOST:PORT or set MERIDIAN_AGENT" in one_error(done)
    port = free_port()  # nobody listens there
    done = cli(agent, "object", "ls", "--dataset", "corpus/bad", "--agent", f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in one_error(done)


async def test_a_critical_put_gets_the_owners_epoch_at_the_owners_agent_only(
    agent: AgentProcess, tmp_path: Path, world: dict[str, str], etcd_endpoint: str
) -> None:
    coord = EtcdCoordination([etcd_endpoint], timeout_s=5)
    await coord.connect()
    try:
        epoch = await Ownership(coord).claim(
            "ckpt/run1", "eu-west", expect_epoch=0, reason="home", actor="test"
        )
    finally:
        await coord.close()
    shard = tmp_path / "shard.bin"
    shard.write_bytes(os.urandom(5000))
    # The replica region's agent: a critical write is acked once both copies are in.
    central = AgentProcess("eu-central", tmp_path / "c", world, tmp_path / "c.log")
    central.start()
    try:
        await _owner_epoch_and_refusals(agent, central, shard, epoch, world)
    finally:
        central.stop()


async def _owner_epoch_and_refusals(
    agent: AgentProcess, central: AgentProcess, shard: Path, epoch: int, world: dict[str, str]
) -> None:
    done = await asyncio.to_thread(
        cli, agent, "object", "put", "--dataset", "ckpt/run1", str(shard), "-o", "json"
    )
    [row] = ok(done)
    assert row["digest"] == digest_of(shard)
    line = one_error(
        await asyncio.to_thread(
            cli,
            agent,
            *("object", "put", "--dataset", "ckpt/run1", str(shard), "--epoch", str(epoch - 1)),
        )
    )
    assert f"epoch {epoch - 1}" in line

    done = await asyncio.to_thread(
        run_cli,
        ["object", "put", "--dataset", "ckpt/run1", str(shard)],
        {**world, "MERIDIAN_AGENT": central.address},
    )
    line = one_error(done)
    assert "eu-west" in line, line


async def test_a_critical_dataset_first_written_after_the_apply_is_announced_and_claimed(
    agent: AgentProcess, tmp_path: Path, world: dict[str, str], etcd_endpoint: str
) -> None:
    """`ckpt/fresh` is placed by the rules but was not listed at apply time: its first
    write is refused (no owner yet) and announces it; eu-west's controller claims it,
    and the same write then goes in (before, it was refused for ever)."""
    shard = tmp_path / "fresh.bin"
    shard.write_bytes(os.urandom(3000))
    put = ["object", "put", "--dataset", "ckpt/fresh", str(shard), "-o", "json"]
    first = await asyncio.to_thread(cli, agent, *put)
    assert first.returncode == 1 and "owner" in first.stderr, first.stderr
    central = AgentProcess("eu-central", tmp_path / "c", world, tmp_path / "c.log")
    central.start()  # the replica: critical writes are acked at both copies
    controller = ControllerProcess(
        "eu-west", world, tmp_path / "ctl.log", lease_ttl_s=3, controller_id="ctl-west"
    ).start()
    try:
        done = first

        async def put_taken() -> bool:
            nonlocal done
            done = await asyncio.to_thread(cli, agent, *put)
            return done.returncode == 0

        with contextlib.suppress(WaitTimeoutError):  # the assertion shows the refusal
            # Polled every 0.5 s: the controller's reconcile interval is 1 s.
            await until(put_taken, 60, "the put to be taken once claimed", step_s=0.5)
        assert done.returncode == 0, done.stderr + controller.log_path.read_text()[-2000:]
        [row] = json.loads(done.stdout)
        assert row["digest"] == digest_of(shard)
    finally:
        controller.stop()
        central.stop()
    coord = EtcdCoordination([etcd_endpoint], timeout_s=5)
    await coord.connect()
    try:
        owner = await Ownership(coord).get("ckpt/fresh")
    finally:
        await coord.close()
    assert owner is not None and owner.region == "eu-west"
