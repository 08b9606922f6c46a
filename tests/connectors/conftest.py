"""Connector factories shared by the connector tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capkv import KVSpec, MultiConnector
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from tests.paged import Group, make_spec

Factory = Callable[[KVSpec, Path], Any]

CONNECTORS: dict[str, Factory] = {
    "cpu": lambda spec, root: CPUOffloadConnector(spec, capacity_blocks=64),
    "file": lambda spec, root: FileStoreConnector(spec, root=root),
    "stack(cpu,file)": lambda spec, root: MultiConnector(
        CPUOffloadConnector(spec, capacity_blocks=64), FileStoreConnector(spec, root=root)
    ),
    "stack(file,cpu)": lambda spec, root: MultiConnector(
        FileStoreConnector(spec, root=root), CPUOffloadConnector(spec, capacity_blocks=64)
    ),
}

GEOMETRIES = {
    "full+window": [Group(16), Group(16, window=32)],
    "block sizes 16/32": [Group(16), Group(32, window=64)],
    "three groups": [Group(16, layers=1), Group(16, layers=2, window=16), Group(32, layers=3)],
}


def flush(connector: Any) -> None:
    """Wait for file stores' background writes, wherever they sit in a stack."""
    for child in getattr(connector, "children", (connector,)):
        if isinstance(child, FileStoreConnector):
            child.flush()
        elif hasattr(child, "children"):
            flush(child)


def tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(count)]


@pytest.fixture(params=sorted(GEOMETRIES))
def spec(request: pytest.FixtureRequest) -> KVSpec:
    return make_spec(GEOMETRIES[request.param], num_blocks=64)
