"""The node agent daemon, `meridian agent serve` (spec/dataplane.md, issue 10).

One process per store root. `NodeAgent` (agent.py) wires the parts, each in its own
module: the root's identity and writability (identity.py), the watched policy
(`controlplane.policy.current.PolicyView`), the dataset owners and the fence they
feed (owners.py), the store, the gRPC API, the registration on a lease
(registration.py) and the metrics endpoint (metrics_http.py). `run.py` runs it
until SIGTERM.
"""
