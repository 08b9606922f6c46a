"""``capkv check``: the tree, the verdict, and one line per problem — never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capkv.cli._main import main
from tests.config.cli_check import check as run_check

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = "tests.config.sample_connectors"


def leaf(cls: str, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"kv_connector": f"{SAMPLES}:{cls}"}
    if extra:
        entry["kv_connector_extra_config"] = extra
    return entry


def multi(*children: dict[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(children)}}


def check(tmp_path: Path, config: object, *options: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_check(tmp_path, config, *options, capsys=capsys, name="stack.json")


def test_a_servable_stack_prints_its_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("OffloadConnector", layout="HND"), multi(leaf("OffloadConnector", piecewise=True)))
    status, out, err = check(tmp_path, config, "--groups", "2", capsys=capsys)
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        "MultiConnector               HMA: yes  layout: HND  piecewise cudagraph: yes  finished count: default",
        "├─ #1 OffloadConnector       HMA: yes  layout: HND  piecewise cudagraph: no   finished count: default",
        "└─ #2 MultiConnector         HMA: yes  layout: any  piecewise cudagraph: yes  finished count: default",
        "   └─ #2.1 OffloadConnector  HMA: yes  layout: any  piecewise cudagraph: yes  finished count: default",
        "ok: the stack can serve 2 KV-cache groups",
    ]


def test_tree_columns_line_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("OffloadConnector"), multi(leaf("DiskConnector", layout="HND")))
    status, out, _ = check(tmp_path, config, capsys=capsys)
    lines = out.splitlines()
    assert status == 0 and lines[-1].startswith("ok for 1 KV-cache group; not for 2 or more: ")
    tree = lines[:-1]
    assert [line.split("  HMA:")[0].rstrip() for line in tree] == [
        "MultiConnector", "├─ #1 OffloadConnector", "└─ #2 MultiConnector", "   └─ #2.1 DiskConnector",
    ]
    assert len({line.index("HMA:") for line in tree}) == 1
    assert len({line.index("layout:") for line in tree}) == 1
    assert "HMA: no   layout: HND" in tree[3]


def test_too_many_groups_for_a_non_hma_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("OffloadConnector"), multi(leaf("DiskConnector")), leaf("DiskConnector"))
    status, out, err = check(tmp_path, config, "--groups", "2", capsys=capsys)
    assert status == 1
    assert "HMA: no" in out.splitlines()[0] and "ok:" not in out
    assert err.splitlines() == [
        'capkv check: error: "MultiConnector" cannot serve 2 KV-cache groups: sub-connector #2.1 "DiskConnector" '
        "does not implement SupportsHMA (missing request_finished_all_groups); sub-connector #3 \"DiskConnector\" "
        "does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to"
    ]


def test_hma_is_decided_without_building(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("OffloadConnector"), leaf("DiskConnector", unknown_option=1))
    status, out, err = check(tmp_path, config, "--groups", "2", "--classes-only", capsys=capsys)
    assert status == 1 and "layout: ?" in out and 'sub-connector #2 "DiskConnector"' in err
    status, out, err = check(tmp_path, multi(leaf("OffloadConnector")), "--groups", "4", "--classes-only", capsys=capsys)
    assert status == 0 and out.splitlines()[-1] == "ok: the stack can serve 4 KV-cache groups (classes only)"


def test_conflicting_children(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("OffloadConnector", layout="HND", finished_count=2), leaf("DiskConnector", layout="NHD"))
    status, out, err = check(tmp_path, config, capsys=capsys)
    assert status == 1
    assert "layout: conflict" in out.splitlines()[0] and "finished count: conflict" in out.splitlines()[0]
    assert err.splitlines() == [
        "capkv check: error: MultiConnector.get_required_kvcache_layout: sub-connectors disagree "
        "(#1 OffloadConnector -> 'HND', #2 DiskConnector -> 'NHD')",
        "capkv check: error: MultiConnector.get_finished_count: sub-connectors disagree "
        "(#1 OffloadConnector -> 2, #2 DiskConnector -> None)",
    ]


def test_registered_names_through_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi({"kv_connector": "tests-registered-disk"})
    status, out, _ = check(tmp_path, config, "--import", "tests.config.registering_module", capsys=capsys)
    assert status == 0
    assert 'RegisteredDisk ("tests-registered-disk")' in out.splitlines()[1]


def test_a_composite_without_connectors_is_refused_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As capkv's stack (capkv's loader) and as vLLM's configuration (vLLM's composite asserts it has a list)."""
    path = tmp_path / "stack.json"
    path.write_text(json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both"}))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and '"connectors"' in err and "MultiConnector" in err, err


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (multi({"kv_connector": "Nope"}), 'capkv check: error: #1: unknown connector "Nope" (registered: '),
        (multi({"kv_connector": "no.such:Thing"}), 'capkv check: error: #1: cannot import module "no.such" for connector "no.such:Thing": '),
        (multi(leaf("NotAConnector")), f'capkv check: error: #1: connector "{SAMPLES}:NotAConnector" (NotAConnector) is not a KVConnector class (missing '),
        ([1, 2], 'capkv check: error: '),
        ({"kv_connector": "MultiConnector", "kv_role": "kv_both"}, "capkv check: error: "),
    ],
)
def test_configuration_errors_are_one_line_exit_2(
    tmp_path: Path, config: object, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = check(tmp_path, config, capsys=capsys)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith(error)


def test_a_connector_that_cannot_be_built_is_exit_2_after_the_class_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = check(tmp_path, multi(leaf("DiskConnector", colour="red")), capsys=capsys)
    assert status == 2
    assert out.splitlines()[1].startswith("└─ #1 DiskConnector  HMA: no  layout: ?")
    assert len(err.splitlines()) == 1
    assert err.startswith('capkv check: error: #1: cannot build "tests.config.sample_connectors:DiskConnector" with DiskConnector(kv_connector_extra_config): TypeError: ')
    assert err.rstrip().endswith("(layouts and finished counts are unchecked; --classes-only skips building)")
    status, _, err = check(tmp_path, multi(leaf("DiskConnector", colour="red")), "--groups", "2", capsys=capsys)
    assert status == 1, "not servable wins over not buildable"
    assert "cannot serve 2 KV-cache groups" in err.splitlines()[0]


def test_unreadable_files_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.toml").write_text("kv_connector = [\n")
    for path in (tmp_path / "bad.toml", tmp_path / "missing.json", tmp_path / "stack.ini"):
        assert main(["check", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"capkv check: error: {path}: ")


def test_console_script_module_path_and_no_traceback(tmp_path: Path) -> None:
    """Through ``python -m capkv``, from the project directory: "module:Class" paths import from the cwd."""
    good, bad = tmp_path / "good.toml", tmp_path / "bad.json"
    good.write_text(f'kv_connector = "{SAMPLES}:DiskConnector"\n')
    bad.write_text(json.dumps(multi(leaf("Missing"))))
    run = [sys.executable, "-m", "capkv", "check"]
    ok = subprocess.run([*run, str(good), "--groups", "2"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert ok.returncode == 1
    assert ok.stderr == (
        'capkv check: error: "DiskConnector" cannot serve 2 KV-cache groups: connector "DiskConnector" does not '
        "implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to\n"
    )
    failed = subprocess.run([*run, str(bad)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr == f'capkv check: error: #1: module "{SAMPLES}" has no attribute "Missing" (connector "{SAMPLES}:Missing")\n'
    usage = subprocess.run([*run, str(good), "--groups", "0"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "expected a positive number of groups" in usage.stderr


def test_the_tree_says_how_each_store_tier_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A store whose backend declares ``slow = True`` loads asynchronously; a misspelt ``slow`` would show as
    ``sync`` (a store class whose backend is given when it is built says ``?``)."""
    config = multi(
        {"kv_connector": "cpu", "kv_connector_extra_config": {"capacity_blocks": 8}},
        {"kv_connector": "file", "kv_connector_extra_config": {"root": str(tmp_path / "kv")}},
        {"kv_connector": "tests.testing.sqlite_store:SQLiteStore"},
        leaf("OffloadConnector"),
    )
    status, out, _ = check(tmp_path, config, "--groups", "2", capsys=capsys)
    lines = out.splitlines()
    assert status == 0, out
    assert lines[1].endswith("loads: sync") and '#1 CPUOffloadConnector ("cpu")' in lines[1]
    assert lines[2].endswith("loads: async") and '#2 FileStoreConnector ("file")' in lines[2]
    assert lines[3].endswith("loads: ?") and "#3 SQLiteStore" in lines[3]
    assert "loads:" not in lines[4] and "loads:" not in lines[0]  # a connector of its own, and the stack
