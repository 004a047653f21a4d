"""Ports: one small typed interface per external system, its guarantees in its docstring."""
