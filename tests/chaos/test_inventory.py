"""The residency inventory against a real agent store (in-process, no daemon)."""

from __future__ import annotations

import io
import os
from pathlib import Path

from agents.store.store import ObjectStore
from chaos.checkers import residency
from chaos.inventory import DATASET_XATTR, inventory_root
from controlplane.domain.hlc import HybridClock


def test_stored_files_are_attributed_and_strays_are_not(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    with ObjectStore(root, clock=HybridClock("us-east")) as store:
        store.put("corpus/web", "shard-0", io.BytesIO(b"allowed in the US"))
        store.put("ckpt/llama", "step-1", io.BytesIO(b"EU only"))
        store.put_small("ckpt/llama", "step-0", b"EU only, kept in meta.db")  # no file
        staged = store.stage("ckpt/llama", "step-2")  # a write in progress
        staged.write(b"partial")
        inv = inventory_root(root, "us-east")
        staged.abort()
    by_kind = {(c.kind, c.dataset) for c in inv}
    assert ("object", "corpus/web") in by_kind
    assert ("object", "ckpt/llama") in by_kind
    assert ("tmp", None) in by_kind  # a temporary file names no dataset
    verdict = residency.check(
        inv, {"corpus/web": {"EU", "US"}, "ckpt/llama": {"EU"}}, {"us-east": "US"}
    )
    assert not verdict.held
    assert any("ckpt/llama/step-1 in us-east" in o for o in verdict.offending)
    assert any("ckpt/llama/step-0 in us-east" in o for o in verdict.offending)
    (inline,) = [c for c in inv if c.key == "step-0"]
    assert (inline.kind, inline.where.split("#")[0]) == ("object", "meta.db")
    assert any("unattributed tmp" in o for o in verdict.offending)


def test_an_extended_attribute_attributes_a_stray_file(tmp_path: Path) -> None:
    stray = tmp_path / "tmp" / "x.part"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"?")
    try:
        os.setxattr(stray, DATASET_XATTR, b"corpus/web")
    except OSError:
        # The file system has no user xattrs: the stray stays unattributed.
        assert inventory_root(tmp_path, "eu-west")[0].dataset is None
        return
    [copy] = inventory_root(tmp_path, "eu-west")
    assert (copy.kind, copy.dataset) == ("tmp", "corpus/web")
