"""Light import: the fronts load nothing until a name is used; the plugin and ``capkv check`` never load torch.

Each probe runs in a fresh interpreter, since what a process has imported is the
thing under test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

USER_CONNECTORS = '''
"""A connector package that does not use torch, as a user might write one."""
from __future__ import annotations

from typing import Any

from capkv import BlockIds, KVConnectorBase, KVTransferParams, Request


class Quiet(KVConnectorBase[Request]):
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int, /) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: BlockIds, num_external_tokens: int, /) -> None: ...
    def build_connector_meta(self, scheduler_output: Any, /) -> object: return None
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...
    def wait_for_layer_load(self, layer_name: str, /) -> None: ...
    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...
    def wait_for_save(self) -> None: ...


class Offload(Quiet):
    def request_finished_all_groups(self, request: Request, block_ids: BlockIds, /) -> tuple[bool, KVTransferParams | None]:
        return False, None
'''

HIDE_NUMPY = """
import importlib.abc, sys
class _NoNumpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoNumpy())
"""


def probe(code: str, *, cwd: Path = ROOT, dev: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)]), "CAPKV_DEV": "1" if dev else "0"}
    env.pop("PYTHONOPTIMIZE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def loaded(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr[-3000:]
    facts: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return facts


REPORT = "print(json.dumps({'torch': 'torch' in sys.modules, 'beartype': 'beartype' in sys.modules, "
REPORT += "'capkv': sorted(m for m in sys.modules if m.startswith('capkv'))}))"


@pytest.mark.parametrize("dev", [True, False], ids=["dev", "production"])
def test_importing_every_front_loads_no_implementation(dev: bool) -> None:
    fronts = [
        "capkv", "capkv.composite", "capkv.config", "capkv.connectors", "capkv.devmode", "capkv.engine", "capkv.stores",
        "capkv.transfer",
    ]
    facts = loaded(probe(f"import json, sys\nimport {', '.join(fronts)}\n{REPORT}", dev=dev))
    assert facts["torch"] is False and facts["beartype"] is False
    assert facts["capkv"] == sorted([*fronts, "capkv._homes", "capkv._lazy", "capkv._version"])


def test_the_first_name_taken_loads_its_module_and_in_dev_mode_beartype() -> None:
    facts = loaded(probe(f"import json, sys\nfrom capkv import MultiConnector\n{REPORT}"))
    assert facts["beartype"] is True  # dev mode: capkv went under beartype before the composite loaded
    assert facts["torch"] is False  # the composite names torch.Tensor only for type checkers
    assert "capkv.composite._multi" in facts["capkv"]  # type: ignore[operator]


def test_the_mypy_plugin_loads_neither_torch_nor_beartype_in_dev_mode() -> None:
    facts = loaded(probe(f"import json, sys\nimport capkv.mypy\ncapkv.mypy.plugin('2.4.1')\n{REPORT}"))
    assert facts == {**facts, "torch": False, "beartype": False}


def test_mypy_with_the_plugin_runs_without_torch_or_beartype(tmp_path: Path) -> None:
    """The whole mypy run, in-process, in dev mode: the plugin adds neither to mypy's process."""
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nplugins = capkv.mypy\nstrict = True\n[mypy-torch.*]\nfollow_imports = skip\n"
    )
    (tmp_path / "user.py").write_text(
        "from capkv import MultiConnector, SupportsHMA\n"
        "from mykv import Offload, Quiet\n"
        "def need(c: SupportsHMA) -> None: ...\n"
        "need(MultiConnector(Offload(), Quiet()))\n"
    )
    (tmp_path / "mykv.py").write_text(USER_CONNECTORS)
    code = f"""
        import json, sys
        from mypy import api
        out, err, status = api.run(["--config-file", "mypy.ini", "--cache-dir", {str(tmp_path / "cache")!r}, "user.py"])
        assert status == 1 and "[capkv-hma]" in out, out + err  # the plugin ran, and explained
        {REPORT}
    """
    facts = loaded(probe(code, cwd=tmp_path))
    assert facts == {**facts, "torch": False, "beartype": False}


@pytest.mark.parametrize("dev", [True, False], ids=["dev", "production"])
def test_capkv_check_of_a_torch_free_stack_does_not_import_torch(tmp_path: Path, dev: bool) -> None:
    (tmp_path / "mykv.py").write_text(USER_CONNECTORS)
    child = {"kv_connector": "mykv:Quiet"}
    stack = {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {
            "connectors": [
                {"kv_connector": "mykv:Offload"},
                {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [child]}},
            ]
        },
    }
    (tmp_path / "stack.json").write_text(json.dumps(stack))
    code = f"""
        import json, sys
        from capkv.cli import main
        assert main(["check", "stack.json", "--groups", "1"]) == 0
        assert main(["check", "stack.json", "--groups", "2"]) == 1
        {REPORT}
    """
    facts = loaded(probe(code, cwd=tmp_path, dev=dev))
    assert facts["torch"] is False
    assert facts["beartype"] is dev


