"""``capkv`` console script: dispatch to one subcommand module.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``;
registering one is a line in :data:`SUBCOMMANDS`. Subcommand modules are imported
lazily so ``capkv check`` does not pay for torch-heavy demo code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

__all__ = ["main"]

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "check": ("capkv.cli.check", "check a configured connector stack (JSON/TOML) before serving"),
}


class _Subcommand(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser, /) -> None: ...
    def run(self, args: argparse.Namespace, /) -> int: ...


def _load(module: str) -> _Subcommand:
    return cast(_Subcommand, importlib.import_module(module))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capkv``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="capkv", description="Typed, composable, checked KV-cache connectors.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules: dict[str, str] = {}
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        modules[name] = module
        if name == chosen:
            _load(module).add_arguments(sub)
    args = parser.parse_args(argv)
    return _load(modules[args.command]).run(args)


if __name__ == "__main__":
    sys.exit(main())
