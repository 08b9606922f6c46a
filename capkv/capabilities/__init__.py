"""Capability rules: what a connector or a stack can serve, decided once, never by ``assert``.

Implementation only (the rules are public from :mod:`capkv`: ``capkv.check_stack``, ``capkv.supports_hma``);
open ``_hma.py`` first, the rule the rest applies.
"""

__all__: list[str] = []
