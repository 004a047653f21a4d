"""Place a dataset first seen on a write, under the policy of the head revision.

The catalog calls this through its `Placer` port (it does not import the policy
package). Rebuilding a `PolicySet` from a revision's document costs a validation
pass, so the last few rebuilt sets are kept, keyed by the document's digest.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from threading import Lock
from typing import Any

from controlplane.domain.placement import Placement
from controlplane.policy.compiler import PolicySet

CACHED_SETS = 4
_sets: OrderedDict[str, PolicySet] = OrderedDict()
_lock = Lock()


def _policy_set(document: Mapping[str, Any]) -> PolicySet:
    key = hashlib.sha256(
        json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    with _lock:
        found = _sets.get(key)
        if found is not None:
            _sets.move_to_end(key)
            return found
    built = PolicySet.from_document(document)
    with _lock:
        _sets[key] = built
        while len(_sets) > CACHED_SETS:
            _sets.popitem(last=False)
    return built


def place(document: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> Placement | None:
    """The placement of dataset `name` (with `labels`) under `document`, or None when no
    policy of it selects the dataset. Satisfies `controlplane.catalog.records.Placer`."""
    return _policy_set(document).placements({name: dict(labels)}).get(name)
