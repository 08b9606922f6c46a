"""The conformance kit on capkv's own connectors (they pass) and on broken ones (each fails, saying why)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from capkv import KVSpec
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, SingleGroupOffloadConnector
from capkv.testing import (
    DEFAULT_LAYOUTS,
    ConformanceFailure,
    ConformanceReport,
    HMANullConnector,
    NullConnector,
    assert_conformant,
    check_connector,
)
from tests.testing import broken

ONE_GROUP, TWO_GROUPS = DEFAULT_LAYOUTS[0], DEFAULT_LAYOUTS[2]


def test_cpu_offload_connector_conforms() -> None:
    report = assert_conformant(lambda spec: CPUOffloadConnector(spec, capacity_blocks=2048))
    assert report.hma and len(report.results) == 4 * len(DEFAULT_LAYOUTS) and not report.not_served
    for result in report.results:  # every group loads in the warm run, wherever the connector sits
        assert all(tokens > 0 for tokens in result.warm_loaded_tokens), result


def test_file_store_connector_conforms(tmp_path: Path) -> None:
    def factory(spec: KVSpec) -> FileStoreConnector:
        return FileStoreConnector(spec, root=tmp_path / uuid.uuid4().hex)

    report = assert_conformant(factory, before_warm=FileStoreConnector.flush)
    alone = [r for r in report.results if r.placement == "alone"]
    assert len(alone) == len(DEFAULT_LAYOUTS) and all(min(r.warm_loaded_tokens) > 0 for r in alone)


def test_single_group_connector_is_served_on_one_group_layouts_only() -> None:
    report = assert_conformant(lambda spec: SingleGroupOffloadConnector(spec, capacity_blocks=2048))
    assert not report.hma
    assert {r.layout for r in report.results} == {"1 group (full), blocks 16, bfloat16", "1 group (full), blocks 32, float16"}
    assert len(report.not_served) == len(DEFAULT_LAYOUTS) - 2
    assert all("not HMA-capable" in why for why in report.not_served)
    # 6 requests of 133 prompt tokens, one left to compute: 128 tokens each load, in 16- or 32-token blocks
    assert [r.warm_loaded_tokens for r in report.results] == [(768,)] * 8  # 2 layouts x 4 placements


def test_a_connector_that_loads_slices_is_served_behind_a_front_tier() -> None:
    report = assert_conformant(lambda spec: CPUOffloadConnector(spec, capacity_blocks=2048), layouts=[TWO_GROUPS])
    behind = [r for r in report.results if r.placement.startswith("behind a front tier")]
    assert len(behind) == 1 and behind[0].warm_loaded_tokens == (6 * 128, 6 * 32), "the two tiers load it all"


def test_a_connector_that_loads_no_slices_is_not_served_behind_a_front_tier() -> None:
    report = check_connector(lambda spec: HMANullConnector(), layouts=[ONE_GROUP], require_loads=False)
    assert [r.placement for r in report.results] == [
        "alone", "first in Multi(yours, CPUOffload)", "second in Multi(CPUOffload, yours)"]


def test_a_connector_claiming_slices_it_does_not_load_fails() -> None:
    (failure,) = _failures(broken.SlicesClaimed, layouts=[ONE_GROUP])
    assert failure.startswith("the warm run loaded nothing through the connector behind a front tier"), failure


def test_a_connector_that_writes_the_null_block_fails() -> None:
    (failure,) = _failures(broken.WritesNullBlocks, layouts=[TWO_GROUPS], stacks=False)
    assert "wrote into the null block (block 0, group 1" in failure, failure


def test_report_says_what_loaded_per_group() -> None:
    report = check_connector(lambda spec: CPUOffloadConnector(spec, capacity_blocks=2048), layouts=[TWO_GROUPS], stacks=False)
    (result,) = report.results
    # 6 requests of 133 prompt tokens: 128 tokens each in 16-token blocks; the 32-token window needs 2 blocks
    assert result.warm_loaded_tokens == (6 * 128, 6 * 32)
    assert result.cold_loaded_tokens == (0, 0)
    assert "warm loaded 768/192" in str(report)


# ---- broken connectors: each fails, and the message says what went wrong ----------------------------


def _failures(factory: Any, **options: Any) -> list[str]:
    report = check_connector(factory, **options)
    assert not report.ok
    return [r.failure or "" for r in report.failures]


def test_wrong_bytes_loaded_fail_naming_the_block() -> None:
    (failure,) = _failures(broken.OffByOne, layouts=[ONE_GROUP], stacks=False)
    assert re.match(
        r"warm run: wrong KV in group 0: request warm-\d+, group 0, layer layers\.\d\.attn, block \d+ "
        r"\(#\d+ of its table\), token position \d+, checked after load; the connector loaded bytes", failure
    ), failure


def test_truncation_to_group_0_fails_naming_group_1() -> None:
    failures = _failures(broken.Group0Only, layouts=[ONE_GROUP, TWO_GROUPS], stacks=False)
    (failure,) = failures  # the 1-group layout passes: group 0 is all there is
    assert failure.startswith("warm run: wrong KV in group 1:") and "group 0 only" in failure, failure


def test_early_free_is_named() -> None:
    (failure,) = _failures(broken.EarlyFree, layouts=[ONE_GROUP], stacks=False)
    assert failure.startswith("early free: warm run: wrong KV in group 0"), failure
    assert "delay_free=True" in failure


def test_a_delayed_free_never_reported_fails_in_bounded_time() -> None:
    (failure,) = _failures(broken.NeverReports, layouts=[ONE_GROUP], stacks=False, transfer_timeout_s=0.3)
    assert failure.startswith("cold run: ContractError: "), failure
    assert re.search(r"requests \['cold-\d+'.*\] finished with delay_free=True were never reported in finished_sending", failure)


def test_a_delayed_free_reported_twice_fails() -> None:
    (failure,) = _failures(broken.ReportsTwice, layouts=[ONE_GROUP], stacks=False)
    assert "get_finished reported finished_sending for request 'cold-" in failure
    assert "whose blocks it did not keep" in failure


def test_flat_load_errors_fail() -> None:
    (failure,) = _failures(broken.FlatLoadErrors, layouts=[ONE_GROUP], stacks=False)
    assert "get_block_ids_with_load_errors returned a set ({1, 2}); expected a dict {group index: set of block ids}" in failure


def test_load_errors_under_the_wrong_group_fail() -> None:
    (failure,) = _failures(broken.WrongGroupLoadErrors, layouts=[TWO_GROUPS], stacks=False)
    assert "as failed, but no request is loading into them in that group" in failure
    assert "of group 1" in failure


def test_broken_connector_fails_inside_a_stack_too() -> None:
    report = check_connector(broken.OffByOne, layouts=[ONE_GROUP])
    by_place = {r.placement: r for r in report.results}
    assert not by_place["alone"].ok and not by_place["first in Multi(yours, CPUOffload)"].ok
    assert by_place["second in Multi(CPUOffload, yours)"].ok  # the capkv connector loads first there


def test_assert_conformant_raises_an_assertion_error_with_the_report() -> None:
    with pytest.raises(ConformanceFailure) as raised:
        assert_conformant(broken.OffByOne, layouts=[ONE_GROUP], stacks=False)
    assert isinstance(raised.value, AssertionError)
    assert isinstance(raised.value.report, ConformanceReport)
    assert str(raised.value).startswith("capkv.testing: OffByOne (HMA): 0 of 1 scenarios passed")


def test_a_connector_that_stores_nothing_fails_unless_told() -> None:
    (failure,) = _failures(lambda spec: HMANullConnector(), layouts=[ONE_GROUP], stacks=False)
    assert failure.startswith("the warm run's hits covered 0 of the 768 prompt tokens a store holding every block covers")
    assert "require_loads" not in failure  # no hint that would hide a store that drops what it saves
    assert check_connector(lambda spec: HMANullConnector(), layouts=[ONE_GROUP], require_loads=False).ok


def test_non_hma_connector_on_hybrid_layouts_only_is_no_pass() -> None:
    report = check_connector(lambda spec: NullConnector(), layouts=[TWO_GROUPS], require_loads=False)
    assert not report.ok and not report.results and "no scenario ran" in str(report)


def test_a_factory_that_raises_is_reported() -> None:
    def factory(spec: KVSpec) -> NullConnector:
        raise RuntimeError("no backend")

    (failure,) = _failures(factory, layouts=[ONE_GROUP])
    assert failure.startswith("the factory raised RuntimeError: no backend (at ")


def test_threads_are_restored() -> None:
    import torch

    before = torch.get_num_threads()
    check_connector(lambda spec: HMANullConnector(), layouts=[ONE_GROUP], stacks=False, require_loads=False, threads=1)
    assert torch.get_num_threads() == before
