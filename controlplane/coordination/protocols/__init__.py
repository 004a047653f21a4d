"""The etcd protocols, written against the coordination port.

`keys` (the key layout), `ownership` (epochs and handover marks), `locks` (fenced
mutexes), `fencing` (resources that refuse stale epochs), `follow` (keeping a
fenced resource in step with etcd) and `view` (one consistent snapshot).
"""
