"""The lazy fronts type exactly: every export has its real type, and a name a front lacks is an error.

The fronts resolve names at run time with a module ``__getattr__`` that type
checkers never see (it would make every misspelling ``Any``). Names 0.2.0
deprecated and 0.3.0 removed (``capkv.instrument``, ``capkv.engine.Request``) are
errors too.
"""

from __future__ import annotations

from typing_extensions import assert_type

import capkv
import capkv.connectors
import capkv.devmode
import capkv.engine
from capkv import KVSpec
from capkv.connectors import CPUOffloadConnector
from capkv.devmode import instrument
from capkv.engine import Engine, ModelShape

assert_type(capkv.KVSpec, type[KVSpec])
assert_type(capkv.connectors.CPUOffloadConnector, type[CPUOffloadConnector])
assert_type(capkv.devmode.enabled(), bool)


def wrap(store: CPUOffloadConnector, spec: KVSpec) -> None:
    assert_type(instrument(store, spec), CPUOffloadConnector)
    assert_type(capkv.MultiConnector(store), capkv.HMAMultiConnector[CPUOffloadConnector])


assert_type(capkv.engine.Engine, type[Engine])
assert_type(ModelShape, type[ModelShape])

capkv.KVSpecs  # expect-error
capkv.connectors.CPUOffload  # expect-error
capkv.instrumented  # expect-error
from capkv.engine import Requests  # expect-error
from capkv.devmode import check_block_id  # expect-error
capkv.instrument  # expect-error
from capkv.engine import Request  # expect-error
from capkv.contracts import KVSpec as ContractsKVSpec  # expect-error
