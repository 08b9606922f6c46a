"""The ``capkv`` command line: one private module per subcommand, dispatched by :func:`main`."""

from capkv.cli._main import main

__all__ = ["main"]
