"""``capkv`` console script: dispatch to one subcommand module.

Registering a subcommand is a line in :data:`SUBCOMMANDS`; whatever happens, a command ends with its exit
status and one line per problem, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast, runtime_checkable

from capkv._homes import publish

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


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``capkv demo: error: ... (see capkv demo --help)``."""

    def error(self, message: str) -> NoReturn:
        sys.stdout.flush()
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``capkv``; returns the exit status.

    Only the chosen subcommand's module is imported, so ``capkv check`` does not
    load torch unless a connector it names needs it.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in arguments if not a.startswith("-")), None)  # capkv's own options are all flags
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_WITHOUT_NUMPY, category=UserWarning)
        return _dispatch(arguments, chosen)


_TORCH_WITHOUT_NUMPY = "Failed to initialize NumPy"
"""What torch warns, once, when it is imported without numpy installed.

torch's wheels do not require numpy and capkv never converts a tensor to or
from numpy, so in a capkv command the warning says nothing that matters: the
command (and whatever torch it loads: ``demo``, ``bench``, a store named by
``check``) runs with it filtered.
"""


def _dispatch(arguments: list[str], chosen: str | None) -> int:
    parser = _Parser(prog="capkv", description="Typed, composable, checked KV-cache connectors.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    handler: _Subcommand | None = None
    for name, (module, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            handler = cast(_Subcommand, importlib.import_module(module))
            handler.add_arguments(sub)
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit:  # --help, or a bad option (already reported in one line)
        return exit.code if isinstance(exit.code, int) else 2
    prog = f"capkv {args.command}"
    if handler is None:  # argparse has refused any other command already
        _one_line(f"capkv: error: unknown command {args.command!r}")
        return 2
    try:
        return handler.run(args)
    except KeyboardInterrupt:
        _one_line(f"{prog}: interrupted")
        return 130
    except RecursionError:
        _one_line(f"{prog}: error: RecursionError: the input is nested too deeply")
        return 2
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        text = str(exc)
        _one_line(f"{prog}: error: {type(exc).__name__}{': ' + text if text else ''}")
        return 2


def _one_line(message: str) -> None:
    sys.stdout.flush()
    print(" ".join(message.split()) if "\n" in message else message, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())


publish(__name__)
