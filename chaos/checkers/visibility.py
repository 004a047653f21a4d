"""No partial visibility: every read saw a whole version that was written.

A single-object read (`f == "read"`, completion `ok` with `digest`, or
`absent: true`) must return the digest of a write of that object (`ok` or `info`;
a `fail` write never took effect). A set read (`f == "read_set"`, completion
`members`: key -> digest) must equal the members of one committed set
(`f == "commit_set"`, `ok` or `info`, invoke `members`), never a mix of two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from chaos.checkers.verdict import Verdict
from chaos.history import Operation

NAME = "no-partial-visibility"


def _members(value: object) -> frozenset[tuple[str, str]] | None:
    if not isinstance(value, Mapping):
        return None
    return frozenset((str(k), str(v)) for k, v in value.items())


def check(operations: Iterable[Operation]) -> Verdict:
    ops = list(operations)
    digests: dict[tuple[str, str], set[str]] = {}
    sets: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for op in ops:
        if op.outcome not in ("ok", "info"):
            continue
        if op.f == "write" and isinstance(op.invoke.value.get("digest"), str):
            key = (op.invoke.dataset, op.invoke.key)
            digests.setdefault(key, set()).add(str(op.invoke.value["digest"]))
        elif op.f == "commit_set":
            members = _members(op.invoke.value.get("members"))
            if members is not None:
                sets.setdefault(op.invoke.dataset, set()).add(members)
    problems: list[str] = []
    reads = 0
    for op in ops:
        if op.outcome != "ok" or op.f not in ("read", "read_set"):
            continue
        reads += 1
        if op.f == "read":
            if op.seen("absent") is True:
                continue
            digest = op.seen("digest")
            if digest not in digests.get((op.invoke.dataset, op.invoke.key), set()):
                problems.append(f"{op.describe()}: digest {digest} matches no written version")
        else:
            seen = _members(op.seen("members"))
            if seen is not None and not seen:
                continue  # no set visible yet
            if seen is None or seen not in sets.get(op.invoke.dataset, set()):
                problems.append(f"{op.describe()}: not the members of any committed set")
    return Verdict.of(NAME, problems, f"{reads} reads, each a whole written version")
