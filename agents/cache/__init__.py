"""The residency-aware read-through cache with prefetch (issue 16): see README.md."""

from agents.cache.cache import CacheResidencyError, ReadCache
from agents.cache.changelog import Invalidator
from agents.cache.prefetch import Prefetcher
from agents.cache.residency import ResidencySweeper

__all__ = ["CacheResidencyError", "Invalidator", "Prefetcher", "ReadCache", "ResidencySweeper"]
