"""Engines' connector names in capkv's registry: asked only for names capkv does not know."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

import pytest

from capkv import MultiConnector
from capkv.config import ConnectorRegistry
from capkv.errors import ConfigError
from tests.config.sample_connectors import DiskConnector

ASKED: list[tuple[str, dict[str, Any]]] = []


def disk_only(name: str, entry: Mapping[str, Any]) -> type[Any] | None:
    """An engine namespace that knows one name."""
    ASKED.append((name, dict(entry)))
    return DiskConnector if name == "EngineDisk" else None


def not_a_connector(name: str, entry: Mapping[str, Any]) -> object:
    return int


def test_an_unknown_name_is_asked_of_the_engines_with_its_entry_each_time() -> None:
    """An engine may pick the class by the entry's config (vLLM: NIXL's transfer_mode), so nothing is cached."""
    ASKED.clear()
    registry = ConnectorRegistry(entry_point_group=None, engine_namespaces=(f"{__name__}:disk_only",))
    assert registry.resolve("EngineDisk") is DiskConnector
    entry = {"kv_connector": "EngineDisk", "kv_connector_extra_config": {"mode": "push"}}
    assert registry.resolve("EngineDisk", entry=entry) is DiskConnector
    assert registry.resolve("MultiConnector") is MultiConnector  # capkv's names win, unasked
    assert ASKED == [("EngineDisk", {}), ("EngineDisk", entry)]
    with pytest.raises(ConfigError, match='unknown connector "Nope"'):
        registry.resolve("Nope")


def test_an_engines_answer_must_be_a_connector_class() -> None:
    registry = ConnectorRegistry(entry_point_group=None, engine_namespaces=(f"{__name__}:not_a_connector",))
    with pytest.raises(ConfigError, match=r'connector "Anything" \(int\) is not a KVConnector class'):
        registry.resolve("Anything")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the error without vLLM installed")
def test_without_vllm_a_vllm_name_says_how_to_get_it() -> None:
    registry = ConnectorRegistry(entry_point_group=None)
    with pytest.raises(ConfigError, match=r"vLLM's connector names resolve when vLLM is installed \(capkv\[vllm\]\)"):
        registry.resolve("ExampleConnector")
    assert "vllm" not in sys.modules
