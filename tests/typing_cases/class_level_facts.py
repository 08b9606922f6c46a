"""Facts declared class-level (``@class_level``) or per instance: either way still a KVConnector."""

from __future__ import annotations

from typing_extensions import assert_type

from capkv import KVCacheAccess, KVConnector, KVConnectorBase, MultiConnector, Request, class_level
from tests.typing_cases._connectors import Disk, Offload


class ClassLevel(Offload):
    """Answers from the class, so ``capkv check`` knows without building it."""

    @class_level
    def get_required_kvcache_layout(cls) -> str | None:
        return "HND"

    @class_level
    def requires_piecewise_for_cudagraph(cls) -> bool:
        return True


class PerInstance(Disk):
    """Answers from its configuration: an instance method overrides the class-level default."""

    def __init__(self, count: int) -> None:
        self.count = count

    def get_finished_count(self) -> int | None:
        return self.count


class BackToClassLevel(PerInstance):
    """Class-level again, below an instance-level override."""

    @class_level
    def get_finished_count(cls) -> int | None:
        return 1


class WrongType(Disk):
    @class_level
    def get_finished_count(cls) -> str:  # expect-error
        return "one"


class Exporting(Offload):
    """What vLLM 0.34 is told before it allocates the KV cache: flags, and lookahead hashes."""

    @class_level
    def kv_cache_access(cls) -> KVCacheAccess:
        return KVCacheAccess.REGISTERS | KVCacheAccess.EXPORTS_FD

    @class_level
    def supports_lookahead_block_hashes(cls) -> bool:
        return True


class WrongAccess(Disk):
    @class_level
    def kv_cache_access(cls) -> bool:  # expect-error
        return True


def needs_connector(connector: KVConnector[Request]) -> None: ...


needs_connector(ClassLevel())
needs_connector(PerInstance(2))
needs_connector(BackToClassLevel(2))
needs_connector(MultiConnector(ClassLevel(), PerInstance(2)))
as_base: KVConnectorBase[Request] = ClassLevel()
assert_type(ClassLevel().get_required_kvcache_layout(), str | None)
assert_type(BackToClassLevel(2).get_finished_count(), int | None)
assert_type(ClassLevel().requires_piecewise_for_cudagraph(), bool)
ClassLevel().get_required_kvcache_layout("x")  # expect-error
needs_connector(Exporting())
assert_type(Exporting().kv_cache_access(), KVCacheAccess)
assert_type(ClassLevel().supports_lookahead_block_hashes(), bool)
