"""User connectors that misbehave while ``capkv check`` / ``capkv demo`` build or ask them."""

from __future__ import annotations

from typing import Any

from capkv import class_level
from capkv.config import ConnectorOptions, Option
from tests.fakes import HMA


class FactRaises(HMA):
    """Its layout fact raises an ordinary exception, from an instance."""

    def __init__(self) -> None:
        super().__init__("fact-raises")

    def get_required_kvcache_layout(self) -> str | None:
        raise ValueError("layout table\nnot loaded")


class ClassFactRaises(HMA):
    """Its class-level finished count raises."""

    def __init__(self) -> None:
        super().__init__("class-fact-raises")

    @class_level
    def get_finished_count(cls) -> int | None:
        raise LookupError("no such count")


class LayoutFive(HMA):
    """Answers its layout with a number."""

    def __init__(self) -> None:
        super().__init__("layout-five")

    @class_level
    def get_required_kvcache_layout(cls) -> str | None:
        return 5  # type: ignore[return-value]


class ExitsInInit(HMA):
    """Its constructor calls ``sys.exit(0)``."""

    def __init__(self) -> None:
        raise SystemExit(0)


class CustomBaseException(BaseException):
    """Not an ``Exception``: escapes ``except Exception``."""


class RaisesBaseException(HMA):
    def __init__(self) -> None:
        raise CustomBaseException("from the constructor")


class Interrupted(HMA):
    """As if Ctrl-C arrived while it was being built."""

    def __init__(self) -> None:
        raise KeyboardInterrupt


class Declares(HMA):
    """Declares its options: a count and a name."""

    extra_config_options = ConnectorOptions(slots=Option(int, minimum=1, required=True), label=Option(str))

    def __init__(self, *, slots: int, label: str = "") -> None:
        super().__init__("declares")
        self.slots, self.label = slots, label


class SpecStore(HMA):
    """Built with the engine's KVSpec (``takes_spec``), like capkv's own stores."""

    extra_config_options = ConnectorOptions(takes_spec=True)

    def __init__(self, spec: Any) -> None:
        super().__init__("spec-store")
        self.spec = spec
