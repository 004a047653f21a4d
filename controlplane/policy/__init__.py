"""Replication policy as code: loading, validation, planning, plan/apply, publishing."""
