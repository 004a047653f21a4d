"""Orchestration on top of the protocols: who should own what, and moving it.

`decide` (pure failover and switchover decisions), `failover` (guarded moves and
their journal rows), `runbooks` (the operator's commands) and `session` (what a
runbook opens: etcd and the catalog).
"""
