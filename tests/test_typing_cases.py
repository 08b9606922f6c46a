"""The typing-case suite: what must and must not type-check, under mypy and pyright."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.typing_support import Diagnostic, run_mypy, run_pyright, verdict

CASES = sorted(p for p in (Path(__file__).parent / "typing_cases").glob("*.py") if not p.name.startswith("_"))
CHECKERS = {"mypy": run_mypy, "pyright": run_pyright}


@pytest.fixture(scope="session")
def diagnostics() -> dict[str, dict[Path, list[Diagnostic]]]:
    return {name: run(CASES) for name, run in CHECKERS.items()}


@pytest.mark.parametrize("checker", sorted(CHECKERS))
@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_typing_case(case: Path, checker: str, diagnostics: dict[str, dict[Path, list[Diagnostic]]]) -> None:
    problems = verdict(case, checker, diagnostics[checker][case.resolve()])
    assert not problems, f"{case.name} under {checker}:\n" + "\n".join(problems)


def test_the_suite_has_cases() -> None:
    assert len(CASES) >= 4
