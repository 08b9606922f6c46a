"""``capkv`` console script: dispatch to one subcommand module.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``;
registering one is a line in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import Protocol, cast, runtime_checkable

__all__ = ["SUBCOMMANDS", "main"]

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "bench": ("capkv.cli._bench", "measure capkv's costs (transfer: block copy throughput)"),
    "check": ("capkv.cli._check", "check a configured connector stack (JSON/TOML) before serving"),
    "demo": ("capkv.cli._demo", "serve a hybrid model through a connector stack, cold then warm, verifying every byte"),
}


@runtime_checkable
class _Subcommand(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser, /) -> None: ...
    def run(self, args: argparse.Namespace, /) -> int: ...


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capkv``; returns the exit status.

    Only the chosen subcommand's module is imported, so ``capkv check`` does not
    load torch unless a connector it names needs it.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in arguments if not a.startswith("-")), None)  # capkv's own options are all flags
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_WITHOUT_NUMPY, category=UserWarning)
        parser = argparse.ArgumentParser(prog="capkv", description="Typed, composable, checked KV-cache connectors.")
        commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
        handler: _Subcommand | None = None
        for name, (module, help_text) in SUBCOMMANDS.items():
            sub = commands.add_parser(name, help=help_text, description=help_text)
            if name == chosen:
                handler = cast(_Subcommand, importlib.import_module(module))
                handler.add_arguments(sub)
        args = parser.parse_args(arguments)
        if handler is None:  # argparse has refused any other command already
            parser.error(f"unknown command {args.command!r}")
        return handler.run(args)


_TORCH_WITHOUT_NUMPY = "Failed to initialize NumPy"
"""What torch warns, once, when it is imported without numpy installed.

torch's wheels do not require numpy and capkv never converts a tensor to or
from numpy, so in a capkv command the warning says nothing that matters: the
command (and whatever torch it loads: ``demo``, ``bench``, a store named by
``check``) runs with it filtered.
"""


if __name__ == "__main__":
    sys.exit(main())
