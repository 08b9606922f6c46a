"""Capability rules: what a connector or a stack can serve, decided once, never by ``assert``.

Implementation only: the rules users call are public from :mod:`capkv`
(``capkv.check_stack``, ``capkv.supports_hma``, ...).
"""

__all__: list[str] = []
