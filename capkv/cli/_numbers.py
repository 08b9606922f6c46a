"""Numeric command-line options: refused in one line when out of range, never replaced by a default."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_at_least"]


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse
