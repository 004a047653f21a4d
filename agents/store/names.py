"""Dataset, key and set names, and the one place that maps them to paths.

Rules (spec/dataplane.md, *The agent's store*, checked by the domain's
`check_name`): a name is UTF-8 text, not empty, with no NUL, no `..` segment
between slashes, no leading `/`, at most 1,024 bytes. A name that breaks one is
refused with one ObjectNameError (an InvalidInputError) naming the field and the
value, before any file is touched.

Mapping: a version's file is `objects/<h[0:3]>/<h>.<HLC text>`, where `h` is
the blake3 hex digest of `dataset NUL key` (NUL cannot occur in a name, so the
input is unambiguous) and the HLC text is the version's. We chose a digest over
percent-encoding because (1) a path then contains only `[0-9a-f]`, the HLC's
`[0-9.@a-z-]` and `/`, so no name whatever can reach outside `objects/` -- the
rules above are enforced for the user's sake, not relied on for safety; (2) a
1,024-byte name would pass NAME_MAX (255 bytes per component) once encoded;
(3) case-insensitive or normalising file systems cannot fold two names into one
file; (4) 4,096 fan-out folders keep each folder small (50,000 files at 100
million versions) and, once they exist, a write creates no folder: one folder
fsync per write. The cost: the tree alone does not tell which object a file
is, so the metadata row (authoritative anyway) is needed to read it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from blake3 import blake3

from controlplane.domain.errors import ObjectNameError
from controlplane.domain.hlc import HLC
from controlplane.domain.names import NAME_MAX_BYTES
from controlplane.domain.names import check_name as domain_check_name
from controlplane.errors import InvalidInputError

MAX_NAME_BYTES = NAME_MAX_BYTES
OBJECTS = "objects"


def check_name(field: str, value: object) -> str:
    """Return `value` as text if it is a valid name; otherwise raise one
    ObjectNameError (an InvalidInputError) naming `field` (dataset, key, set,
    prefix) and the value. The rules are the domain's (`controlplane.domain.names`,
    the one definition); this adds bytes, which must decode as UTF-8 first."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ObjectNameError(
                f"{field} name {value[:60]!r} is not UTF-8 (byte {err.start} is invalid)"
            ) from None
    return domain_check_name(field, value)


def object_hash(dataset: str, key: str) -> str:
    """The hex digest that names an object's folder (names already checked)."""
    return blake3(f"{dataset}\x00{key}".encode()).hexdigest()


def version_path(dataset: str, key: str, hlc: HLC) -> PurePosixPath:
    """The file holding one version's bytes, relative to the root."""
    return PurePosixPath(version_text(dataset, key, hlc)[1])


def version_text(dataset: str, key: str, hlc: HLC) -> tuple[str, str]:
    """`version_path` as text, with its fan-out folder's name: (fan, relative path). A
    bundle of small objects builds thousands of these; pathlib's parsing cost more
    than the hash."""
    h = object_hash(dataset, key)
    fan = h[0:3]
    return fan, f"{OBJECTS}/{fan}/{h}.{hlc.text}"


def is_version_path(relative: PurePosixPath) -> bool:
    """Whether a path found under the root has the shape `version_path` produces."""
    parts = relative.parts
    if len(parts) != 3 or parts[0] != OBJECTS:
        return False
    _, fan, leaf = parts
    h, dot, hlc = leaf[:64], leaf[64:65], leaf[65:]
    if dot != "." or fan != h[0:3] or len(h) != 64 or h.strip("0123456789abcdef"):
        return False
    try:
        HLC.parse(hlc)
    except InvalidInputError:
        return False
    return True
