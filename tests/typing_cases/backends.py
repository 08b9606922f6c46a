"""A backend is checked against every member the store reads, ``slow`` included: a misspelt ``slow`` is a missing member."""

from __future__ import annotations

from collections.abc import Sequence

from capkv import KVSpec
from capkv.stores import Backend, MemoryBackend, StoreConnector, StoreKey


class Calls:
    """The five calls, and no ``slow``."""

    def contains(self, keys: Sequence[StoreKey], /) -> list[bool]:
        return [False] * len(keys)

    def get(self, keys: Sequence[StoreKey], /) -> list[bytes | None]:
        return [None] * len(keys)

    def put(self, items: Sequence[tuple[StoreKey, memoryview]], /) -> list[bool]:
        return [False] * len(items)

    def delete(self, keys: Sequence[StoreKey], /) -> None: ...

    def close(self) -> None: ...


class Declared(Calls):
    slow = True


class Misspelt(Calls):
    slwo = True


def build(spec: KVSpec) -> None:
    StoreConnector(spec, Declared())
    StoreConnector(spec, MemoryBackend())
    fine: Backend = Declared()
    StoreConnector(spec, Misspelt())  # expect-error
    StoreConnector(spec, Calls())  # expect-error
    missing: Backend = Misspelt()  # expect-error
    del fine, missing
