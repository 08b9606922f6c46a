"""Adapters that wrap another engine's connector are named by what they wrap; class-level facts that need
the engine's arguments are left to instances. (Engine-free: the vLLM wrapper itself is tested in tests/vllm.)"""

from __future__ import annotations

from typing import Any

import pytest

import capkv
from capkv.capabilities._facts import NEEDS_INSTANCE, class_fact
from tests.fakes import HMA, Plain


class Forwarding:
    """A minimal adapter: forwards every member to the connector it wraps, and says it wraps one."""

    __capkv_wrapper__ = True

    def __init__(self, wrapped: object) -> None:
        self.wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


class EngineLayout(HMA):
    @classmethod
    def get_required_kvcache_layout(cls, engine_config: object) -> str | None:  # type: ignore[override]
        return "HND"


class PlainLayout(HMA):
    @classmethod
    def get_required_kvcache_layout(cls) -> str | None:  # type: ignore[override]
        return "NHD"


def test_check_stack_names_the_wrapped_connector() -> None:
    stack = capkv.MultiConnector(HMA("a"), Forwarding(Plain("b")))
    with pytest.raises(capkv.CapabilityError) as info:
        capkv.check_stack(stack, 2)
    assert 'sub-connector #2 "Plain" does not implement SupportsHMA' in str(info.value)


def test_a_wrapper_mark_must_be_true_to_count() -> None:
    class NotAWrapper(Forwarding):
        __capkv_wrapper__ = "yes"  # type: ignore[assignment]

    assert [c.name for c in capkv.non_hma_children(capkv.MultiConnector(NotAWrapper(Plain("b"))))] == ["NotAWrapper"]


def test_a_class_level_fact_that_needs_arguments_needs_an_instance() -> None:
    assert class_fact(EngineLayout, "get_required_kvcache_layout") is NEEDS_INSTANCE
    assert class_fact(PlainLayout, "get_required_kvcache_layout") == "NHD"
