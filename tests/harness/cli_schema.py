"""The JSON shapes of spec/cli-output.schema.json, to check real `--output json` against.

The contract lives in the project workspace's shared/spec/, beside the repository.
A clone on its own (as CI may make) has no such folder, so the repository keeps a
copy in tests/data/; where both exist, a test insists they are the same.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

CONTRACT = Path(__file__).resolve().parents[3] / "shared" / "spec" / "cli-output.schema.json"
COPY = Path(__file__).resolve().parents[1] / "data" / "cli-output.schema.json"
SCHEMA = CONTRACT if CONTRACT.is_file() else COPY


@cache
def _defs() -> dict[str, Any]:
    return dict(json.loads(SCHEMA.read_text(encoding="utf-8"))["$defs"])


def check_output(definition: str, document: object) -> None:
    """Raise `jsonschema.ValidationError` unless `document` has the shape `definition`
    (validated within the whole schema: a definition may `$ref` another one, as
    `audit_failovers` does `history`)."""
    if definition not in _defs():
        raise KeyError(f"the contract has no definition {definition!r}")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": _defs(),
        "$ref": f"#/$defs/{definition}",
    }
    jsonschema.validate(document, schema, format_checker=jsonschema.FormatChecker())
