"""Fakes for the composite's tests: capkv.testing's null connectors, a request, worker metadata."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from capkv.testing import HMANullConnector, NullConnector


@dataclass(frozen=True)
class Req:
    request_id: str


@dataclass
class FakeWorkerMeta:
    items: tuple[str, ...]

    def aggregate(self, other: Any, /) -> FakeWorkerMeta:
        return FakeWorkerMeta(self.items + other.items)


class Plain(NullConnector):
    """capkv.testing's single-group null connector, named as these tests' messages expect."""


class HMA(HMANullConnector, Plain):
    """capkv.testing's HMA-capable null connector (and a ``Plain``, as before)."""


class ReadsOutput(HMA):
    """Keeps the worker metadata each ``update_connector_output`` call saw: a stack hands every child the
    engine's output with the child's share in place for the call only."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self.seen_worker_meta: list[object] = []

    def update_connector_output(self, connector_output: Any, /) -> None:
        self.seen_worker_meta.append(connector_output.worker_meta)
        super().update_connector_output(connector_output)


def pool() -> AbstractContextManager[object]:
    return nullcontext()


@dataclass
class KVCacheConfig:
    """Shaped like vLLM's KVCacheConfig: only ``kv_cache_groups`` matters here."""

    kv_cache_groups: list[object] = field(default_factory=list)
