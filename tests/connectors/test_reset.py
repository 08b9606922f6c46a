"""``reset_cache``: nothing a store held before the reset is offered after it (vLLM's ``reset_prefix_cache``)."""

from __future__ import annotations

from capkv.connectors import CPUOffloadConnector
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import Group, make_spec

PREFIX = tokens(50, 64)  # four full blocks shared by the prompts below
ONE = PREFIX + tokens(51, 20)
OTHER = PREFIX + tokens(52, 20)


def test_after_a_reset_nothing_from_before_is_offered_and_requests_running_across_it_save_nothing() -> None:
    spec = make_spec([Group(16)], num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=64)
    engine = MiniEngine(spec, connector)
    engine.run("one", ONE)
    assert engine.run("again", ONE).hit_tokens == 80  # held before the reset
    across = engine.run("across", OTHER, finish=False)  # computed before the reset, finishes after it
    assert connector.reset_cache() is True
    assert engine.run("after", ONE).hit_tokens == 0, "KV from before the reset was offered after it"
    engine.finish(across)
    engine.step()
    # what "after" computed after the reset is offered; what "across" computed before it is not saved
    assert engine.run("last", OTHER).hit_tokens == 64
