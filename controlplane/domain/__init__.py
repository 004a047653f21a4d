"""The types every Meridian component shares: placement, HLC, versions, wire contracts.

This package depends on nothing else of ours except the exception tree
(`controlplane.errors`, itself a leaf), so agents, the replicator, the catalog and
the controllers can all import it without pulling each other in. Its modules are
imported one by one (`from controlplane.domain.hlc import HLC`); this file imports
none of them, so that a command importing one type pays for no other.
"""
