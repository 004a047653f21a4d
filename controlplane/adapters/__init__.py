"""Adapters: one module per external engine, each behind a port of `controlplane.ports`."""
