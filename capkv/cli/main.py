"""capkv 0.1.0's ``capkv.cli.main``, deprecated: kept until capkv 0.3.0.

Its public names are imported from :mod:`capkv.cli` now; its other names are internal. Reading a
name here warns with its new home (the table: :mod:`capkv._deprecations`).
"""

from typing import TYPE_CHECKING

from capkv._lazy import deprecated_module

if TYPE_CHECKING:
    from typing_extensions import deprecated

    from capkv._deprecations import signature_of
    from capkv.cli import _main
    from capkv.cli._main import SUBCOMMANDS as SUBCOMMANDS

    @deprecated("capkv.cli.main.main is deprecated (capkv 0.2.0, removed in 0.3.0): use capkv.cli.main")
    @signature_of(_main.main)
    def main() -> None: ...

__all__: list[str] = []

if not TYPE_CHECKING:  # each name read with a DeprecationWarning (or, if gone, an ImportError)
    __getattr__, __dir__ = deprecated_module(__name__)
