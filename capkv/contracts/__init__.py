"""The contracts: what connectors are, what engines hand them, and the KV-cache shape.

Implementation only (every name is public from :mod:`capkv`); open ``_connector.py`` first, the protocol
everything else checks against.
"""

__all__: list[str] = []
