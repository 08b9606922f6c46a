"""``capkv`` console script: dispatch to one subcommand module.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``;
registering one is a line in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
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
    """Run ``capkv``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="capkv", description="Typed, composable, checked KV-cache connectors.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    handlers: dict[str, _Subcommand] = {}
    for name, (module, help_text) in SUBCOMMANDS.items():
        handlers[name] = cast(_Subcommand, importlib.import_module(module))
        handlers[name].add_arguments(commands.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return handlers[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
