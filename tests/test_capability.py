"""Capability inference at run time: one rule, every stack shape."""

from __future__ import annotations

import pytest

from capkv import (
    CapabilityError,
    HMAMultiConnector,
    KVConnector,
    MultiConnector,
    SupportsHMA,
    non_hma_children,
    supports_hma,
)
from tests.fakes import HMA, Plain


def is_hma_everywhere(stack: object) -> bool:
    """Every way an engine might ask, which must all agree."""
    answers = {
        supports_hma(stack),
        hasattr(stack, "request_finished_all_groups"),
        isinstance(stack, SupportsHMA),
        isinstance(stack, HMAMultiConnector),
    }
    assert len(answers) == 1, f"runtime checks disagree on {stack!r}"
    return answers.pop()


@pytest.mark.parametrize(
    ("children", "expected"),
    [
        ((HMA, HMA), True),
        ((Plain, Plain), False),
        ((HMA, Plain), False),
        ((Plain, HMA), False),
        ((HMA,), True),
        ((Plain,), False),
        ((HMA, HMA, HMA, HMA, HMA, HMA, HMA, HMA, HMA, HMA), True),
        ((HMA, HMA, HMA, HMA, HMA, HMA, HMA, HMA, HMA, Plain), False),
    ],
)
def test_stack_is_hma_iff_every_child_is(children: tuple[type[Plain], ...], expected: bool) -> None:
    stack = MultiConnector(*(cls() for cls in children))
    assert is_hma_everywhere(stack) is expected
    assert isinstance(stack, KVConnector)
    assert isinstance(stack, MultiConnector)


def test_nested_stacks_follow_the_rule_at_every_level() -> None:
    inner_hma = MultiConnector(HMA(), HMA())
    inner_plain = MultiConnector(HMA(), Plain())
    assert is_hma_everywhere(MultiConnector(inner_hma, HMA()))
    assert not is_hma_everywhere(MultiConnector(inner_plain, HMA()))
    assert not is_hma_everywhere(MultiConnector(HMA(), MultiConnector(MultiConnector(Plain()))))


def test_classes_are_judged_by_the_same_rule() -> None:
    assert supports_hma(HMA) and not supports_hma(Plain)
    assert supports_hma(HMAMultiConnector) and not supports_hma(MultiConnector)


def test_offenders_are_named_by_path_and_class() -> None:
    stack = MultiConnector(MultiConnector(HMA(), Plain()), HMA(), Plain())
    assert [(c.position, c.name) for c in non_hma_children(stack)] == [("#1.2", "Plain"), ("#3", "Plain")]
    assert non_hma_children(MultiConnector(HMA())) == []
    [root] = non_hma_children(Plain())
    assert root.explain() == 'connector "Plain" does not implement SupportsHMA (missing request_finished_all_groups)'


def test_at_least_one_child() -> None:
    with pytest.raises(CapabilityError, match="at least one sub-connector"):
        MultiConnector()  # type: ignore[call-overload]


@pytest.mark.parametrize("bad", [1, "disk", object(), None])
def test_children_must_be_connectors(bad: object) -> None:
    with pytest.raises(CapabilityError, match=r'sub-connector #2 ".*" is not a KVConnector \(missing ') as info:
        MultiConnector(HMA(), bad)  # type: ignore[call-overload]
    assert info.value.connector is not None and info.value.connector.startswith("#2 ")
    assert info.value.value is bad


def test_asking_for_an_hma_stack_of_plain_children_is_refused() -> None:
    with pytest.raises(CapabilityError, match='sub-connector #2 "Plain" does not implement SupportsHMA'):
        HMAMultiConnector(HMA(), Plain())


class Tagged(MultiConnector):  # type: ignore[type-arg]
    """A user subclass: its instances must be judged like the base composite."""

    def describe(self) -> str:
        return "tagged"


def test_subclasses_get_an_hma_variant_of_their_own_class() -> None:
    hma_stack = Tagged(HMA(), HMA())
    plain_stack = Tagged(HMA(), Plain())
    assert isinstance(hma_stack, Tagged) and isinstance(plain_stack, Tagged)
    assert hma_stack.describe() == "tagged"
    assert is_hma_everywhere(hma_stack)
    assert not is_hma_everywhere(plain_stack)
    assert type(Tagged(HMA())) is type(hma_stack), "the HMA variant is built once and reused"
    assert type(hma_stack).__name__ == "Tagged"


def test_splatted_lists_work() -> None:
    connectors = [HMA(), HMA(), HMA()]
    stack = MultiConnector(*connectors)
    assert stack.children == tuple(connectors)
    assert is_hma_everywhere(stack)
