"""Meridian agents (see ARCHITECTURE.md)."""
