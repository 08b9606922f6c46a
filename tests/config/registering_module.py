"""Imported by ``capkv check --import``: registers a connector by decorator."""

from capkv.config import register_connector
from tests.config.sample_connectors import DiskConnector


@register_connector("tests-registered-disk")
class RegisteredDisk(DiskConnector):
    """A single-group connector known only by its registered name."""
