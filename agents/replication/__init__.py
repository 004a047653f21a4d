"""Synchronous replication of critical writes (issue 13): the owner's push of each
committed write to its replica regions, acked once the policy's `ack` copies hold it."""

from agents.replication.peers import EtcdPeers, Peers
from agents.replication.sync import SyncReplication, copies_needed

__all__ = ["EtcdPeers", "Peers", "SyncReplication", "copies_needed"]
