"""docs/runbooks.md's "A switchover under write load, checked end to end", run as a
newcomer would run it: its own shell blocks, in order, in a fresh folder, against the
local stack (issue 13's "Done when").

Only two things are changed, both to keep the run short: the writer writes
`WRITES` objects instead of 40, and the switchover starts once `AFTER` writes were
acknowledged instead of after `sleep 20`. Everything else (the policy file, the
agents and controllers it starts, the writer, the switchover, the check) is the
guide's text, so a guide that drifts from the CLI fails here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness.agent_fixtures import clear_keyspace
from harness.children import popen
from waiting import WaitTimeoutError, until_sync

from controlplane.settings import Settings

pytestmark = pytest.mark.integration

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"
SECTION = "## A switchover under write load, checked end to end"
# The guide's agents listen on 7101-7103: below the window tests take ports from
# (controlplane/loopback.py), so only a leftover of an earlier run could hold them.
WRITES = 16
AFTER = 4  # acknowledged writes before the switchover starts
RUN_S = 420  # the whole exercise, bounded
DONE = "the guide ran to its end"


def guide_blocks() -> list[tuple[str, str]]:
    """The fenced blocks of the section, in order: (language, text)."""
    text = GUIDE.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)


def one(blocks: list[tuple[str, str]], marker: str) -> str:
    found = [body for _, body in blocks if marker in body]
    assert len(found) == 1, f"the guide has {len(found)} blocks with {marker!r}, not one"
    return found[0]


def saved(name: str, body: str) -> str:
    """The shell that saves `body` as the file `name` (as the reader does by hand)."""
    return f"cat > {name} <<'GUIDE_EOF'\n{body}GUIDE_EOF\n"


def exercise(blocks: list[tuple[str, str]]) -> str:
    setup = one(blocks, "meridian stack up")
    policy = next(body for lang, body in blocks if lang == "yaml")
    start = one(blocks, "meridian agent serve")
    load = one(blocks, "for i in $(seq -w 1 40)")
    run = one(blocks, "bash load.sh")
    verify = one(blocks, "LOST:")
    after = one(blocks, "meridian history")
    assert "sleep 20\n" in run, "the guide no longer waits 20 s before its switchover"
    # Bounded: at most 60 s for the first AFTER acks (the writer retries a refusal).
    until_acked = (
        f'for _ in $(seq 600); do [ "$( (wc -l < acked.csv) 2>/dev/null || echo 0)" -ge {AFTER} ]'
        " && break; sleep 0.1; done\n"
    )
    # As the reader does before writing: `dataset show` until the owner is eu-west
    # (its controller claimed it), bounded.
    owned = (
        'for _ in $(seq 120); do [ "$(meridian dataset show ckpt/guide --output json'
        ' | python3 -c \'import json, sys; print(json.load(sys.stdin)["owner"])\')"'
        " = eu-west ] && break; sleep 0.5; done\n"
    )
    return "".join(
        [
            "set -eu\n",  # a step that fails ends the exercise, and the test with it
            setup,
            saved("policy.yaml", policy),
            start,
            owned,
            saved("load.sh", load.replace("seq -w 1 40", f"seq -w 1 {WRITES}")),
            run.replace("sleep 20\n", until_acked),
            saved("verify.sh", verify),
            "bash verify.sh\n",
            after,
            f"echo {DONE}\n",
        ]
    )


def alive_in_group(group: int) -> bool:
    """Whether a process of `group` is still running (a zombie left to a container's
    init, which may never reap it, is not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                return True
    return False


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the guide's shell and what it left running (agents, controllers): SIGTERM
    to its process group, then SIGKILL to whatever is still there after 30 s."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
        try:
            until_sync(
                lambda: not alive_in_group(proc.pid), wait_s, f"the guide's group after {sig.name}"
            )
            return
        except WaitTimeoutError:
            if sig is signal.SIGKILL:
                raise


def test_the_guides_switchover_under_load_loses_no_acknowledged_write(
    tmp_path: Path, etcd_endpoint: str, stack_settings: Settings
) -> None:
    assert etcd_endpoint == "127.0.0.1:2379", "the guide exports the stack's default etcd"
    clear_keyspace(etcd_endpoint)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MERIDIAN_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # The reader's `meridian stack up` finds the stack running (where its pid files are).
    env["MERIDIAN_HOME"] = str(stack_settings.home.resolve())
    script = tmp_path / "guide.sh"
    script.write_text(exercise(guide_blocks()))
    log = tmp_path / "guide.out"
    # A session of its own: the agents and controllers the guide starts in the
    # background are in its process group, and all of it is killed at the end.
    with log.open("wb") as out:
        proc = popen(
            ["bash", str(script)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,  # nothing may wait for an answer
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=RUN_S)
        except subprocess.TimeoutExpired:
            code = None  # the output below says where it stood
        finally:
            stop_group(proc)
            clear_keyspace(etcd_endpoint)
    printed = log.read_text()
    where = f"(the guide's output: {shlex.quote(str(log))})\n{printed[-6000:]}"
    assert code == 0 and DONE in printed, where
    assert f"acked: {WRITES}, refused and retried:" in printed, where
    # Nothing acknowledged was lost, read from the new owner byte for byte.
    assert f"owner eu-central: {WRITES} acknowledged writes checked, 0 lost" in printed, where
    assert "LOST:" not in printed, where
    # The acks' HLCs go from the old owner to the new one.
    acked = (tmp_path / "guide" / "acked.csv").read_text().splitlines()
    assert len(acked) == WRITES, where
    assert any("@eu-west" in row for row in acked), acked
    assert any("@eu-central" in row for row in acked), acked
    # The journal: the move, its reason, and no acknowledged version left behind.
    journal = subprocess.run(
        ["meridian", "history", "--output", "json"],
        env={**env, "MERIDIAN_CATALOG": f"sqlite:///{tmp_path / 'guide' / 'catalog.db'}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    moves = [m for m in json.loads(journal.stdout) if m["reason"] == "switchover under load"]
    assert [(m["kind"], m["from"], m["to"], m["rpo_versions"]) for m in moves] == [
        ("switchover", "eu-west", "eu-central", 0)
    ], journal.stdout
    # Its details as journaled: the epoch it ended, below the one it began.
    assert 0 < moves[0]["details"]["epoch_before"] < moves[0]["epoch"], journal.stdout
