"""Subclasses of MultiConnector inherit its overloads, so checkers see the base composite.

This is a documented limitation: the static type of ``MyStack(a, b)`` is the
(HMA or plain) ``MultiConnector``, while at run time it is a ``MyStack``
(or its HMA variant). The HMA verdict is the same either way.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

from capkv import HMAMultiConnector, KVConnector, MultiConnector, SupportsHMA
from tests.typing_cases._connectors import Disk, Offload


class MyStack(MultiConnector[*tuple[Any, ...]]):
    """A subclass adding nothing."""


def needs_hma(connector: SupportsHMA) -> None: ...


assert_type(MyStack(Offload(), Offload()), HMAMultiConnector[Offload, Offload])
needs_hma(MyStack(Offload(), Offload()))
needs_hma(MyStack(Offload(), Disk()))  # expect-error
# ^ mypy+plugin: "MyStack" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]


class Tiered(MultiConnector[*tuple[Any, ...]]):
    """A subclass with an option of its own, taken by its ``__init__``."""

    def __init__(self, *children: KVConnector, threshold: int = 3) -> None:
        self.threshold = threshold


tiered = Tiered(Offload(), Disk(), threshold=2)
assert_type(tiered, Tiered)
assert_type(tiered.threshold, int)
Tiered(Offload(), threshold="high")  # expect-error
needs_hma(Tiered(Offload(), Offload(), threshold=2))  # expect-error
