"""`agents.records.journal.plan` of a `version` record, the commonest one: its facts, and
one clear error for a malformed record (which the recorder then sets aside alone)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agents.records.journal import plan
from agents.store.model import JournalEntry
from controlplane.errors import InvalidInputError

HLC_TEXT = "1796000000123.00007@us-east"
DIGEST = "blake3:" + "ab" * 32


def _entry(**data: Any) -> JournalEntry:
    fields: dict[str, Any] = {"op": "put", "size": 5, "digest": DIGEST, "set": None}
    fields.update(data)
    return JournalEntry(41, "version", "corpus/web", "k", HLC_TEXT, 1_796_000_000_999, fields)


def _no_lookup(dataset: str, key: str, hlc: str) -> None:
    raise AssertionError("a version record needs no lookup")


def test_a_version_record_becomes_its_version_and_this_regions_holding() -> None:
    facts = plan("eu-west", _entry(set="s1"), _no_lookup)
    [held] = facts.versions
    assert (held.dataset, held.key, held.version, held.op, held.size, held.digest) == (
        "corpus/web",
        "k",
        HLC_TEXT,
        "put",
        5,
        DIGEST,
    )
    assert (held.origin_region, held.set_id) == ("us-east", "s1")
    assert held.created_at == datetime.fromtimestamp(1_796_000_000.123, UTC)
    [holding] = facts.holdings
    assert (holding.version, holding.region, holding.state, holding.digest) == (
        HLC_TEXT,
        "eu-west",
        "completed",
        DIGEST,
    )
    assert holding.at == datetime.fromtimestamp(1_796_000_000.999, UTC)
    tomb = plan("eu-west", _entry(op="delete", size=0, digest=None), _no_lookup)
    assert (tomb.versions[0].op, tomb.versions[0].digest, tomb.holdings[0].digest) == (
        "delete",
        "",
        None,
    )


@pytest.mark.parametrize(
    ("data", "hlc", "said"),
    [
        ({"op": "move"}, HLC_TEXT, "op"),
        ({"size": "5"}, HLC_TEXT, "size"),
        ({"size": -1}, HLC_TEXT, "size"),
        ({"size": True}, HLC_TEXT, "size"),
        ({"digest": 7}, HLC_TEXT, "digest"),
        ({"op": "delete", "size": 5, "digest": None}, HLC_TEXT, "tombstone"),
        ({"op": "delete", "size": 0, "digest": ""}, HLC_TEXT, "digest"),
        ({"op": "delete", "size": 0, "digest": DIGEST}, HLC_TEXT, "tombstone"),
        ({}, "1796000000123@us-east", "HLC"),
    ],
)
def test_a_malformed_version_record_gets_one_error_naming_it(
    data: dict[str, Any], hlc: str, said: str
) -> None:
    entry = _entry(**data)
    entry = JournalEntry(
        entry.seq, entry.kind, entry.dataset, entry.key, hlc, entry.at_ms, entry.data
    )
    with pytest.raises(InvalidInputError, match=r"journal record 41 \(version\)") as caught:
        plan("eu-west", entry, _no_lookup)
    assert said in str(caught.value)
