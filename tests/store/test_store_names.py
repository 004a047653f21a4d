"""Name validation and the name-to-path mapping: nothing escapes the root."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import tree

from agents.store import ObjectStore, check_name
from agents.store.names import is_version_path, version_path
from controlplane.domain.hlc import HLC
from controlplane.errors import InvalidInputError


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "is empty"),
        ("a\x00b", "NUL"),
        ("/etc/passwd", "starts with '/'"),
        ("..", "'..' segment"),
        ("a/../../b", "'..' segment"),
        ("a/..", "'..' segment"),
        ("x" * 1025, "1025 bytes long"),
        ("é" * 513, "1026 bytes long"),
        ("\udcff", "not valid UTF-8"),
        (b"\xff\xfe", "not UTF-8"),
        (7, "must be text"),
    ],
)
def test_bad_names_are_refused_naming_field_and_value(value: object, fragment: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_name("key", value)
    message = str(caught.value)
    assert message.startswith("key"), message
    assert fragment in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "value", ["a", "x" * 1024, "é" * 512, "a/b/c.bin", "..a/b..", "./x", "a//b", "\\..\\x", "名"]
)
def test_good_names_pass_unchanged(value: str) -> None:
    assert check_name("dataset", value) == value
    assert check_name("dataset", value.encode()) == value


def test_bad_name_touches_no_file(store: ObjectStore) -> None:
    before = tree(store.root)
    for dataset, key in [("ds", "../../escape"), ("/abs", "k"), ("ds", "a\x00")]:
        with pytest.raises(InvalidInputError):
            store.put(dataset, key, [b"data"])
        with pytest.raises(InvalidInputError):
            store.delete(dataset, key)
    assert tree(store.root) == before
    assert not any(name.endswith(".part") for name in tree(store.root))


@given(st.text(max_size=300), st.text(max_size=300))
def test_any_accepted_name_maps_inside_objects(dataset: str, key: str) -> None:
    try:
        dataset, key = check_name("dataset", dataset), check_name("key", key)
    except InvalidInputError:
        return
    path = version_path(dataset, key, HLC(1764579123456, 0, "eu-west"))
    assert is_version_path(path)
    assert path.parts[0] == "objects" and ".." not in path.parts
    assert set(str(path)) <= set("0123456789abcdef/objects.@-uw")
    root = Path("/srv/root")
    assert os.path.normpath(root / path).startswith(f"{root}/objects/")


def test_distinct_names_get_distinct_paths() -> None:
    hlc = HLC(1764579123456, 0, "eu-west")
    # NUL separates dataset and key, so moving a '/' between them changes the path.
    assert version_path("a/b", "c", hlc) != version_path("a", "b/c", hlc)
    assert version_path("ds", "K", hlc) != version_path("ds", "k", hlc)
    assert is_version_path(PurePosixPath("objects", "abc", "abc" + "0" * 61 + "." + hlc.text))
    assert not is_version_path(PurePosixPath("objects", "abd", "abc" + "0" * 61 + "." + hlc.text))
    assert not is_version_path(PurePosixPath("objects", "abc", "abc" + "0" * 61 + ".x"))


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60, deadline=None
)
@given(st.lists(st.text(alphabet=st.sampled_from("ab./\\\x00é~"), max_size=12), min_size=2))
def test_storing_hostile_names_writes_only_under_objects(
    tmp_path: Path, store: ObjectStore, parts: list[str]
) -> None:
    outside = sorted(os.listdir(tmp_path))
    dataset, key = parts[0] or "d", "/".join(parts[1:])
    try:
        version = store.put(dataset, key, [key.encode("utf-8", "surrogatepass")])
    except InvalidInputError:
        return
    assert sorted(os.listdir(tmp_path)) == outside
    relative = PurePosixPath(version_path(dataset, key, version.hlc))
    assert (store.root / relative).is_file()
    assert store.read_bytes(dataset, key) == key.encode()
