"""The SQL examples of docs/audit.md run on both databases."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import text

from controlplane.catalog.api import open_catalog

DOC = Path(__file__).parents[2] / "docs" / "audit.md"


def statements() -> list[str]:
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), re.S)
    found = [re.sub(r"^--.*$", "", s, flags=re.M).strip() for b in blocks for s in b.split(";")]
    return [s for s in found if s]


def test_docs_sql_runs(catalog_url: str) -> None:
    sql = statements()
    assert len(sql) >= 5
    pg = catalog_url.startswith("postgresql")
    cat = open_catalog(catalog_url)
    ran = 0
    try:
        with cat.engine.connect() as conn:
            for statement in sql:
                if ("interval" in statement and not pg) or ("datetime('now'" in statement and pg):
                    continue  # the doc gives one form per database
                conn.execute(text(statement)).all()
                ran += 1
    finally:
        cat.close()
    assert ran == len(sql) - 1
