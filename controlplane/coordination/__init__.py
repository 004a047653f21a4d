"""Coordination on the coordination port, in three rooms.

* `protocols/`: the etcd protocols (keys, ownership, locks, fencing, follow, view);
* `orchestration/`: decisions, failover moves and the operator's runbooks;
* `catalog_glue/`: the narrow catalog interfaces coordination uses, and their adapter.

`timeutil` (RFC 3339 times) is shared by all three.
"""
