"""capkv's version: the one place it is written.

``pyproject.toml`` reads it without importing capkv and :mod:`capkv` exports it, so an editable install, a
wheel and a checkout on ``PYTHONPATH`` all report the code they run.
"""

__version__ = "0.3.0.dev0"
