"""`dataset evict --output csv`: one header and a row per object that stays (the eviction
itself faked; it runs for real in tests/critical/test_evict.py)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from typer.testing import CliRunner

from controlplane.coordination.orchestration.evict import Eviction, Kept


class _NoEtcd:
    def __init__(self, *_: Any, **__: Any) -> None: ...

    async def __aenter__(self) -> _NoEtcd:
        return self

    async def __aexit__(self, *_: object) -> None: ...


@pytest.mark.parametrize("dry_run", [True, False])
def test_evict_as_csv_lists_what_stays(monkeypatch: pytest.MonkeyPatch, dry_run: bool) -> None:
    import controlplane.adapters.etcd
    import controlplane.coordination.orchestration.evict as evict_module
    from controlplane.cli.main import app

    stays = [Kept("a.bin", "v1", "only copy"), Kept("b.bin", "v2", "set s1 unproven")]

    async def fake(_coord: object, _agent: object, name: str, region: str, **kw: Any) -> Eviction:
        done = Eviction(name, region, [], [], stays if dry_run else [], kw["dry_run"])
        if not dry_run:
            done.remaining = stays
        return done

    monkeypatch.setattr(controlplane.adapters.etcd, "EtcdCoordination", _NoEtcd)
    monkeypatch.setattr(evict_module, "evict_dataset", fake)
    flags = ["--dry-run"] if dry_run else ["--yes"]
    done = CliRunner().invoke(
        app,
        ["--etcd", "127.0.0.1:1", "dataset", "evict", "ds", "--region", "r1", "-o", "csv", *flags],
    )
    assert done.exit_code == 3, done.output
    rows = list(csv.reader(io.StringIO(done.stdout)))
    assert rows == [
        ["object", "version", "why"],
        ["a.bin", "v1", "only copy"],
        ["b.bin", "v2", "set s1 unproven"],
    ]
