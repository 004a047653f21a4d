"""Meridian chaos (see ARCHITECTURE.md)."""
