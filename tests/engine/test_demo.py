"""``capkv demo``: verified runs, refusals before serving, and a corrupting connector caught."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from capkv import KVSpec
from capkv.cli._main import main
from capkv.engine import EngineStats
from tests.engine.connectors import BlockStore, OffByOne

SMALL = ["--requests", "6", "--prefixes", "2", "--prefix-len", "64", "--suffix-len", "17", "--max-tokens", "3",
         "--window", "32", "--kv-heads", "1", "--head-dim", "8", "--num-blocks", "512"]


def test_default_stack_round_trips_bit_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL]) == 0
    out = capsys.readouterr().out
    assert re.search(r"MultiConnector +HMA: yes", out)
    assert re.search(r'├─ #1 CPUOffloadConnector \("cpu"\) +HMA: yes', out)
    assert re.search(r'└─ #2 FileStoreConnector \("file"\) +HMA: yes', out)
    assert "check_stack: ok, the stack serves all 3 KV-cache groups" in out
    # Not a terminal: one progress line per quarter, each run ending at 6/6.
    assert re.search(r"cold +\[#+\] 6/6 requests", out) and re.search(r"warm +\[#+\] 6/6 requests", out)
    rows = dict(re.findall(r"^  (requests|bytes loaded|bytes saved) +(.+)$", out, re.MULTILINE))
    assert rows["requests"].split() == ["6", "6"]
    cold_loaded, warm_loaded = re.findall(r"(\d[\d.]* [kMG]?B)", rows["bytes loaded"])
    assert cold_loaded == "0 B" and warm_loaded != "0 B"
    # The warm run gets every prompt back through the stack (all but the last block-aligned token).
    full_hits = re.search(r"prefix-hit tokens, group 0 \(full\) +(\S+ \+ \S+) +(\S+ \+ \S+)", out)
    assert full_hits is not None and full_hits.group(2) == "0 + 480"
    assert out.rstrip().endswith(
        "verified: bit-exact (every loaded block, and every request's KV at finish, against recomputation)"
    )


def test_a_single_group_connector_is_refused_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", "cpu,[file,single]"]) == 2
    captured = capsys.readouterr()
    assert re.search(r"└─ #2 MultiConnector +HMA: no", captured.out)
    assert re.search(r'└─ #2.2 SingleGroupOffloadConnector \("single"\) +HMA: no', captured.out)
    assert "serving" not in captured.out
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("capkv demo: refused before serving: CapabilityError:")
    assert 'sub-connector #2.2 "SingleGroupOffloadConnector" does not implement SupportsHMA' in captured.err


def test_a_corrupting_connector_fails_verification(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", f"{OffByOne.__module__}:OffByOne"]) == 1
    out = capsys.readouterr().out
    assert re.search(
        r"^verified: MISMATCH: request warm-0, group 0, layer layers\.0\.attn, block \d+ \(#1 of its table\), "
        r"token position 16, checked after load$",
        out, re.MULTILINE,
    )
    assert "bit-exact" not in out


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        ("cpu,[file", "']' is missing at character 10"),
        ("cpu,,file", "a connector name or '[' is missing at character 5"),
        ("cpu;file", "unexpected ';' at character 4"),
        ("cpu,tape", '#2: unknown connector "tape" (registered: '),
    ],
)
def test_bad_stacks_are_one_line_errors(stack: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", stack]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bad_model_options_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--pattern", "FXS"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pattern must be a non-empty string of 'F'" in err


def test_the_file_store_alone_serves_the_warm_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", "file"]) == 0
    out = capsys.readouterr().out
    # Its background writes are flushed between the runs, so every saved block is a hit.
    assert re.search(r"prefix-hit tokens, group 0 \(full\) +\S+ \+ \S+ +0 \+ 480$", out, re.MULTILINE), out
    temporary = re.search(r"FileStoreConnector .*finished count: default +(\S+)", out)
    assert temporary is not None and not Path(temporary.group(1)).exists()
    assert main(["demo", *SMALL, "--stack", "file", "--store-dir", str(tmp_path / "store")]) == 0
    assert any((tmp_path / "store").iterdir())  # a given directory is kept


class ReportsBytes(BlockStore):
    """Reports, per step, the bytes its layer-by-layer saves copied since the last call."""

    reported = 0
    made: list[ReportsBytes] = []

    def __init__(self, spec: KVSpec) -> None:
        super().__init__(spec)
        ReportsBytes.made.append(self)

    def get_kv_connector_stats(self) -> object:
        block_bytes = 16 * 1 * 8 * 2 * 2  # tokens x heads x head_dim x (K, V) x bfloat16
        saved = self.saved_blocks * block_bytes - self.reported
        self.reported += saved
        return {"saved_bytes": saved}


def test_bytes_saved_come_from_the_stacks_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    ReportsBytes.made.clear()
    stores = ReportsBytes.made
    name = f"{__name__}:ReportsBytes"
    assert main(["demo", *SMALL, "--stack", f"{name},{name}"]) == 0
    out = capsys.readouterr().out
    row = re.search(r"^  bytes saved +(\S+ \S+) +(\S+ \S+)$", out, re.MULTILINE)
    assert row is not None, out
    units = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}
    printed = [float(n) * units[u] for n, u in (cell.split() for cell in row.groups())]
    reported = sum(s.reported for s in stores)
    assert reported > 0 and "bytes saved: n/a" not in out
    assert abs(sum(printed) - reported) <= 2 * 0.05 * 1e3  # both runs' figures add up to what the stores reported


def test_connector_totals_add_up_steps_and_stacked_children() -> None:
    stats = EngineStats(1)
    stats.connector_stats += [
        {0: {"saved_bytes": 10, "loaded_blocks": 3}, 1: {"saved_bytes": 5}},
        {0: {"saved_bytes": 1}, 1: None},
        SimpleNamespace(saved_bytes=100),
    ]
    assert stats.connector_total("saved_bytes") == 116
    assert stats.connector_total("loaded_blocks") == 3
    assert stats.connector_total("loaded_bytes") == 0, "reported statistics without the counter: zero"
    assert EngineStats(1).connector_total("saved_bytes") is None, "no statistics at all: unknown"


TIERED = [*SMALL, "--tiered", "--prefixes", "6", "--cpu-blocks", "96", "--max-tokens", "16"]
"""A front tier (96 blocks) smaller than the working set (6 prefixes and 6 requests' own blocks, 3 groups)."""


def _warm_computed(out: str) -> int:
    row = re.search(r"^  tokens computed +(\S+) +(\S+)$", out, re.MULTILINE)
    assert row is not None, out
    return int(row.group(2).replace(",", ""))


def test_tiered_workload_computes_no_more_than_one_large_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *TIERED]) == 0
    out = capsys.readouterr().out
    loaded = dict(re.findall(r"^  tokens loaded from (#\d \w+) +\S+ +(\S+)$", out, re.MULTILINE))
    assert set(loaded) == {"#1 CPUOffloadConnector", "#2 FileStoreConnector"}, out
    assert all(int(v.replace(",", "")) > 0 for v in loaded.values()), "both tiers serve parts of the warm hits"
    assert "tokens promoted into" not in out
    assert main(["demo", *TIERED, "--stack", "file"]) == 0
    one_store = capsys.readouterr().out
    assert "tokens loaded from" not in one_store
    assert _warm_computed(out) == _warm_computed(one_store)


def test_promotion_is_shown_per_tier(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *TIERED, "--promote"]) == 0
    out = capsys.readouterr().out
    promoted = re.search(r"^  tokens promoted into #1 CPUOffloadConnector +(\S+) +(\S+)$", out, re.MULTILINE)
    assert promoted is not None and promoted.groups() != ("0", "0"), out
    assert "tokens promoted into #2" not in out, "the last tier has nothing behind it"
    assert out.rstrip().endswith("against recomputation)")
    assert main(["demo", *SMALL, "--stack", "file", "--promote"]) == 2
    assert "--promote needs a stack of tiers" in capsys.readouterr().err
