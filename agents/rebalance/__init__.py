"""Rebalance inside a region (issue 16): when the region's agents change, each agent
moves what it holds to the objects' new owners, and forgets what it no longer owns."""

from agents.rebalance.rebalancer import Progress, Rebalancer

__all__ = ["Progress", "Rebalancer"]
