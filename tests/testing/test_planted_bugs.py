"""Issue 35's trial: a store written from the docs alone, and each bug planted in it one at a time.

``tests/testing/sqlite_store.py`` is a SQLite ``Backend`` under ``StoreConnector``, as guide § 16 describes.
The clean store passes the conformance kit and ``capkv demo --tiered``; each planted bug makes the kit fail
with its cause named, and makes the demo exit with another status than 0 (verified).
"""

from __future__ import annotations

import re

import pytest

from capkv.cli._main import main
from capkv.testing import ConformanceReport, check_connector
from tests.engine.test_demo import TIERED
from tests.testing.sqlite_store import (
    ContainsEverything,
    DropsEverything,
    DropsOneInTen,
    RaisingGet,
    SQLiteStore,
    WrongRows,
)

KIT_CAUSES: dict[type[SQLiteStore], list[str]] = {
    WrongRows: [
        r"the (cold|warm) run: \d+ blocks the connector offered failed to load \(group 0: \d+ blocks failed",
        r"first cause: capkv\.stores: WrongRows: \d+ blocks failed to load .*a value read back was damaged .*"
        r"another block's value: its header names group \d, digest [0-9a-f]{12}; the key is group 0",
    ],
    DropsOneInTen: [
        r"the warm run's hits covered \d[\d,]* of the 768 prompt tokens a store holding every block covers",
        r"a put that answers True for a value it dropped",
    ],
    ContainsEverything: [
        r"the cold run: \d+ blocks the connector offered failed to load",
        r"first cause: capkv\.stores: ContainsEverything: \d+ blocks failed to load .*a value the store had found "
        r"was absent when read \(the backend's get answered none",
    ],
    DropsEverything: [r"the warm run's hits covered 0 of the 768 prompt tokens a store holding every block covers"],
    RaisingGet: [
        r"first cause: capkv\.stores: RaisingGet: \d+ blocks failed to load .*OperationalError: database disk "
        r"image is malformed \(raised by the backend's get, in RaisingGetBackend\.get at .*sqlite_store\.py:\d+\)",
    ],
}


def _kit(store: type[SQLiteStore]) -> ConformanceReport:
    return check_connector(store, before_warm=store.flush)


def test_the_clean_store_passes_the_kit() -> None:
    report = _kit(SQLiteStore)
    assert report.ok, report
    assert all(result.warm_loaded_tokens[0] == 768 for result in report.results), report


@pytest.mark.parametrize("store", list(KIT_CAUSES), ids=lambda store: store.__name__)
def test_each_planted_bug_fails_the_kit_naming_its_cause(store: type[SQLiteStore]) -> None:
    report = _kit(store)
    assert not report.ok
    alone = [result for result in report.results if result.placement == "alone"]
    failed = [result for result in alone if not result.ok]
    if store is DropsOneInTen:  # which values are dropped follows the writer's batches: a scenario reading only
        assert failed, report  # a few blocks (a sliding window's) may miss all of them; most do not
    else:
        assert alone and failed == alone, report  # alone, nothing covers for it
    for result in failed:
        assert result.failure is not None
        assert "require_loads" not in result.failure  # no hint that would hide the bug
        for cause in KIT_CAUSES[store]:
            assert re.search(cause, result.failure), (cause, result.failure)
    if store is RaisingGet:  # what flush and shutdown raised names the backend's member, not capkv's re-raise site
        failure = alone[0].failure or ""
        assert re.search(r"shutdown raised OperationalError: database disk image is malformed \(raised by the "
                         r"backend's get, in RaisingGetBackend\.get at", failure), failure
        assert "_failures.py" not in failure, failure


PLANTED_TIERED = [*TIERED, "--cpu-blocks", "24"]
"""The demo's small tiered workload, with a front tier so small that the store behind it serves nearly every hit."""


def _demo(store: type[SQLiteStore], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    stack = f"cpu,{store.__module__}:{store.__name__}"
    status = main(["demo", *PLANTED_TIERED, "--import", "tests.testing.sqlite_store", "--stack", stack])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _warm_tiers_add_up(out: str) -> int:
    """The warm run's per-tier loaded tokens add up to the tokens loaded through the stack (full attention):
    each counts only what landed. Returns that sum."""
    tiers = re.findall(r"^  tokens loaded from #\d \w+ +\S+ +(\S+)$", out, re.MULTILINE)
    full = re.search(r"^  prefix-hit tokens, group 0 \(full\) +\S+ \+ \S+ +\S+ \+ (\S+)$", out, re.MULTILINE)
    assert len(tiers) == 2 and full is not None, out
    landed = sum(int(value.replace(",", "")) for value in tiers)
    assert landed == int(full.group(1).replace(",", "")), out
    return landed


def test_the_clean_store_is_verified_by_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _demo(SQLiteStore, capsys)
    assert status == 0, out
    assert _warm_tiers_add_up(out) > 0
    assert re.search(r"└─ #2 SQLiteStore .* loads: sync$", out, re.MULTILINE), out
    assert re.search(r"^  load errors: blocks / tokens +0 / 0 +0 / 0$", out, re.MULTILINE), out
    assert out.rstrip().endswith("against recomputation)")


DEMO_CAUSES: dict[type[SQLiteStore], tuple[int, str]] = {
    WrongRows: (3, r"not verified: the (cold|warm) run: .*first cause: .*another block's value"),
    DropsOneInTen: (3, r"not verified: the warm run's hits covered \d[\d,]* of the \d[\d,]* prompt tokens"),
    ContainsEverything: (3, r"not verified: the (cold|warm) run: .*first cause: .*absent when read"),
    DropsEverything: (3, r"not verified: the warm run's hits covered"),
    RaisingGet: (2, r"not verified: the (cold|warm) run: .*first cause: .*OperationalError: database disk image is "
                    r"malformed \(raised by the backend's get, in RaisingGetBackend\.get"),
}


@pytest.mark.parametrize("store", list(DEMO_CAUSES), ids=lambda store: store.__name__)
def test_each_planted_bug_keeps_the_demo_from_verifying(store: type[SQLiteStore], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _demo(store, capsys)
    expected, finding = DEMO_CAUSES[store]
    assert status == expected, out + err
    assert "verified: bit-exact" not in out
    assert re.search(finding, out), out
    _warm_tiers_add_up(out)  # a tier whose loads failed is not counted as having served them
    if store is RaisingGet:  # flush and shutdown re-raise the kept reads: named by the backend's member
        assert re.search(r"capkv demo: shutting the stack down raised .*raised by the backend's get", err), err
