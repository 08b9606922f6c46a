"""``--model`` for every benchmark (the presets of :mod:`capkv.engine._presets`, chosen by name), and the
process state a serving engine runs its connectors in.

One table of model shapes lives in capkv (``capkv bench transfer`` uses it too); this only adds the
command-line option. :func:`engine_heap` freezes the garbage collector's heap as vLLM's engine does after
startup (``freeze_gc_heap``): otherwise a timed load that allocates pays for full collections over every
object torch and the benchmark made at import (about 0.25 s each here), which no engine pays.
"""

from __future__ import annotations

import argparse
import gc
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from capkv.engine._presets import MODEL_PRESETS, ModelPreset, model_presets

__all__ = ["PresetFigures", "add_model_argument", "chosen_models", "engine_heap", "print_summary", "spread"]


def add_model_argument(parser: argparse.ArgumentParser, *, default: Sequence[str]) -> None:
    """``--model NAME [NAME ...]`` (or ``all``), defaulting to ``default``."""
    parser.add_argument(
        "--model", nargs="+", default=list(default), choices=[*MODEL_PRESETS, "all"], metavar="MODEL",
        help=f"model shapes to measure: {', '.join(MODEL_PRESETS)} or all (default: {' '.join(default)})",
    )


def chosen_models(args: argparse.Namespace) -> list[ModelPreset]:
    """The presets ``--model`` named, in order."""
    names: list[str] = args.model
    return model_presets(names)


def spread(values: Sequence[float]) -> str:
    """``median (range low-high)`` of ratios, two decimals."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return f"{ordered[0]:.2f}"
    return f"{statistics.median(ordered):.2f} (range {ordered[0]:.2f}-{ordered[-1]:.2f})"


class PresetFigures(Protocol):
    """One preset's rounds: the connector against the best plain strategy, each way."""

    @property
    def preset(self) -> ModelPreset: ...

    def winner(self, way: str) -> str: ...

    def ratios(self, way: str) -> list[float]: ...


def print_summary(figures: Sequence[PresetFigures], connector: str) -> None:
    """With several presets, one line each: save and load against the winning baseline (median of the rounds)."""
    if len(figures) <= 1:
        return
    print(f"\nsummary: {connector} / best plain baseline, median of the rounds' ratios (the winning baseline in brackets)")
    for found in figures:
        print(f"  {found.preset.name:<11} save {statistics.median(found.ratios('save')):.2f}x "
              f"[{found.winner('save')}]   load {statistics.median(found.ratios('load')):.2f}x "
              f"[{found.winner('load')}]")


@contextmanager
def engine_heap() -> Iterator[None]:
    """The heap made so far collected and frozen (as vLLM's ``freeze_gc_heap`` after startup), until exit."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
