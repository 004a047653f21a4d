"""The types every Meridian component shares: placement, HLC, versions, wire contracts.

This package depends on nothing else of ours except the exception tree
(`controlplane.errors`, itself a leaf), so agents, the replicator, the catalog and
the controllers can all import it without pulling each other in. Its modules are
imported one by one (`from controlplane.domain.hlc import HLC`); this file imports
none of them, so that a command importing one type pays for no other.

- `placement`: `Placement`, where a dataset lives and how it replicates;
- `hlc`: `HLC` timestamps (order, text form) and `HybridClock`;
- `version`: `Version`, `Digest` (`blake3:<hex>`) and `lww`, the one LWW rule;
- `version_set`: `VersionSet`, objects made visible together;
- `events`: `ChangeEvent`, one change as the change log carries it;
- `names`: `check_name`, dataset and object names that cannot escape a store;
- `errors`: what bad input at these boundaries raises.

The protobuf forms of these types are in the `meridian` package (`meridian.v1`,
generated from proto/meridian/v1, and `meridian.convert`).
"""
