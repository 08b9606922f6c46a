"""The generic composite and the metadata it ships between its two sides."""

from capkv.composite._metadata import MultiConnectorMetadata, MultiWorkerMetadata
from capkv.composite._multi import HMAMultiConnector, MultiConnector

__all__ = ["HMAMultiConnector", "MultiConnector", "MultiConnectorMetadata", "MultiWorkerMetadata"]