BLOCK_TORCH = """
import importlib.abc, sys, traceback
attempts = []
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            attempts.append("".join(traceback.format_stack(limit=12)))
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def capkv_stacks(tmp_path: Path) -> dict[str, object]:
    """Configurations naming capkv's own connectors: each alone, all in one stack, nested, with options, hosted."""
    from capkv.config._registry import BUILTIN_CONNECTORS

    options: dict[str, dict[str, object]] = {
        "CPUOffloadConnector": {"capacity_blocks": 4096},
        "SingleGroupOffloadConnector": {"capacity_blocks": 1024},
        "FileStoreConnector": {"root": str(tmp_path / "kv"), "namespace": "m"},
        "RedisStoreConnector": {"url": "redis://127.0.0.1:1"},
    }
    leaves = sorted({target.rpartition(":")[2] for target in BUILTIN_CONNECTORS.values()} - {"MultiConnector"})

    def stack(children: list[dict[str, object]]) -> dict[str, object]:
        return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": children}}

    bare = [{"kv_connector": name} for name in leaves]
    full = [{"kv_connector": name, "kv_connector_extra_config": options.get(name, {})} for name in leaves]
    configs: dict[str, object] = {f"{name}.json": leaf for name, leaf in zip(leaves, full, strict=True)}
    configs["all.json"] = stack(bare)
    configs["nested.json"] = stack([full[0], stack(full[1:]), stack([stack(full)])])
    configs["host.json"] = {"kv_connector": "CapkvHMAConnector", "kv_connector_module_path": "capkv.vllm",
                            "kv_role": "kv_both", "kv_connector_extra_config": {"stack": stack(full)}}
    configs["short.json"] = stack([{"kv_connector": name} for name in ("cpu", "file", "redis", "single")])
    return configs


@pytest.mark.parametrize("dev", [True, False], ids=["dev", "production"])
def test_capkv_check_of_capkvs_own_connectors_never_imports_torch(tmp_path: Path, dev: bool) -> None:
    """``capkv check`` reads classes and options; the store and copy modules it loads defer torch to first use."""
    configs = capkv_stacks(tmp_path)
    for name, config in configs.items():
        (tmp_path / name).write_text(json.dumps(config))
    code = BLOCK_TORCH + f"""
import json
from capkv.cli import main
codes = {{}}
for name in {sorted(configs)!r}:
    for groups in ([], ["--groups", "1"], ["--groups", "3"]):
        codes[name + " " + " ".join(groups)] = main(["check", name, *groups])
print(json.dumps({{"attempts": attempts, "codes": codes, "torch": "torch" in sys.modules,
                  "loaded": sorted(m for m in sys.modules if m.startswith("capkv."))}}))
"""
    result = probe(code, cwd=tmp_path, dev=dev)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["attempts"] == [], facts["attempts"][0]
    assert facts["torch"] is False
    assert "cannot import" not in result.stderr, result.stderr[-3000:]
    codes = facts["codes"]
    bare = {key: code for key, code in codes.items() if key.startswith(("all.json", "short.json"))}
    assert set(bare.values()) <= {1, 2}, bare  # options left out: refused (2), or not HMA-capable (1)
    assert {key: code for key, code in codes.items() if key not in bare and code not in (0, 1)} == {}  # verdicts
    assert codes["nested.json --groups 3"] == 1 and codes["CPUOffloadConnector.json --groups 3"] == 0
    loaded = set(facts["loaded"])
    assert {"capkv.connectors._cpu_offload", "capkv.connectors._file_store", "capkv.stores._base"} <= loaded


def test_the_copy_and_store_modules_import_without_torch() -> None:
    """Every module under capkv.transfer, capkv.stores and capkv.connectors imports with torch blocked."""
    code = BLOCK_TORCH + """
import importlib, json, pkgutil
import capkv.transfer, capkv.stores, capkv.connectors
names = [m.name for p in (capkv.transfer, capkv.stores, capkv.connectors) for m in pkgutil.iter_modules(p.__path__, p.__name__ + ".")]
skipped = {"capkv.transfer._bench"}  # capkv bench transfer: it times torch, so it imports it
for name in names:
    if name not in skipped:
        importlib.import_module(name)
print(json.dumps({"attempts": attempts, "modules": len(names)}))
"""
    for dev in (True, False):
        result = probe(code, dev=dev)
        assert result.returncode == 0, result.stderr[-3000:]
        facts = json.loads(result.stdout.strip().splitlines()[-1])
        assert facts["attempts"] == [], facts["attempts"][0]
        assert facts["modules"] > 20


def test_hiding_numpy_makes_torch_warn() -> None:
    """The control for the next test: the probe's numpy-less interpreter does make torch warn."""
    result = probe(HIDE_NUMPY + "import torch\n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Failed to initialize NumPy" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [["demo", "--help"], ["bench", "--help"], ["check", "stack.json"], ["check", "builtin.json"], ["--help"]],
    ids=["demo --help", "bench --help", "check", "check (capkv's stores)", "--help"],
)
def test_no_command_prints_torchs_numpy_warning(tmp_path: Path, argv: list[str]) -> None:
    """Without numpy (torch does not require it), no capkv command prints torch's warning about it."""
    (tmp_path / "mykv.py").write_text(USER_CONNECTORS)
    (tmp_path / "stack.json").write_text(json.dumps({"kv_connector": "mykv:Offload"}))
    stores = [{"kv_connector": "CPUOffloadConnector"}, {"kv_connector": "FileStoreConnector"}]
    builtin = {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": stores}}
    (tmp_path / "builtin.json").write_text(json.dumps(builtin))
    code = HIDE_NUMPY + f"import sys\nfrom capkv.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    result = probe(code, cwd=tmp_path)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "NumPy" not in result.stderr, result.stderr[-3000:]
    assert result.stdout  # the command did run: a tree, a usage text
