"""Dataset and object names, as the data plane accepts them (spec/dataplane.md).

A name is UTF-8 text of at most 1,024 bytes with no NUL, no leading `/` and no
`..` segment, so that no name can lead a store outside its root. `check_name`
raises one `ObjectNameError` naming what is wrong, before anything is touched.
"""

from __future__ import annotations

from controlplane.domain.errors import ObjectNameError

NAME_MAX_BYTES = 1024


def check_name(what: str, name: object) -> str:
    """Return `name` if it is a valid dataset or object name; `what` says which
    ("dataset", "key") in the error."""
    if not isinstance(name, str):
        raise ObjectNameError(f"{what} name must be text, got {type(name).__name__}")
    if not name:
        raise ObjectNameError(f"{what} name is empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate is not UTF-8
        raise ObjectNameError(f"{what} name {name!r} is not valid UTF-8") from exc
    if size > NAME_MAX_BYTES:
        raise ObjectNameError(
            f"{what} name is {size} bytes long; at most {NAME_MAX_BYTES} are allowed"
        )
    if "\0" in name:
        raise ObjectNameError(f"{what} name {name!r} contains a NUL character")
    if name.startswith("/"):
        raise ObjectNameError(f"{what} name {name!r} starts with '/'")
    if ".." in name.split("/"):
        raise ObjectNameError(f"{what} name {name!r} has a '..' segment")
    return name
