"""The JSON shapes of spec/cli-output.schema.json, to check real `--output json` against.

The spec lives in shared/ beside the repository (as CI lays it out too).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA = Path(__file__).resolve().parents[3] / "shared" / "spec" / "cli-output.schema.json"


@cache
def _defs() -> dict[str, Any]:
    return dict(json.loads(SCHEMA.read_text(encoding="utf-8"))["$defs"])


def check_output(definition: str, document: object) -> None:
    """Raise `jsonschema.ValidationError` unless `document` has the shape `definition`."""
    jsonschema.validate(document, _defs()[definition], format_checker=jsonschema.FormatChecker())
