"""``landed_tokens``: per tier, the loaded tokens the engine kept; a failed block costs its own and every later token.

``loaded_tokens`` counts what the engine accepted from each tier's slice; the demo's per-tier rows count what
landed (issue 35: a run's loaded tokens count only loads that landed).
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

from capkv import KVConnectorOutput, MultiConnector
from tests.fakes import HMA
from tests.fakes import Req as Id
from tests.test_tiers import spec, tiered


def _three_tiers(*, back_async: bool = False) -> Any:
    """Tokens 0-32 from #1, 32-64 from #2, 64-96 from #3 (blocks of 16 and 32 tokens: two groups)."""
    tiers = (HMA("a", hit=tiered(0, 32), slices=True), HMA("b", hit=tiered(32, 64), slices=True),
             HMA("c", hit=tiered(64, 96), slices=True, load_async=back_async))
    stack = MultiConnector(*tiers)
    stack.bind_kv_spec(spec(16, 32))
    return stack


BLOCKS = ([10, 11, 12, 13, 14, 15], [20, 21, 22])
"""Group 0: six blocks of 16 tokens; group 1: three of 32."""


def _load(stack: Any, request_id: str = "r") -> None:
    request = Id(request_id)
    tokens, _ = stack.get_num_new_matched_tokens(request, 0)
    stack.update_state_after_alloc(request, ([*BLOCKS[0]], [*BLOCKS[1]]), tokens)
    stack.bind_connector_metadata(stack.build_connector_meta(None))
    stack.get_finished(set())
    stack.clear_connector_metadata()


def test_every_accepted_token_lands_without_errors() -> None:
    stack = _three_tiers()
    _load(stack)
    stack.update_connector_output(KVConnectorOutput())
    assert stack.loaded_tokens == stack.landed_tokens == (32, 32, 32)


def test_a_failed_block_costs_its_tier_from_that_block_on_and_every_later_tier() -> None:
    stack = _three_tiers()
    _load(stack)
    stack.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({13})}))  # tokens 48-64
    assert stack.loaded_tokens == (32, 32, 32)
    assert stack.landed_tokens == (32, 16, 0)


def test_the_earliest_failed_block_of_any_group_counts() -> None:
    stack = _three_tiers()
    _load(stack)
    stack.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({15}), 1: frozenset({20})}))
    assert stack.landed_tokens == (0, 0, 0), "group 1's first block (tokens 0-32) failed"


def test_an_asynchronous_loads_errors_count_until_its_receive_and_not_after() -> None:
    stack = _three_tiers(back_async=True)
    _load(stack)
    stack.update_connector_output(KVConnectorOutput())
    stack.update_connector_output(KVConnectorOutput(finished_recving=frozenset({"r"}),
                                                    invalid_block_ids={0: frozenset({14})}))
    assert stack.landed_tokens == (32, 32, 0)
    stack.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({10})}))
    assert stack.landed_tokens == (32, 32, 0), "the load settled: a later error names another load's block"


def test_a_second_report_of_the_same_load_only_moves_the_cut_earlier() -> None:
    stack = _three_tiers(back_async=True)
    _load(stack)
    stack.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({13})}))
    stack.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({15})}))
    assert stack.landed_tokens == (32, 16, 0)
    stack.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({11})}))
    assert stack.landed_tokens == (16, 0, 0)


def test_the_books_survive_copy_and_pickle() -> None:
    stack = _three_tiers(back_async=True)
    _load(stack)
    for twin in (copy.copy(stack), copy.deepcopy(stack), pickle.loads(pickle.dumps(stack))):
        twin.update_connector_output(KVConnectorOutput(invalid_block_ids={0: frozenset({12})}))
        assert twin.landed_tokens == (32, 0, 0)
    assert stack.landed_tokens == (32, 32, 32), "a copy's books are its own"
