"""capkv 0.2.0's ``capkv.vllm`` names still import from ``capkv.vllm`` (the rest: ``tests/test_surface.py``).

Skipped only where vLLM is absent (tests/vllm/conftest.py); the ``vllm`` and ``vllm33`` tox environments
set ``CAPKV_REQUIRE_VLLM=1``, where a missing vLLM fails the run instead.
"""

from __future__ import annotations

import pytest

from tests.test_surface import NEEDS_VLLM, SURFACE, check_still_public

ROWS = [row for row in SURFACE if row[0] in NEEDS_VLLM]


def test_the_vllm_rows_are_there() -> None:
    assert [name for _, name in ROWS] == ["CapkvConnector", "CapkvHMAConnector", "HMAVllmChild", "MultiConnector",
                                          "VllmChild", "wrap"]


@pytest.mark.parametrize(("module", "name"), ROWS, ids=[f"{m}.{n}" for m, n in ROWS])
def test_every_0_2_0_vllm_name_still_imports_from_capkv_vllm(module: str, name: str) -> None:
    check_still_public(module, name)
