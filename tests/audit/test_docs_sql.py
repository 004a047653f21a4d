"""The SQL examples of docs/audit.md run on both databases."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import text

DOC = Path(__file__).parents[2] / "docs" / "audit.md"


def statements() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    found = [re.sub(r"^--.*$", "", s, flags=re.M).strip() for b in blocks for s in b.split(";")]
    return [s for s in found if s]


def test_docs_sql_runs(catalog_url: str, sql: Any) -> None:
    found = statements()
    assert len(found) >= 5
    pg = catalog_url.startswith("postgresql")
    ran = 0
    with sql(catalog_url) as conn:
        for statement in found:
            if ("interval" in statement and not pg) or ("datetime('now'" in statement and pg):
                continue  # the doc gives one form per database
            conn.execute(text(statement)).all()
            ran += 1
    assert ran == len(found) - 1
