"""``capkv check`` and ``capkv demo``: one line, the documented exit status, never a traceback.

Whatever the configuration, the option, or the user connector does while being
built or asked (issue 11); and the stack language both commands share (issue 12).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capkv.cli._main import main

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "tests.config.hostile_connectors"
SMALL = ["--requests", "4", "--prefixes", "2", "--prefix-len", "64", "--suffix-len", "17", "--max-tokens", "2",
         "--window", "32", "--kv-heads", "1", "--head-dim", "8", "--num-blocks", "256"]


def leaf(name: str, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"kv_connector": name}
    if extra:
        entry["kv_connector_extra_config"] = extra
    return entry


def hostile(cls: str, **extra: Any) -> dict[str, Any]:
    return leaf(f"{HOSTILE}:{cls}", **extra)


def multi(*children: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(children)}}


def check(tmp_path: Path, config: object, *options: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    path = tmp_path / "stack.json"
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    status = main(["check", str(path), *options])
    out, err = capsys.readouterr()
    return status, out, err


def one_line(err: str) -> str:
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


# ---- capkv check: configurations and user connectors -------------------------------------------


def test_deeply_nested_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    depth = 3000  # json.dumps would itself recurse too deeply: written by hand
    raw = '{"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [' * depth
    raw += '{"kv_connector": "cpu", "kv_connector_extra_config": {"capacity_blocks": 1}}' + "]}}" * depth
    status, out, err = check(tmp_path, raw, capsys=capsys)
    assert status == 2 and out == ""
    assert "nest" in one_line(err)


def test_moderately_deep_nesting_is_refused_by_the_loader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = leaf("cpu", capacity_blocks=4)
    for _ in range(60):
        config = multi(config)
    status, out, err = check(tmp_path, config, capsys=capsys)
    assert status == 2 and out == ""
    assert "stacks nest at most 32 levels deep" in one_line(err)


def test_a_raising_fact_is_one_line_naming_the_connector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(tmp_path, multi(leaf("cpu", capacity_blocks=4), hostile("FactRaises")), capsys=capsys)
    assert status == 2
    assert "layout: conflict" in out.splitlines()[2]
    assert one_line(err) == (
        'capkv check: error: #2 "FactRaises".get_required_kvcache_layout(): ValueError: layout table not loaded\n'
    )


def test_a_raising_class_level_fact_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = check(tmp_path, multi(hostile("ClassFactRaises")), "--classes-only", capsys=capsys)
    assert status == 2
    assert "ClassFactRaises\".get_finished_count(): LookupError: no such count" in one_line(err)


def test_a_layout_of_five_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = check(tmp_path, multi(hostile("LayoutFive")), capsys=capsys)
    assert status == 2
    assert one_line(err) == (
        'capkv check: error: #1 "LayoutFive".get_required_kvcache_layout() returned 5: '
        "expected None or a layout name such as 'NHD' or 'HND'\n"
    )


@pytest.mark.parametrize(
    ("cls", "shown"),
    [("ExitsInInit", "SystemExit: 0"), ("RaisesBaseException", "CustomBaseException: from the constructor")],
)
def test_a_constructor_raising_base_exceptions_is_an_error_not_a_silent_exit(
    tmp_path: Path, cls: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = check(tmp_path, multi(hostile(cls)), capsys=capsys)
    assert status == 2 and "ok" not in out
    assert f"cannot build \"{HOSTILE}:{cls}\" with {cls}(kv_connector_extra_config): {shown}" in one_line(err)


def test_an_interrupt_while_building_is_one_line_exit_130(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = check(tmp_path, multi(hostile("Interrupted")), capsys=capsys)
    assert status == 130 and one_line(err) == "capkv check: interrupted\n"


# ---- capkv check: verdicts and declared options ----------------------------------------------------


def test_a_non_hma_stack_is_never_plain_ok_without_a_group_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("cpu", capacity_blocks=4), leaf("single", capacity_blocks=4))
    status, out, err = check(tmp_path, config, capsys=capsys)
    assert (status, err) == (0, "")
    assert out.splitlines()[-1] == (
        "ok for 1 KV-cache group (#1, #2 not built from extra config: facts from their classes); not for 2 or more: "
        '"MultiConnector" cannot serve 2 KV-cache groups: sub-connector #2 "SingleGroupOffloadConnector" does not '
        "implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to"
    )
    status, out, _ = check(tmp_path, multi(leaf("cpu", capacity_blocks=4)), capsys=capsys)
    assert status == 0 and out.splitlines()[-1].startswith("ok: the stack can serve any number of KV-cache groups")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (leaf("FileStoreConnector", root="/tmp/x", bogus=1),
         '#1: "FileStoreConnector": unknown option "bogus" in kv_connector_extra_config (value 1); it accepts: root '),
        (leaf("CPUOffloadConnector", capacity_blocks="lots"),
         '#1: "CPUOffloadConnector": option "capacity_blocks" = \'lots\' in kv_connector_extra_config: expected an int'),
        (leaf("cpu", capacity_blocks=True),
         '#1: "cpu": option "capacity_blocks" = True in kv_connector_extra_config: expected an int'),
        (leaf("cpu", capacity_blocks=0),
         '#1: "cpu": option "capacity_blocks" = 0 in kv_connector_extra_config: expected at least 1'),
        (leaf("cpu"),
         "#1: \"cpu\": kv_connector_extra_config needs 'capacity_blocks' (an int >= 1, required)"),
        (leaf("file", root="/tmp/x", namespace=3),
         '#1: "file": option "namespace" = 3 in kv_connector_extra_config: expected a string'),
    ],
)
@pytest.mark.parametrize("options", [(), ("--classes-only",), ("--groups", "2")])
def test_capkv_connectors_extra_config_is_checked_without_a_spec(
    tmp_path: Path, entry: dict[str, Any], message: str, options: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = check(tmp_path, multi(entry), *options, capsys=capsys)
    assert status == 2
    assert one_line(err).startswith(f"capkv check: error: {message}")


def test_user_connectors_declare_options_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check(tmp_path, multi(hostile("Declares", slots=2, label="a")), capsys=capsys)
    assert (status, err) == (0, "") and out.splitlines()[-1].startswith("ok: ")
    status, _, err = check(tmp_path, multi(hostile("Declares", slots=2.5)), capsys=capsys)
    assert status == 2 and 'option "slots" = 2.5 in kv_connector_extra_config: expected an int' in one_line(err)


# ---- capkv demo: options, shapes, the shared stack language ------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [("--sliding-block-size", "0"), ("--block-size", "0"), ("--layers", "-1"), ("--num-blocks", "1"),
     ("--cpu-blocks", "0"), ("--threads", "0"), ("--requests", "x"), ("--prefix-len", "-3")],
)
def test_demo_refuses_bad_numbers_instead_of_a_default(option: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, option, value]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err).startswith(f"capkv demo: error: argument {option}: expected an int >= ")


def test_demo_refuses_an_unallocatable_shape_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", *SMALL, "--num-blocks", str(2**40), "--kv-heads", "64", "--head-dim", "256"])
    captured = capsys.readouterr()
    assert status == 2
    assert "the paged KV cache needs" in one_line(captured.err)


def test_demo_numbers_nested_children_as_errors_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", "cpu,[file,cpu],file"]) == 0
    out = capsys.readouterr().out
    assert '│  ├─ #2.1 FileStoreConnector ("file")' in out and '│  └─ #2.2 CPUOffloadConnector ("cpu")' in out


def test_demo_and_check_print_the_same_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", "cpu,[file,single]"]) == 2
    demo_out = capsys.readouterr().out
    demo_tree = [line[2:] for line in demo_out.splitlines() if line.startswith("  ") and "HMA:" in line]
    config = multi(leaf("cpu", capacity_blocks=2048), multi(leaf("file", root=str(tmp_path)), leaf("single", capacity_blocks=2048)))
    _, check_out, _ = check(tmp_path, config, "--groups", "3", capsys=capsys)
    check_tree = [line for line in check_out.splitlines() if "HMA:" in line]
    # The same renderer: the demo adds one column of details (pool size, directory) and nothing else.
    assert [line.split("finished count")[0] for line in demo_tree] == [line.split("finished count")[0] for line in check_tree]


def test_demo_runs_a_module_class_connector_and_imported_registrations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", f"cpu,{HOSTILE}:SpecStore"]) == 0
    assert "└─ #2 SpecStore " in capsys.readouterr().out
    assert main(["demo", *SMALL, "--import", "tests.config.registering_module", "--stack", "cpu,tests-registered-disk"]) == 2
    captured = capsys.readouterr()
    assert '#2 RegisteredDisk ("tests-registered-disk")' in captured.out  # resolved through the registry
    assert "does not implement SupportsHMA" in one_line(captured.err)
    assert main(["demo", *SMALL, "--import", "no.such.module"]) == 2
    assert 'cannot import "no.such.module" (--import)' in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("stack", "message"),
    [
        (f"{HOSTILE}:ExitsInInit", "SystemExit: 0"),
        (f"cpu,{HOSTILE}:LayoutFive", "returned 5: expected None or a layout name"),
        ("[" * 40 + "cpu" + "]" * 40, "stacks nest at most 32 levels deep"),
        ("cpu,file:Nope", "cannot import module \"file\""),
    ],
)
def test_demo_refuses_hostile_stacks_in_one_line(stack: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--stack", stack]) == 2
    assert message in one_line(capsys.readouterr().err)


def test_no_traceback_through_the_console_script(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    run = [sys.executable, "-m", "capkv"]
    for argv in (["check", str(deep)], ["demo", "--sliding-block-size", "0"], ["bench", "transfer", "--mib", "0"]):
        done = subprocess.run([*run, *argv], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
        assert done.returncode == 2, (argv, done.stderr)
        lines = [line for line in done.stderr.splitlines() if "NumPy" not in line and "numpy" not in line]
        assert len(lines) == 1 and "Traceback" not in done.stderr, (argv, done.stderr)
