"""The generic composite and the metadata it ships between its two sides."""

from capkv.composite.metadata import MultiConnectorMetadata, MultiWorkerMetadata
from capkv.composite.multi import HMAMultiConnector, MultiConnector

__all__ = ["HMAMultiConnector", "MultiConnector", "MultiConnectorMetadata", "MultiWorkerMetadata"]
