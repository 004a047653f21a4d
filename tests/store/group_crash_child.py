"""Child process of the group commit crash tests: 16 threads write small objects with
group commit on, and the process SIGKILLs itself in the middle of a group of several
writes (test scaffolding, run as a script).

    python group_crash_child.py ROOT STEP OUT

Steps: `in-commit` (inside the group's SQLite transaction, its rows written, before
COMMIT) and `after-commit` (the group committed, before any of its writers returns).
The first group's leader is held until the other writers queue behind it, so the
second group holds several writes, and a later leader likewise until two more wait;
the process dies in the second group of more than one write.

OUT/acked lists, one per line, each key whose `put` returned (fsynced before the next
write); OUT/doomed the keys of the group the process died in.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from agents.store import files, rows
from agents.store.store import ObjectStore, _Entry, stripe_of
from controlplane.domain.hlc import HybridClock

WRITERS = 16
PUTS_EACH = 6


def content(key: str) -> bytes:
    return (key.encode() + b"|") * 50


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(root: str, step: str, out: str) -> None:
    out_dir = Path(out)
    acked = open(out_dir / "acked", "a")  # noqa: SIM115 - written until the kill
    acked_lock = threading.Lock()
    multi = 0
    count_lock = threading.Lock()

    def doomed(keys: Sequence[str]) -> None:
        path = out_dir / "doomed"
        path.write_text("".join(f"{k}\n" for k in keys))
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    def last_multi() -> bool:
        nonlocal multi
        with count_lock:
            multi += 1
            return multi == 2

    real_journal_many = rows.journal_many
    real_commit_group = ObjectStore._commit_group

    def journal_many(conn: object, entries: list[rows.JournalRow]) -> None:
        real_journal_many(conn, entries)  # type: ignore[arg-type]
        if step == "in-commit" and len(entries) >= 2 and last_multi():
            doomed([str(e[2]) for e in entries if e[0] == "version"])
            die()

    def commit_group(self: ObjectStore, entries: Sequence[_Entry]) -> list[object]:
        outcome = real_commit_group(self, entries)
        if step == "after-commit" and len(entries) >= 2 and last_multi():
            doomed([e.key for e in entries])
            die()
        return outcome  # type: ignore[return-value]

    rows.journal_many = journal_many
    ObjectStore._commit_group = commit_group  # type: ignore[assignment,method-assign]
    store = ObjectStore(root, clock=HybridClock("eu-west"))

    real_fsync_dir = files.fsync_dir
    hold, held, go = threading.Event(), threading.Event(), threading.Event()

    def fsync_dir(path: Path) -> None:
        if path.parent.name == "objects" and hold.is_set():  # a leader's fan-out folder
            hold.clear()
            held.set()
            go.wait(30)
        real_fsync_dir(path)

    def hold_a_leader(queued: int) -> None:
        """Hold the next leader at its folder fsync until `queued` writes wait behind it:
        the group after it has that many."""
        held.clear()
        go.clear()
        hold.set()
        held.wait(30)
        deadline = time.monotonic() + 30
        while store.group_queued() < queued and time.monotonic() < deadline:
            time.sleep(0.001)
        go.set()

    files.fsync_dir = fsync_dir

    def writer(n: int) -> None:
        for i in range(PUTS_EACH):
            key = f"w{n}-{i}"
            store.put("ds", key, [content(key)], outbox=True)
            with acked_lock:
                acked.write(key + "\n")
                acked.flush()
                os.fsync(acked.fileno())

    # The first writes of all writers queue behind the held leader only if no two
    # share an object lock stripe (a CRC of the name: the same in every run).
    firsts = {stripe_of("ds", f"w{n}-0") for n in range(WRITERS)}
    if len(firsts) != WRITERS:
        raise SystemExit("two first keys share a lock stripe; pick other keys")
    hold.set()
    first = threading.Thread(target=writer, args=(0,))
    first.start()
    held.wait(30)
    others = [threading.Thread(target=writer, args=(n,)) for n in range(1, WRITERS)]
    for t in others:
        t.start()
    deadline = time.monotonic() + 30
    while store.group_queued() < WRITERS - 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    go.set()  # the second group holds the other 15 first writes
    deadline = time.monotonic() + 30
    while store.group_stats().groups < 3 and time.monotonic() < deadline:
        time.sleep(0.001)  # the second group committed: its 15 writers are writing again
    hold_a_leader(2)  # a later group holds 2 or more: the process dies in it at the latest
    for t in [first, *others]:
        t.join(60)
    die()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
