"""The local broker's cluster id: Kafka's form, and never read as an option."""

from __future__ import annotations

import base64
import uuid

import pytest

from controlplane.stack import kafka


def test_a_draw_starting_with_a_dash_is_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xf8 in the first byte encodes as "-" in URL-safe base64 (index 62).
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    plain = uuid.UUID(bytes=bytes(range(16)))
    draws = iter([dashed, dashed, plain])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    got = kafka.new_cluster_id()
    assert got == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert next(draws, None) is None


def test_ids_have_kafkas_form() -> None:
    for _ in range(500):
        got = kafka.new_cluster_id()
        assert len(got) == 22 and not got.startswith("-")
        assert base64.urlsafe_b64decode(got + "==") != bytes(16)
