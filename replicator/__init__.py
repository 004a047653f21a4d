"""Meridian replicator (see ARCHITECTURE.md)."""
