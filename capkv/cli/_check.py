"""``capkv check CONFIG [--groups N]``: can this configured stack serve the engine?

Decided from the classes, before anything is built, in the words :func:`capkv.check_stack` and the mypy plugin
use (README, "Checking a configured stack"; the rules: docs/internals.md, "The command line").
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from capkv.capabilities._hma import supports_hma
from capkv.capabilities._serving import require_hma
from capkv.cli._host_check import host_lines, host_problems, load_hosted_file
from capkv.cli._stack_tree import Findings, Inspected, inspect_stack, tree_lines, walk
from capkv.cli._vllm_facts import vllm_fact_line
from capkv.cli._vllm_judge import Verdict, build_as_vllm, judge, vllm_loads
from capkv.cli._vllm_sleep import sleep_mode_asked
from capkv.config._build import call_user_code
from capkv.config._hosts import host_entry
from capkv.config._loader import ConfiguredNode, ConfiguredStack, load_stack, read_config_file
from capkv.errors import CapkvError, ConfigError

__all__ = ["add_arguments", "run"]

_PROG = "capkv check"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``check`` subcommand's options."""
    parser.add_argument("config", metavar="CONFIG", help="stack file (.json or .toml) shaped like vLLM's kv_transfer_config")
    parser.add_argument(
        "--groups", type=_positive_int, default=None, metavar="N",
        help="KV-cache groups the engine has (default: answer for 1 and for 2 or more)",
    )
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import MODULE first, so its @register_connector classes are known (repeatable)",
    )
    parser.add_argument(
        "--classes-only", action="store_true",
        help="build no connector: only what the classes answer (facts a connector decides per instance show ?)",
    )
    parser.add_argument(
        "--build", action="store_true",
        help="for a configuration vLLM reads as its own: also build its connectors, as vLLM builds them",
    )
    parser.add_argument(
        "--enable-sleep-mode", action="store_true",
        help="the engine runs with vLLM's enable_sleep_mode: judge whether vLLM accepts the connector for it",
    )


def run(args: argparse.Namespace) -> int:
    """Check the stack file; print the tree, then one line per problem."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "module:Class" paths resolve like ``python -m``
    try:
        for module in args.imports:
            import_user_module(module)
        data = read_config_file(args.config)
        if vllm_loads(data):
            return _run_vllm(data, args)
        hosted, configured = load_hosted_file(args.config)
    except ConfigError as exc:
        _error(str(exc))
        return 2
    if _sleep_mode(data, args):
        print("sleep mode is not judged: only on a configuration vLLM reads as its own (vLLM asks its connector class)")
    findings = Findings()
    # from classes: nothing built yet; a capkv host's refusal says it all
    findings.problems += host_problems(hosted, configured) or _capability_problems(configured, args.groups or 1)
    root = inspect_stack(configured, build=not args.classes_only, findings=findings)
    for line in tree_lines(root):
        print(line)
    for line in host_lines(hosted, configured):
        print(line)
    unbuildable = list(dict.fromkeys(reason for node in walk(root) for reason in node.missing_because))
    for problem in findings.problems:
        _error(problem)
    for error in findings.errors:
        _error(error)
    for reason in unbuildable:
        _error(f"{reason} (layouts and finished counts are unchecked; --classes-only skips building)")
    if findings.problems:
        return 1
    if unbuildable or findings.errors:
        return 2
    print(_verdict(configured, args.groups, _ok_note(root, args.classes_only)))
    return 0


def _run_vllm(data: dict[str, object], args: argparse.Namespace) -> int:
    """A configuration vLLM reads as its own: capkv's view of it (from classes), then what vLLM does with it."""
    judgement = judge(data, sleep_mode=_sleep_mode(data, args))
    findings = Findings()
    try:
        hosted = host_entry(data)
        configured: ConfiguredNode | None = load_stack(data if hosted is None else hosted.stack)
    except ConfigError:
        configured, hosted = None, None  # vLLM's refusal says why, below
    if configured is not None:
        decided = judgement.hma

        def by_vllm(node: Inspected) -> bool | None:
            return decided.get(node.node.position)

        root = inspect_stack(configured, build=False, findings=findings)
        for line in tree_lines(root, hma=None if hosted is not None else by_vllm):
            print(line)
        for line in host_lines(hosted, configured):
            print(line)
        _print_vllm_facts(configured)
    if judgement.verdict is Verdict.REFUSED:
        _error(judgement.reason)
        return 2
    problems = findings.errors if hosted is not None else []  # a hosted stack's options are the host's to refuse
    if args.build:
        problems = [*problems, *build_as_vllm(data)]
    if problems:
        for problem in problems:
            _error(f"vLLM refuses this configuration: {problem}")
        return 2
    if judgement.sleep is not None:
        print(judgement.sleep)
    print(("ok: " if judgement.verdict is Verdict.HMA_ON else "") + judgement.reason)
    return 0 if judgement.verdict is Verdict.HMA_ON else 1


def _print_vllm_facts(configured: ConfiguredNode) -> None:
    try:
        line = vllm_fact_line(configured)
    except Exception as exc:  # noqa: BLE001 (a vLLM class's own code: reported, the check goes on)
        line = f"vLLM 0.34 is told nothing here: {type(exc).__name__}: {exc}"
    if line is not None:
        print(line)


def _sleep_mode(data: dict[str, object], args: argparse.Namespace) -> bool:
    enabled: object = getattr(args, "enable_sleep_mode", False)
    return enabled is True or sleep_mode_asked(data)


def _verdict(configured: ConfiguredNode, groups: int | None, note: str) -> str:
    """The ``ok`` line: for the groups asked about, or — unasked — for 1 and for 2 or more."""
    if groups is not None:
        return f"ok: the stack can serve {_groups(groups)}{note}"
    if supports_hma(_subject(configured)):
        return f"ok: the stack can serve any number of KV-cache groups (HMA-capable){note}"
    why = _capability_problems(configured, 2)
    return f"ok for 1 KV-cache group{note}; not for 2 or more: {why[0] if why else 'not HMA-capable'}"


def _groups(count: int) -> str:
    return "1 KV-cache group" if count == 1 else f"{count} KV-cache groups"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of groups, got {text!r}")
    return value


def import_user_module(module: str, option: str = "--import") -> None:
    """Import a user's module (its registrations become known); any failure is one ``ConfigError``."""
    def load() -> object:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f'cannot import "{module}" ({option}): {type(exc).__name__}: {exc}', value=module) from None
    call_user_code(load, f'cannot import "{module}" ({option})', module, module, "import")


def _error(message: str) -> None:
    print(f"{_PROG}: error: {' '.join(message.split())}", file=sys.stderr)  # one line, whatever a connector wrote


def _subject(configured: ConfiguredNode) -> object:
    return configured if isinstance(configured, ConfiguredStack) else configured.cls


def _capability_problems(configured: ConfiguredNode, groups: int) -> list[str]:
    try:
        require_hma(_subject(configured), groups)
    except CapkvError as exc:
        return [str(exc)]
    return []


def _ok_note(root: Inspected, classes_only: bool) -> str:
    if classes_only:
        return " (classes only)"
    unbuilt = [node.node.position or node.node.cls.__name__ for node in walk(root) if node.own_failure]
    if not unbuilt:
        return ""
    return f" ({', '.join(unbuilt)} not built from extra config: facts from their classes)"
