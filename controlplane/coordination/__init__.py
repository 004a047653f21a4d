"""Coordination on the coordination port: liveness, fenced ownership, locks, failover, runbooks."""
