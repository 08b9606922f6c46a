"""Connector classes that stack files in the config tests name by "module:Class"."""

from __future__ import annotations

from typing import Any

from capkv.config import ConnectorRegistry
from tests.fakes import HMA, Plain


class _Configurable:
    """Mixes keyword extra config into a fake: layout, finished count, piecewise need."""

    layout: str | None
    finished_count: int | None
    piecewise: bool

    def configure(self, layout: str | None, finished_count: int | None, piecewise: bool) -> None:
        self.layout, self.finished_count, self.piecewise = layout, finished_count, piecewise


class OffloadConnector(HMA, _Configurable):
    """HMA-capable."""

    def __init__(self, *, layout: str | None = None, finished_count: int | None = None, piecewise: bool = False) -> None:
        super().__init__("offload")
        self.configure(layout, finished_count, piecewise)


class DiskConnector(Plain, _Configurable):
    """Single-group only."""

    def __init__(self, *, layout: str | None = None, finished_count: int | None = None, piecewise: bool = False) -> None:
        super().__init__("disk")
        self.configure(layout, finished_count, piecewise)


class FactoryBuilt(HMA):
    """Built through the ``from_extra_config`` hook, never through ``__init__``'s keywords."""

    def __init__(self, engine_object: object) -> None:
        super().__init__("factory")
        self.engine_object = engine_object

    @classmethod
    def from_extra_config(cls, extra_config: dict[str, Any]) -> FactoryBuilt:
        built = cls(engine_object=None)
        built.layout = extra_config.get("layout")
        return built


class NotAConnector:
    """Has none of the contract's members."""


def not_a_class() -> None:
    """A function, where a connector class is expected."""


registry = ConnectorRegistry()
"""A registry of its own, so tests do not leak names into the default one."""
