"""The contracts: what connectors are, what engines hand them, and the KV-cache shape.

Implementation only: every name here lives in a private module and is public
from :mod:`capkv` (``capkv.KVConnector``, ``capkv.KVSpec``, ...).
"""

__all__: list[str] = []
