"""The agent's local object store (spec/dataplane.md, *The agent's store*).

`ObjectStore` is the whole API; agents/store/README.md states the on-disk format
and the guarantees. Import from here:

    from agents.store import ObjectStore
"""

from agents.store.errors import (
    DigestMismatchError,
    MissingContentError,
    ShortStreamError,
    StorageError,
    StoreLockedError,
    TooLargeError,
)
from agents.store.model import (
    ApplyResult,
    Evicted,
    JournalEntry,
    OutboxEvent,
    Page,
    RepairReport,
    SetRecord,
    SmallPut,
    StoredVersion,
    Usage,
)
from agents.store.names import check_name
from agents.store.reader import CHUNK_BYTES, ObjectReader
from agents.store.staging import StagedWrite
from agents.store.store import CheckedSmall, HeldPut, ObjectStore

__all__ = [
    "CHUNK_BYTES",
    "ApplyResult",
    "CheckedSmall",
    "DigestMismatchError",
    "Evicted",
    "HeldPut",
    "JournalEntry",
    "MissingContentError",
    "ObjectReader",
    "ObjectStore",
    "OutboxEvent",
    "Page",
    "RepairReport",
    "SetRecord",
    "ShortStreamError",
    "SmallPut",
    "StagedWrite",
    "StorageError",
    "StoreLockedError",
    "StoredVersion",
    "TooLargeError",
    "Usage",
    "check_name",
]
