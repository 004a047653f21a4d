"""Hand-made histories for the checker tests: a tiny builder with explicit times."""

from __future__ import annotations

from chaos.history import Event, EventType, Operation, pair


class Builder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def op(
        self,
        f: str,
        dataset: str,
        key: str,
        outcome: EventType | None,
        *,
        op_id: str | None = None,
        region: str = "eu-west",
        t: int | None = None,
        sent: dict[str, object] | None = None,
        seen: dict[str, object] | None = None,
    ) -> str:
        oid = op_id or f"op{len(self.events)}"
        start = t if t is not None else len(self.events) * 10
        common = (oid, region, dataset, key)
        self.events.append(Event(len(self.events), start, "c/0", "invoke", f, *common, sent or {}))
        if outcome is not None:
            n = len(self.events)
            self.events.append(Event(n, start + 5, "c/0", outcome, f, *common, seen or {}))
        return oid

    def write(self, key: str, version: str, outcome: EventType | None = "ok", **kw: object) -> str:
        digest = str(kw.pop("digest", f"d-{version}"))
        return self.op(
            "write",
            "ds",
            key,
            outcome,
            sent={"digest": digest},
            seen={"version": version} if outcome in ("ok", "info", None) else {},
            **kw,  # type: ignore[arg-type]
        )

    def ops(self) -> list[Operation]:
        return pair(self.events)
