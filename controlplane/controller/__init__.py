"""The region controller daemon: liveness lease, election, claims, automatic failover."""
