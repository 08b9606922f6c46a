"""What a conformance run found: one result per (layout, placement), and the whole report."""

from __future__ import annotations

from dataclasses import dataclass

from capkv._homes import publish

__all__ = ["ConformanceFailure", "ConformanceReport", "ScenarioResult"]


@dataclass(frozen=True)
class ScenarioResult:
    """One layout served cold and warm with the connector at one place."""

    layout: str
    placement: str
    """``"alone"``, or where the connector sits in a stack with a capkv connector."""
    cold_loaded_tokens: tuple[int, ...]
    """Tokens whose KV was loaded through the connector (or stack) in the cold run, per group."""
    warm_loaded_tokens: tuple[int, ...]
    """The same in the warm run, after the engine forgot its prefix cache and poisoned its KV."""
    warm_prompt_tokens: int
    failure: str | None = None
    """Why the scenario failed; ``None`` when it passed."""

    @property
    def ok(self) -> bool:
        return self.failure is None

    def line(self) -> str:
        verdict = "ok  " if self.ok else "FAIL"
        loaded = "/".join(f"{n:,}" for n in self.warm_loaded_tokens) or "-"
        text = f"  {verdict} {self.layout:<50} {self.placement:<35} warm loaded {loaded}"
        return text if self.failure is None else f"{text}\n       {self.failure}"


@dataclass(frozen=True)
class ConformanceReport:
    """Every scenario :func:`~capkv.testing.check_connector` ran, and the layouts it did not serve."""

    connector: str
    hma: bool
    results: tuple[ScenarioResult, ...]
    not_served: tuple[str, ...] = ()
    """Layouts left out, each with the reason (a non-HMA connector serves 1-group layouts only)."""

    @property
    def ok(self) -> bool:
        """Every scenario passed (and at least one ran)."""
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def failures(self) -> tuple[ScenarioResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    def __str__(self) -> str:
        passed = sum(r.ok for r in self.results)
        head = (
            f"capkv.testing: {self.connector} ({'HMA' if self.hma else 'single group'}): "
            f"{passed} of {len(self.results)} scenarios passed"
        )
        lines = [head, *(r.line() for r in self.results)]
        lines += [f"  not served: {why}" for why in self.not_served]
        if not self.results:
            lines.append("  no scenario ran")
        return "\n".join(lines)


class ConformanceFailure(AssertionError):
    """A connector failed the conformance kit; the message is the whole report."""

    def __init__(self, report: ConformanceReport) -> None:
        super().__init__(str(report))
        self.report = report


publish(__name__)
