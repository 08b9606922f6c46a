"""The deliberately single-group connector: fine on one group, rejected before serving on several."""

from __future__ import annotations

from pathlib import Path

import pytest

from capkv import CapabilityError, MultiConnector, check_stack, supports_hma
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, SingleGroupOffloadConnector
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, make_spec

TWO_GROUPS = make_spec([Group(16), Group(16, window=32)], num_blocks=64)
ONE_GROUP = make_spec([Group(16)], num_blocks=64)


def test_only_the_reference_stores_are_hma_capable(tmp_path: Path) -> None:
    assert supports_hma(CPUOffloadConnector(TWO_GROUPS, capacity_blocks=4))
    assert supports_hma(FileStoreConnector(TWO_GROUPS, root=tmp_path))
    assert not supports_hma(SingleGroupOffloadConnector(TWO_GROUPS, capacity_blocks=4))


def test_check_stack_rejects_a_single_group_child_on_two_groups_before_serving(tmp_path: Path) -> None:
    stack = MultiConnector(
        CPUOffloadConnector(TWO_GROUPS, capacity_blocks=8),
        SingleGroupOffloadConnector(TWO_GROUPS, capacity_blocks=8),
        FileStoreConnector(TWO_GROUPS, root=tmp_path),
    )
    with pytest.raises(CapabilityError, match='sub-connector #2 "SingleGroupOffloadConnector" does not implement SupportsHMA') as caught:
        check_stack(stack, TWO_GROUPS)
    assert caught.value.connector == "#2 SingleGroupOffloadConnector" and caught.value.value == 2
    with pytest.raises(CapabilityError, match="cannot serve 2 KV-cache groups"):
        check_stack(SingleGroupOffloadConnector(TWO_GROUPS, capacity_blocks=8), TWO_GROUPS)
    check_stack(MultiConnector(CPUOffloadConnector(TWO_GROUPS, capacity_blocks=8), FileStoreConnector(TWO_GROUPS, root=tmp_path)), TWO_GROUPS)


def test_on_one_group_it_is_a_working_cache() -> None:
    connector = SingleGroupOffloadConnector(ONE_GROUP, capacity_blocks=16)
    check_stack(connector, ONE_GROUP)
    engine = MiniEngine(ONE_GROUP, connector)  # finish_request calls request_finished: one group
    prompt = tokens(40, 70)
    engine.run("first", prompt)
    second = engine.run("second", prompt)
    assert second.hit_tokens == 64 and len(second.loaded[0]) == 4


def test_driven_on_two_groups_anyway_it_refuses_instead_of_serving_group_zero() -> None:
    connector = SingleGroupOffloadConnector(TWO_GROUPS, capacity_blocks=16)
    request = Req("r", tokens(41, 40))
    with pytest.raises(CapabilityError, match="handles one KV-cache group and the engine has 2") as caught:
        connector.get_num_new_matched_tokens(request, 0)
    assert caught.value.method == "get_num_new_matched_tokens"
    with pytest.raises(CapabilityError, match="must call request_finished_all_groups"):
        connector.request_finished(request, [1, 2])


def test_the_hma_stores_refuse_a_single_group_finish_on_two_groups() -> None:
    connector = CPUOffloadConnector(TWO_GROUPS, capacity_blocks=16)
    with pytest.raises(CapabilityError, match="request_finished got one group's blocks"):
        connector.request_finished(Req("r", tokens(42, 40)), [1, 2])
