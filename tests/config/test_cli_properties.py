"""Property tests: for any configuration or option, ``capkv check`` and ``capkv demo`` end with a
documented exit status and one line per problem, never a traceback (bounded example counts)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capkv.cli._main import main

HOSTILE = "tests.config.hostile_connectors"
SAMPLES = "tests.config.sample_connectors"
NAMES = [
    "MultiConnector", "CPUOffloadConnector", "FileStoreConnector", "SingleGroupOffloadConnector", "cpu", "file",
    "single", "Nope", "", ":", "no.such:Thing", f"{SAMPLES}:OffloadConnector", f"{SAMPLES}:DiskConnector",
    f"{SAMPLES}:NotAConnector", f"{SAMPLES}:not_a_class", f"{SAMPLES}:EngineBound", f"{HOSTILE}:FactRaises",
    f"{HOSTILE}:ClassFactRaises", f"{HOSTILE}:LayoutFive", f"{HOSTILE}:ExitsInInit",
    f"{HOSTILE}:RaisesBaseException", f"{HOSTILE}:Declares", f"{HOSTILE}:SpecStore",
]
KEYS = ["kv_connector", "kv_connector_extra_config", "connectors", "kv_connector_module_path", "capacity_blocks",
        "root", "namespace", "slots", "label", "layout", "finished_count", "piecewise", "kv_role"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 5), st.sampled_from([2**63, -(2**70), 1.5, math.inf, math.nan, 0.0]),
    st.sampled_from(NAMES), st.text(max_size=5),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
    max_leaves=12,
)


@st.composite
def entries(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    """A connector entry shaped roughly right, with anything in its corners."""
    entry: dict[str, Any] = {"kv_connector": draw(st.sampled_from(NAMES))}
    if draw(st.booleans()):
        extra: dict[str, Any] = draw(st.dictionaries(st.sampled_from(KEYS[4:]), scalars, max_size=3))
        if depth < 3 and draw(st.booleans()):
            extra["connectors"] = draw(st.lists(entries(depth + 1), max_size=3))
        entry["kv_connector_extra_config"] = extra
    if draw(st.integers(0, 9)) == 0:
        entry[draw(st.sampled_from(KEYS))] = draw(values)
    return entry


configs = st.one_of(entries(), values)
check_options = st.lists(
    st.sampled_from([["--classes-only"], ["--groups", "1"], ["--groups", "3"], ["--groups", "0"], ["--groups", "x"],
                     ["--import", "tests.config.registering_module"], ["--import", "no.such"], ["--bogus"]]),
    max_size=2,
).map(lambda groups: [option for group in groups for option in group])


def assert_one_line_per_problem(err: str, prog: str) -> None:
    assert "Traceback" not in err
    for line in err.splitlines():
        assert line.startswith((f"{prog}: ", "capkv: error: unrecognized arguments")), line


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=configs, options=check_options)
def test_check_any_config(tmp_path: Path, config: object, options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(config))
    status = main(["check", str(path), *options])
    out, err = capsys.readouterr()
    assert status in (0, 1, 2)
    assert_one_line_per_problem(err, "capkv check")
    if status == 0:
        assert err == "" and out.splitlines()[-1].startswith("ok")
    else:
        assert err and "ok" not in out.splitlines()[-1:]


SMALL = ["--requests", "2", "--prefixes", "1", "--prefix-len", "32", "--suffix-len", "5", "--max-tokens", "1",
         "--window", "16", "--kv-heads", "1", "--head-dim", "4", "--num-blocks", "64", "--layers", "3"]
DEMO_OPTIONS: dict[str, list[str]] = {
    "--layers": ["0", "-1", "1", "2", "x", "1.5"],
    "--pattern": ["F", "S", "FS", "", "X", "fs"],
    "--window": ["0", "8", "-5", "1"],
    "--kv-heads": ["0", "1", "2", ""],
    "--head-dim": ["0", "2", "4"],
    "--block-size": ["0", "1", "4", "16", "999999"],
    "--sliding-block-size": ["0", "4", "8", "-1"],
    "--num-blocks": ["0", "1", "2", "3", "16", str(2**45)],
    "--dtype": ["float32", "int8", "float16"],
    "--stack": ["cpu", "file", "single", "cpu,[file,single]", "[[cpu]]", "cpu,", "]", "cpu,Nope", f"{HOSTILE}:LayoutFive",
                f"{HOSTILE}:ExitsInInit", f"{HOSTILE}:SpecStore", f"{HOSTILE}:Declares", f"{SAMPLES}:DiskConnector"],
    "--cpu-blocks": ["0", "1", "4", "-2"],
    "--requests": ["0", "1", "3"],
    "--prefixes": ["0", "1", "2"],
    "--prefix-len": ["0", "-1", "4"],
    "--suffix-len": ["0", "1", "-1"],
    "--max-tokens": ["0", "1", "2"],
    "--seed": ["-1", "7", "x"],
    "--device": ["cpu", "cuda", "tpu"],
    "--threads": ["0", "1", "2"],
    "--import": ["no.such", "tests.config.registering_module"],
}
demo_options = st.lists(
    st.sampled_from(sorted(DEMO_OPTIONS)).flatmap(lambda name: st.sampled_from(DEMO_OPTIONS[name]).map(lambda v: [name, v])),
    max_size=3,
).map(lambda pairs: [item for pair in pairs for item in pair])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(options=demo_options)
def test_demo_any_options(options: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", *SMALL, *options])
    out, err = capsys.readouterr()
    assert status in (0, 1, 2), (status, err)
    assert_one_line_per_problem(err, "capkv demo")
    if status == 0:
        assert err == "" and out.rstrip().endswith("against recomputation)")
    elif status == 2:
        assert len(err.splitlines()) == 1, err
