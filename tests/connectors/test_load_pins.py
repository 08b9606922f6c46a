"""Load pins end when the worker reports that step's loads ran, however often the engine reports.

An engine may skip ``update_connector_output`` on an empty step, or call it
twice; a pin released per call would then leak (pinned blocks are never
evicted, so saves stop) or end before its load read the block.
"""

from __future__ import annotations

from capkv import KVConnectorOutput
from capkv.connectors import CPUOffloadConnector, StoreMetadata
from capkv.stores._metadata import SaveReport
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, empty_caches, make_spec

SPEC = make_spec([Group(16), Group(32, window=64)], num_blocks=64)
PROMPT = tokens(60, 100)


def _primed() -> CPUOffloadConnector:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=32)
    MiniEngine(SPEC, connector).run("first", PROMPT)
    return connector


def _plan_load(connector: CPUOffloadConnector) -> None:
    request = Req("again", PROMPT + [1])
    hit, _ = connector.get_num_new_matched_tokens(request, 0)
    assert hit == 96
    connector.update_state_after_alloc(request, (list(range(10, 17)), [0, 0, 20, 21]), hit)


def _run_worker(connector: CPUOffloadConnector) -> SaveReport | None:
    """One step on the worker side: the metadata built now, run, and the report it answers with."""
    metadata = connector.build_connector_meta(None)
    assert isinstance(metadata, StoreMetadata)
    connector.bind_connector_metadata(metadata)
    connector.start_load_kv(None)
    connector.clear_connector_metadata()
    return connector.build_connector_worker_meta()


def _pinned(connector: CPUOffloadConnector) -> int:
    return sum(connector.pool._pins.values())  # pyright: ignore[reportPrivateUsage]


def test_skipped_reports_on_empty_steps_do_not_leak_pins() -> None:
    connector = _primed()
    for _ in range(3):  # empty steps whose output the engine never hands back
        _run_worker(connector)
    _plan_load(connector)
    report = _run_worker(connector)
    assert _pinned(connector) > 0
    connector.update_connector_output(KVConnectorOutput(worker_meta=report))
    assert _pinned(connector) == 0


def test_a_lost_report_is_covered_by_the_next_one() -> None:
    connector = _primed()
    _plan_load(connector)
    _run_worker(connector)  # its report never reaches the scheduler side
    later = _run_worker(connector)
    assert _pinned(connector) > 0
    connector.update_connector_output(KVConnectorOutput(worker_meta=later))
    assert _pinned(connector) == 0


def test_extra_reports_do_not_release_pins_before_the_load_ran() -> None:
    connector = _primed()
    connector.register_kv_caches(empty_caches(SPEC, "flash", "cpu"))
    _plan_load(connector)
    metadata = connector.build_connector_meta(None)
    pinned = _pinned(connector)
    assert pinned > 0
    for _ in range(2):  # output of earlier steps, or the same step twice: the load has not run
        connector.update_connector_output(KVConnectorOutput())
        connector.update_connector_output(KVConnectorOutput(worker_meta=SaveReport(loaded_through=metadata.step - 1)))
    assert _pinned(connector) == pinned
    connector.bind_connector_metadata(metadata)
    connector.start_load_kv(None)
    report = connector.build_connector_worker_meta()
    assert report is not None and report.loaded_through == metadata.step
    connector.update_connector_output(KVConnectorOutput(worker_meta=report))
    connector.update_connector_output(KVConnectorOutput(worker_meta=report))  # the same report again
    assert _pinned(connector) == 0


def test_workers_report_loads_done_only_when_all_did() -> None:
    assert SaveReport(loaded_through=5).aggregate(SaveReport(loaded_through=3)).loaded_through == 3
    assert SaveReport(loaded_through=5).aggregate(SaveReport()).loaded_through is None
    assert SaveReport().aggregate(SaveReport()).loaded_through is None
