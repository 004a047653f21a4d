"""`LruIndex`: which cached objects are held, their sizes, and which to evict.

Pure bookkeeping (no I/O), so the bound is checked in unit tests: an entry is one
object's cached version; a hit moves it to the young end; `admit` adds one and
returns, oldest first, the entries that must go for the total to fit the bound
again. The entry just admitted is never among them unless it alone is larger than
the whole bound (then it is served once and not kept).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from controlplane.domain.version import Version

Name = tuple[str, str]  # (dataset, key)


@dataclass(frozen=True, slots=True)
class Entry:
    dataset: str
    key: str
    version: Version
    # Filled as the newest version (a read of the newest), not of one asked by its HLC:
    # only such an entry may be served as the newest without asking the holders.
    newest: bool = field(default=True, compare=False)

    @property
    def name(self) -> Name:
        return (self.dataset, self.key)

    @property
    def size(self) -> int:
        return self.version.size


class LruIndex:
    """See the module docstring. `limit_bytes` is the bound of the cached bytes."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError(f"a cache bound must be at least 1 byte, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[Name, Entry] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: Name) -> Entry | None:
        """The entry, made the youngest (a hit)."""
        entry = self._entries.get(name)
        if entry is not None:
            self._entries.move_to_end(name)
        return entry

    def peek(self, name: Name) -> Entry | None:
        """The entry, its age unchanged (a prefetch's check or an invalidation)."""
        return self._entries.get(name)

    def admit(self, entry: Entry) -> list[Entry]:
        """Add (or replace) `entry` as the youngest; the entries evicted to fit."""
        self.remove(entry.name)
        self._entries[entry.name] = entry
        self.bytes += entry.size
        evicted: list[Entry] = []
        while self.bytes > self.limit_bytes and self._entries:
            _, oldest = self._entries.popitem(last=False)
            self.bytes -= oldest.size
            evicted.append(oldest)
        return evicted

    def remove(self, name: Name) -> Entry | None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            self.bytes -= entry.size
        return entry

    def names(self) -> list[Name]:
        """Every held name, oldest first."""
        return list(self._entries)
