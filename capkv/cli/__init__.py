"""The ``capkv`` command line: ``demo``, ``check``, ``bench``.

Every command ends with its documented exit status and one line per problem, never a traceback; open
``_main.py`` first (the dispatch), then the subcommand's module.
"""

from typing import TYPE_CHECKING

from capkv._lazy import attach

if TYPE_CHECKING:
    from capkv.cli._main import main

__all__ = ["main"]

if not TYPE_CHECKING:  # checkers read the imports above (see capkv._lazy)
    __getattr__, __dir__ = attach(__name__, {"capkv.cli._main": ["main"]})

del TYPE_CHECKING, attach  # dir(), vars(): the front's names only
