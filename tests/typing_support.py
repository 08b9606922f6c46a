"""Run typing-case files under mypy, mypy with ``capkv.mypy``, and pyright; compare with expectations.

A typing case is a Python file under ``tests/typing_cases/``. Lines that must
be rejected end with a marker comment::

    need_hma(MultiConnector(a, b))  # expect-error
    reveal_any(x)                   # expect-error[pyright, mypy+plugin]   (those checkers only)

Every other line must type-check, and ``assert_type`` calls pin inferred types.
The verdict is exact in both directions: an unexpected error fails the case,
and so does a marked line that starts passing.

A comment line ``# ^ CHECKER: MESSAGE`` pins the exact error messages CHECKER
gives for the code line above it (one pin per message, code suffix included).

Checkers must agree on every verdict. The one documented exception is marked
on its line with ``# divergence: REASON``: plain mypy accepts what the other
two reject (``Any`` children, see ``any_children.py``).
"""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKER_NAMES = ("mypy", "mypy+plugin", "pyright")
MARKER = re.compile(r"#\s*expect-error(?:\[(?P<only>[a-z+,\s-]+)\])?")
PIN = re.compile(r"^\s*#\s*\^\s*(?P<checker>[a-z+-]+):\s?(?P<message>.*)$")
DIVERGENCE = re.compile(r"#\s*divergence:")


@dataclass(frozen=True)
class Diagnostic:
    line: int
    message: str


def _only(match: re.Match[str]) -> set[str] | None:
    return None if match["only"] is None else {c.strip() for c in match["only"].split(",")}


def expected_lines(path: Path, checker: str) -> set[int]:
    """Line numbers (1-based) marked as expected errors for ``checker``."""
    lines: set[int] = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = MARKER.search(text)
        if match:
            only = _only(match)
            unknown = (only or set()) - set(CHECKER_NAMES)
            if unknown:
                raise ValueError(f"{path.name}:{number}: unknown checker(s) {sorted(unknown)}")
            if only is None or checker in only:
                lines.add(number)
    return lines


def pinned_messages(path: Path, checker: str) -> dict[int, list[str]]:
    """Messages pinned by ``# ^ checker: ...`` lines, by the code line they follow."""
    pins: dict[int, list[str]] = {}
    code_line = 0
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = PIN.match(text)
        if match is None:
            if text.strip() and not text.lstrip().startswith("#"):
                code_line = number
            continue
        if match["checker"] not in CHECKER_NAMES:
            raise ValueError(f"{path.name}:{number}: unknown checker {match['checker']!r}")
        if match["checker"] == checker:
            pins.setdefault(code_line, []).append(match["message"])
    return pins


def divergent_lines(path: Path) -> set[int]:
    """Lines carrying the documented ``# divergence:`` note."""
    return {n for n, t in enumerate(path.read_text().splitlines(), start=1) if DIVERGENCE.search(t)}


def verdict_lines(path: Path) -> set[int]:
    """Lines whose verdict the checkers must agree on (type pins differ by design: the plugin is more precise)."""
    return {
        n for n, t in enumerate(path.read_text().splitlines(), start=1)
        if t.strip() and not t.lstrip().startswith("#") and "assert_type(" not in t
    }


def count_cases(paths: Sequence[Path], checker: str) -> tuple[int, int, int]:
    """(must-pass ``assert_type`` checks, must-fail lines, pinned messages) for ``checker``."""
    must_pass = must_fail = pinned = 0
    for path in paths:
        lines = path.read_text().splitlines()
        expected = expected_lines(path, checker)
        must_pass += sum(1 for n, t in enumerate(lines, start=1) if "assert_type(" in t
                         and "import" not in t and n not in expected)
        must_fail += len(expected)
        pinned += sum(len(m) for m in pinned_messages(path, checker).values())
    return must_pass, must_fail, pinned


def _mypy_config(plugin: bool) -> Path:
    if not plugin:
        return ROOT / "mypy.ini"
    config = configparser.ConfigParser()
    config.read(ROOT / "mypy.ini")
    config["mypy"]["plugins"] = "capkv.mypy"
    handle = tempfile.NamedTemporaryFile("w", suffix=".ini", prefix="capkv-mypy-plugin-", delete=False)
    with handle:
        config.write(handle)
    return Path(handle.name)


def run_mypy(paths: Sequence[Path], *extra: str, plugin: bool = False) -> dict[Path, list[Diagnostic]]:
    """mypy --strict (the project's mypy.ini, plus ``capkv.mypy`` if asked) over ``paths``."""
    config = _mypy_config(plugin)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(config), "--no-incremental",
             "--show-error-codes", "--no-error-summary", "--hide-error-context", *extra, *map(str, paths)],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )
    finally:
        if plugin:
            config.unlink()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"mypy crashed:\n{proc.stdout}\n{proc.stderr}")
    found: dict[Path, list[Diagnostic]] = {Path(p).resolve(): [] for p in paths}
    for line in proc.stdout.splitlines():
        match = re.match(r"(?P<file>[^:]+):(?P<line>\d+): error: (?P<msg>.*)", line)
        if match:
            found.setdefault((ROOT / match["file"]).resolve(), []).append(
                Diagnostic(int(match["line"]), match["msg"])
            )
    return found


def run_mypy_plugin(paths: Sequence[Path]) -> dict[Path, list[Diagnostic]]:
    """mypy with ``plugins = capkv.mypy``."""
    return run_mypy(paths, plugin=True)


def run_pyright(paths: Sequence[Path]) -> dict[Path, list[Diagnostic]]:
    """pyright (standard mode) over ``paths``: error diagnostics by file."""
    proc = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"pyright gave no JSON:\n{proc.stdout}\n{proc.stderr}") from exc
    found: dict[Path, list[Diagnostic]] = {Path(p).resolve(): [] for p in paths}
    for diag in report["generalDiagnostics"]:
        if diag["severity"] == "error":
            found.setdefault(Path(diag["file"]).resolve(), []).append(
                Diagnostic(diag["range"]["start"]["line"] + 1, diag["message"])
            )
    return found


CHECKERS: dict[str, Callable[[Sequence[Path]], dict[Path, list[Diagnostic]]]] = {
    "mypy": run_mypy,
    "mypy+plugin": run_mypy_plugin,
    "pyright": run_pyright,
}


def verdict(path: Path, checker: str, diagnostics: list[Diagnostic]) -> list[str]:
    """Problems with ``path`` under ``checker``; empty when expectations and pins hold exactly."""
    expected = expected_lines(path, checker)
    got = {d.line for d in diagnostics}
    problems = [f"line {d.line}: unexpected error: {d.message}" for d in diagnostics if d.line not in expected]
    problems += [f"line {n}: expected an error, none reported" for n in sorted(expected - got)]
    for line, pins in sorted(pinned_messages(path, checker).items()):
        if line not in expected:
            problems.append(f"line {line}: messages pinned on a line not marked expect-error")
        messages = sorted(d.message for d in diagnostics if d.line == line)
        if messages != sorted(pins):
            problems.append(f"line {line}: pinned {sorted(pins)}, got {messages}")
    return problems


if __name__ == "__main__":  # python -m tests.typing_support: the suite's size per checker
    CASE_FILES = sorted(p for p in (ROOT / "tests" / "typing_cases").glob("*.py") if not p.name.startswith("_"))
    print(f"{len(CASE_FILES)} case files")
    for name in CHECKER_NAMES:
        passing, failing, pins = count_cases(CASE_FILES, name)
        verdicts = sum(len(verdict_lines(p)) for p in CASE_FILES)
        print(f"{name:<12} {failing} lines must fail, {passing} assert_type pins must hold, {pins} messages pinned ({verdicts} code lines checked)")
