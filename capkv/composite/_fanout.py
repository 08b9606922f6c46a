"""Calling every child even when one raises, then raising one error.

A composite that stops at the first failing child leaves the later ones uncalled and drops what the earlier
ones handed over.
"""

from __future__ import annotations

from capkv.errors import ContractError, SubConnectorError

__all__ = ["ATTACHED", "HELD", "TOLD", "Failures", "bad_answer", "failure"]

Failures = list[tuple[int, Exception]]
"""(child index, what it raised) for one call, in stack order."""

HELD = "what the others handed over is kept and returned by the next call of this method"
TOLD = "each of the others got the call"
ATTACHED = (
    "the metadata built from the others is attached as .partial: ship it as this step's metadata (the "
    "failed child sits the step out); the stack's own bookkeeping is sent again with the next metadata"
)


def failure(stack: str, names: tuple[str, ...], method: str, failures: Failures, outcome: str,
            *, partial: object = None) -> SubConnectorError:
    """The one error for a fan-out in which ``failures`` happened (its cause: the first one)."""
    detail = "; ".join(_describe(names[index], exc) for index, exc in failures)
    error = SubConnectorError(
        f"{stack}.{method}: {detail}; {outcome}",
        tuple(exc for _, exc in failures),
        connector=", ".join(names[index] for index, _ in failures),
        method=method,
        partial=partial,
    )
    error.__cause__ = failures[0][1]
    return error


def bad_answer(name: str, method: str, answer: object, expected: str) -> ContractError:
    """capkv's verdict on a child's answer of the wrong shape (a porting slip, typically)."""
    return ContractError(
        f"{name}.{method} returned {type(answer).__name__} {answer!r}; expected {expected}",
        connector=name,
        method=method,
        value=answer,
        expected=expected,
    )


def _describe(name: str, exc: Exception) -> str:
    if isinstance(exc, ContractError) and exc.connector == name:
        return str(exc)  # capkv's verdict on the child's answer names the child itself
    return f"{name} raised {type(exc).__name__}: {exc}"
