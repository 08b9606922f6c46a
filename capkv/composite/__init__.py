"""The generic composite and the metadata it ships between its two sides."""

from capkv.composite._completion import Drop, DroppedReports
from capkv.composite._metadata import NOT_BUILT, MultiConnectorMetadata, MultiWorkerMetadata
from capkv.composite._multi import HMAMultiConnector, MultiConnector

__all__ = [
    "NOT_BUILT",
    "Drop",
    "DroppedReports",
    "HMAMultiConnector",
    "MultiConnector",
    "MultiConnectorMetadata",
    "MultiWorkerMetadata",
]
