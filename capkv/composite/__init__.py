"""The generic composite and the metadata it ships between its two sides.

Implementation only: ``capkv.MultiConnector`` and its metadata are public from :mod:`capkv`.
"""

__all__: list[str] = []
