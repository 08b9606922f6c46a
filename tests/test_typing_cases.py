"""The typing-case suite: what must and must not type-check, under mypy, mypy + capkv.mypy, and pyright."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.typing_support import (
    CHECKERS,
    Diagnostic,
    divergent_lines,
    expected_lines,
    pinned_messages,
    verdict,
    verdict_lines,
)

CASES = sorted(p for p in (Path(__file__).parent / "typing_cases").glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="session")
def diagnostics() -> dict[str, dict[Path, list[Diagnostic]]]:
    with ThreadPoolExecutor(len(CHECKERS)) as pool:  # the checkers are separate processes
        runs = {name: pool.submit(run, CASES) for name, run in CHECKERS.items()}
        return {name: run.result() for name, run in runs.items()}


@pytest.mark.parametrize("checker", sorted(CHECKERS))
@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_typing_case(case: Path, checker: str, diagnostics: dict[str, dict[Path, list[Diagnostic]]]) -> None:
    problems = verdict(case, checker, diagnostics[checker][case.resolve()])
    assert not problems, f"{case.name} under {checker}:\n" + "\n".join(problems)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_verdicts_agree(case: Path, diagnostics: dict[str, dict[Path, list[Diagnostic]]]) -> None:
    """Every checker rejects the same lines; only ``# divergence:`` lines may differ, and only one way."""
    rejected = {name: {d.line for d in found[case.resolve()]} & verdict_lines(case) for name, found in diagnostics.items()}
    divergent = divergent_lines(case)
    assert rejected["mypy+plugin"] == rejected["pyright"], f"{case.name}: the plugin and pyright disagree"
    plain_only_accepts = rejected["pyright"] - rejected["mypy"]
    assert rejected["mypy"] <= rejected["pyright"], f"{case.name}: plain mypy rejects lines pyright accepts"
    assert plain_only_accepts == divergent, (
        f"{case.name}: plain mypy diverges on lines {sorted(plain_only_accepts)}, documented {sorted(divergent)}"
    )


def test_plugin_messages_are_pinned() -> None:
    """The plugin's explanations are pinned, not merely its verdicts."""
    pins = [msg for case in CASES for msgs in pinned_messages(case, "mypy+plugin").values() for msg in msgs]
    assert sum("[capkv-hma]" in msg for msg in pins) >= 10


def test_the_suite_has_cases() -> None:
    assert len(CASES) >= 5
