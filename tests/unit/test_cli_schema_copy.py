"""The repository's copy of spec/cli-output.schema.json is the contract's, and a schema."""

from __future__ import annotations

import json

import jsonschema
from harness.cli_schema import CONTRACT, COPY


def test_the_copy_is_a_valid_schema_and_the_contract_where_that_is_at_hand() -> None:
    copy = json.loads(COPY.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(copy)
    assert {"policy_validate", "runbook_dry_run", "history"} <= set(copy["$defs"])
    if CONTRACT.is_file():  # the workspace's shared/spec: the copy must not drift from it
        assert copy == json.loads(CONTRACT.read_text(encoding="utf-8"))
