"""``benchmarks/gpu.py`` runs on CPU as a dry run of its GPU rows: the same table code, every row measured or
named as skipped, and a row that raises is a FAILED row (and a non-zero exit), never a missing one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import gpu

SMALL = ["--device", "cpu", "--model", "demo", "--block-sizes", "16", "--copy-mib", "1", "--load-mib", "4",
         "--rounds", "1", "--skip-tests"]


def test_a_cpu_dry_run_measures_every_row_and_writes_one_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu.main([*SMALL, "--out", str(tmp_path)]) == 0
    table = (tmp_path / "gpu_table.txt").read_text().splitlines()
    rows = [line for line in table[1:] if line.startswith(("copy", "store"))]
    assert [line.split()[2] for line in rows if line.startswith("copy")] == ["gather,", "scatter,"]
    measured = [line for line in rows if "file load" in line or "file save" in line]
    assert len(measured) == 4 and all(re.search(r" \d+\.\d\dx ", line) for line in measured), measured  # a ratio each
    assert any("verified bit for bit" in line for line in measured)
    assert "skipped: --skip-tests" in table[1] and "redis" in table[-1] and "skipped" in table[-1]
    assert "one table" in capsys.readouterr().out


def test_a_row_that_raises_is_reported_failed_and_the_run_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no bytes moved")

    monkeypatch.setattr(gpu, "measure_transfer", broken)
    assert gpu.main([*SMALL, "--out", str(tmp_path)]) == 1
    table = (tmp_path / "gpu_table.txt").read_text()
    assert "FAILED: RuntimeError: no bytes moved" in table


def test_rows_left_when_the_budget_is_spent_say_so(tmp_path: Path) -> None:
    assert gpu.main([*SMALL, "--budget-s", "0", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "gpu_table.txt").read_text()
    assert table.count("skipped: the time budget is spent") == 2  # the copies' row and the store's row
