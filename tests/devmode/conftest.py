"""Fixtures for the dev-mode tests.

Each contract test runs with dev mode requested. Normally that means the
contract is enforced; under ``python -O`` dev mode is forced off, and the same
test then checks the production promise instead: the very same object comes
back and bad input reaches the connector unchanged.
"""

from collections.abc import Iterator

import pytest

from capkv import devmode


@pytest.fixture(scope="package")
def dev() -> Iterator[bool]:
    """Dev mode requested; the value says whether it is in effect (``False`` under ``-O``).

    Package-scoped, so hypothesis examples share it: it holds no state.
    """
    with devmode.dev_mode(True) as on:
        yield on


@pytest.fixture
def production() -> Iterator[None]:
    """Dev mode switched off, as in a production process."""
    with devmode.dev_mode(False):
        yield
