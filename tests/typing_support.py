"""Run typing-case files under mypy and pyright and compare with their expectations.

A typing case is a Python file under ``tests/typing_cases/``. Lines that must
be rejected end with a marker comment::

    need_hma(MultiConnector(a, b))  # expect-error
    reveal_any(x)                   # expect-error[pyright]   (one checker only)

Every other line must type-check, and ``assert_type`` calls pin inferred types.
The verdict is exact in both directions: an unexpected error fails the case,
and so does a marked line that starts passing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"#\s*expect-error(?:\[(?P<only>[a-z+-]+)\])?")


@dataclass(frozen=True)
class Diagnostic:
    line: int
    message: str


def expected_lines(path: Path, checker: str) -> set[int]:
    """Line numbers (1-based) marked as expected errors for ``checker``."""
    lines: set[int] = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = MARKER.search(text)
        if match and match["only"] in (None, checker):
            lines.add(number)
    return lines


def count_cases(paths: Sequence[Path], checker: str) -> tuple[int, int]:
    """(``assert_type`` checks that must pass, lines that must fail) under ``checker``."""
    must_pass = sum(len(re.findall(r"^\s*assert_type\(", p.read_text(), re.M)) for p in paths)
    must_fail = sum(len(expected_lines(p, checker)) for p in paths)
    return must_pass, must_fail


def run_mypy(paths: Sequence[Path], *extra: str) -> dict[Path, list[Diagnostic]]:
    """mypy --strict (the project's mypy.ini) over ``paths``: error diagnostics by file."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), "--no-incremental",
         "--show-error-codes", "--no-error-summary", "--hide-error-context", *extra, *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
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


def verdict(path: Path, checker: str, diagnostics: list[Diagnostic]) -> list[str]:
    """Problems with ``path`` under ``checker``; empty when expectations hold exactly."""
    expected = expected_lines(path, checker)
    got = {d.line for d in diagnostics}
    problems = [f"line {d.line}: unexpected error: {d.message}" for d in diagnostics if d.line not in expected]
    problems += [f"line {n}: expected an error, none reported" for n in sorted(expected - got)]
    return problems


if __name__ == "__main__":
    cases = sorted(p for p in (ROOT / "tests" / "typing_cases").glob("*.py") if not p.name.startswith("_"))
    for name in ("mypy", "pyright"):
        passing, failing = count_cases(cases, name)
        print(f"{name}: {len(cases)} files, {passing} assert_type must-pass, {failing} must-fail lines")
