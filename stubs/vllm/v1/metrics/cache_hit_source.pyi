from collections.abc import Iterable
from enum import Enum

class CacheHitSource(str, Enum):
    DEVICE = "device"
    HOST = "host"
    P2P = "p2p"
    DISK = "disk"
    EXTERNAL_UNSPECIFIED = "external_unspecified"
    @classmethod
    def outermost(cls, sources: Iterable[CacheHitSource]) -> CacheHitSource: ...
