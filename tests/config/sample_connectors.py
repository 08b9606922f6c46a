"""Connector classes that stack files in the config tests name by "module:Class"."""

from __future__ import annotations

from typing import Any

from capkv import class_level
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


class EngineBound(HMA):
    """Like capkv's own connectors: needs an engine object, so no extra config builds it.

    Its facts are class-level, so ``capkv check`` knows them anyway.
    """

    def __init__(self, engine_object: object) -> None:
        super().__init__("engine-bound")
        self.engine_object = engine_object

    @class_level
    def get_required_kvcache_layout(cls) -> str | None:
        return "HND"

    @class_level
    def get_finished_count(cls) -> int | None:
        return None

    @class_level
    def requires_piecewise_for_cudagraph(cls) -> bool:
        return True


class EngineBoundNHD(EngineBound):
    """Another class-level layout: stacked with :class:`EngineBound`, they conflict."""

    @class_level
    def get_required_kvcache_layout(cls) -> str | None:
        return "NHD"


class EngineBoundConfigured(EngineBound):
    """Its layout depends on the instance again: only a built one can answer."""

    def get_required_kvcache_layout(self) -> str | None:
        return self.layout


def _class_level_fakes() -> dict[str, type[Plain]]:
    """Single-group fakes with every class-level (layout, finished count): ``Fixed_HND_2`` etc."""
    made: dict[str, type[Plain]] = {}
    for layout in (None, "HND", "NHD"):
        for count in (None, 2):
            namespace = {
                "get_required_kvcache_layout": class_level(lambda cls, v=layout: v),
                "get_finished_count": class_level(lambda cls, v=count: v),
                "requires_piecewise_for_cudagraph": class_level(lambda cls, v=layout == "HND": v),
                "__module__": __name__,
            }
            name = f"Fixed_{layout}_{count}"
            made[name] = type(name, (Plain,), namespace)
    return made


FIXED = _class_level_fakes()
"""Class-level fakes by name, also importable as module attributes."""
globals().update(FIXED)


class BrokenConnector(HMA):
    """Its constructor fails: a stack naming it fails half way through its build."""

    def __init__(self) -> None:
        raise RuntimeError("cannot reach the backing service")


class ShutdownRecorder(HMA):
    """Records each instance shut down (class-level), for the failed-build tests."""

    shut_down: list[ShutdownRecorder] = []

    def __init__(self) -> None:
        super().__init__("recorder")

    def shutdown(self) -> None:
        ShutdownRecorder.shut_down.append(self)
