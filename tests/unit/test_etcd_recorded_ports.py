"""etcd data made on other peer ports is refused with one sentence, before anything
starts: its members would look for each other at their old addresses for ever (a
chaos stack left from a run on other ports never became healthy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.errors import StackError
from controlplane.stack.etcd import SIZE_FILE, start_etcd_cluster


def test_data_from_other_peer_ports_is_refused(tmp_path: Path) -> None:
    (tmp_path / SIZE_FILE).write_text("3 5001\n")
    with pytest.raises(StackError, match="created with peer port 5001; start it with that port"):
        start_etcd_cluster(tmp_path, members=3, client_port=6000, peer_port=6001)
    assert not list(tmp_path.glob("*.pid"))  # nothing was started
    assert (tmp_path / SIZE_FILE).read_text() == "3 5001\n"  # nor the record changed


def test_the_old_record_without_ports_still_reads_its_size(tmp_path: Path) -> None:
    (tmp_path / SIZE_FILE).write_text("1\n")
    with pytest.raises(StackError, match="holds a 1-member cluster"):
        start_etcd_cluster(tmp_path, members=3, client_port=6000, peer_port=6001)
