"""The public surface, pinned: which modules are public and what each exports.

Everything else lives in private modules (``capkv/<package>/_name.py``) and can
move freely. Changing a pin here is changing capkv's API: do it on purpose.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import types
from pathlib import Path
from typing import Any

import pytest

import capkv

ROOT = Path(capkv.__file__).resolve().parent

FRONTS: dict[str, list[str]] = {
    "capkv": [
        "ArgumentError",
        "AttentionMetadata",
        "BlockIds",
        "CapabilityError",
        "CapkvError",
        "ComputedTokenRequest",
        "ConfigError",
        "ConflictError",
        "ConnectorMetadata",
        "ContractError",
        "FinishError",
        "ForwardContext",
        "HMAConnector",
        "HMAMultiConnector",
        "HandshakeMetadata",
        "KVCacheAccess",
        "KVCacheConfigLike",
        "KVConnector",
        "KVConnectorBase",
        "KVConnectorOutput",
        "KVGroupSpec",
        "KVShard",
        "KVSpec",
        "KVTransferParams",
        "KeyInputs",
        "KeyedRequest",
        "LoadErrors",
        "MetadataError",
        "MultiConnector",
        "MultiConnectorMetadata",
        "MultiWorkerMetadata",
        "MultimodalItem",
        "NonHMAChild",
        "Request",
        "SchedulerOutput",
        "StackNode",
        "SubConnectorError",
        "SupportsHMA",
        "TokenRequest",
        "WorkerMetadata",
        "check_stack",
        "class_level",
        "finish_request",
        "non_hma_children",
        "require_hma",
        "supports_hma",
    ],
    "capkv.errors": [
        "ArgumentError",
        "CapabilityError",
        "CapkvError",
        "ConfigError",
        "ConflictError",
        "ContractError",
        "FinishError",
        "MetadataError",
        "SubConnectorError",
    ],
    "capkv.composite": ["NOT_BUILT", "Drop", "DroppedReports"],
    "capkv.config": [
        "ENTRY_POINT_GROUP",
        "BuildContext",
        "ConfiguredConnector",
        "ConfiguredNode",
        "ConfiguredStack",
        "ConnectorFactory",
        "ConnectorOptions",
        "ConnectorRegistry",
        "Option",
        "build_connector",
        "build_stack",
        "check_extra_config",
        "declared_options",
        "default_registry",
        "load_stack",
        "load_stack_file",
        "register_connector",
    ],
    "capkv.connectors": [
        "BlockKey",
        "CPUOffloadConnector",
        "FileStoreConnector",
        "GroupGeometry",
        "PrefixHasher",
        "PrefixStoreConnector",
        "RedisStoreConnector",
        "SaveReport",
        "SingleGroupOffloadConnector",
        "StoreMetadata",
        "longest_hit",
    ],
    "capkv.stores": ["Backend", "MemoryBackend", "PinningBackend", "ReadsInto", "StoreConnector", "StoreKey"],
    "capkv.engine": [
        "FULL",
        "SLIDING",
        "Engine",
        "EngineStats",
        "FinishedRequest",
        "GroupLayout",
        "GroupStats",
        "Mismatch",
        "ModelShape",
        "VerificationError",
        "Workload",
    ],
    "capkv.transfer": ["BlockCopier", "CopyHandle", "spec_block_nbytes"],
    "capkv.devmode": [
        "ENV_VAR",
        "Instrumented",
        "block_copy_hint",
        "block_groups_hint",
        "block_ids_hint",
        "contract_hint",
        "dev_mode",
        "enabled",
        "forced_off",
        "instrument",
        "kv_caches_hint",
        "kv_layer_hint",
        "set_dev_mode",
        "single_group_hint",
        "types_checked",
    ],
    "capkv.mypy": ["plugin"],
    "capkv.cli": ["main"],
    "capkv.vllm": ["CapkvConnector", "CapkvHMAConnector", "HMAVllmChild", "MultiConnector", "VllmChild", "wrap"],
    "capkv.testing": [
        "DEFAULT_LAYOUTS",
        "DEFAULT_WORKLOAD",
        "ConformanceFailure",
        "ConformanceReport",
        "ConformanceFactory",
        "HMANullConnector",
        "NullConnector",
        "ScenarioResult",
        "ScheduledRequest",
        "assert_conformant",
        "check_connector",
        "describe_layout",
        "forward_context",
        "kv_caches",
        "make_request",
        "scheduled",
        "scheduler_output",
    ],
}
"""Every public module and its exports."""

INTERNAL_PACKAGES = {"capkv.capabilities", "capkv.contracts"}
"""Packages that only hold private modules; their names are public from ``capkv``. They export nothing."""

ADAPTER_PACKAGES = {"capkv.adapters", "capkv.adapters.vllm"}
"""Engine adapters: private by their docstrings (their front is ``capkv.vllm``); to be renamed ``_adapters``."""

OPTIONAL = {"capkv.vllm": "vllm"}
"""Fronts that need an optional dependency to import: pinned where it is installed."""


def load(front: str) -> types.ModuleType:
    if front in OPTIONAL:
        pytest.importorskip(OPTIONAL[front])
    return importlib.import_module(front)


ALIASES = {("capkv", "capkv.errors")}
"""The one place a name is public twice: ``capkv.ConfigError`` is ``capkv.errors.ConfigError``."""

ENGINE_NAMES = {"MultiConnector": ("capkv", "capkv.vllm")}
"""Names an engine dictates: vLLM loads ``getattr(capkv.vllm, "MultiConnector")`` for a configuration that
names its composite (``capkv.vllm.MultiConnector``, the drop-in, is not ``capkv.MultiConnector``)."""


def public_modules() -> list[str]:
    found = ["capkv"] + [m.name for m in pkgutil.walk_packages(capkv.__path__, "capkv.")]
    return sorted(m for m in found if not any(part.startswith("_") for part in m.split(".")))


def test_no_module_outside_the_fronts_is_public() -> None:
    assert set(public_modules()) == set(FRONTS) | INTERNAL_PACKAGES | ADAPTER_PACKAGES


def test_inside_capkv_packages_every_module_is_private() -> None:
    """On disk too: ``capkv/<package>/`` holds its front (``__init__.py``) and ``_name`` modules only."""
    internal_dirs = {ROOT.parent.joinpath(*package.split(".")) for package in INTERNAL_PACKAGES | ADAPTER_PACKAGES}
    public = [
        str(path.relative_to(ROOT.parent))
        for path in ROOT.glob("*/**/*.py")
        if (not path.name.startswith("_") or not (path.parent == ROOT or path.parent in internal_dirs | {
            ROOT.parent.joinpath(*front.split(".")) for front in FRONTS}))
    ]
    assert public == []


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_each_front_exports_exactly_its_pinned_names(front: str) -> None:
    module = load(front)
    assert sorted(module.__all__) == sorted(FRONTS[front])
    for name in module.__all__:
        assert getattr(module, name) is not None
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'Typo'"):
        getattr(module, "Typo")  # noqa: B009


@pytest.mark.parametrize("package", sorted(INTERNAL_PACKAGES))
def test_internal_packages_export_nothing(package: str) -> None:
    assert importlib.import_module(package).__all__ == []


@pytest.mark.parametrize("front", sorted(FRONTS | {p: [] for p in INTERNAL_PACKAGES}))
def test_dir_shows_the_fronts_names_and_nothing_else(front: str) -> None:
    """No helper (``attach``, ``TYPE_CHECKING``, ``annotations``) in ``dir()`` or the namespace."""
    module = load(front)
    shown = {name for name in dir(module) if not name.startswith("_")}
    below = {name for name in shown if isinstance(getattr(module, name), types.ModuleType)}
    assert shown - below == set(module.__all__)
    assert all(f"{front}.{name}" in FRONTS or f"{front}.{name}" in INTERNAL_PACKAGES for name in below), below
    helpers = {
        name for name, value in vars(module).items() if not name.startswith("_") and not isinstance(value, types.ModuleType)
    } - set(module.__all__)
    assert helpers == set(), helpers


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_what_checkers_read_is_what_the_interpreter_gives(front: str) -> None:
    """A lazy front's ``if TYPE_CHECKING:`` imports (or plain ones) name every export, from where the interpreter takes it."""
    module = load(front)
    path = Path(module.__file__ or "")
    tree = ast.parse(path.read_text())
    checked = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    if not checked:  # errors: its exports are its own
        return
    plain = [n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("capkv.")]
    imported: dict[str, object] = {}
    for node in [*plain, *(n for block in checked for n in ast.walk(block))]:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            source = importlib.import_module(node.module)
            imported.update({a.name: getattr(source, a.name) for a in node.names if not a.name.startswith("_")})
    helpers = {"attach", "before_loading", "require_vllm"}
    imported = {name: value for name, value in imported.items() if name not in helpers and not name.startswith("_")}
    assert sorted(imported) == sorted(module.__all__)
    for name, value in imported.items():
        assert getattr(module, name) is value, name


def test_no_name_is_public_twice() -> None:
    """One name, one front — so ``capkv.engine`` no longer has a ``Request`` beside ``capkv.Request``."""
    homes: dict[str, list[str]] = {}
    for front, names in FRONTS.items():
        for name in names:
            homes.setdefault(name, []).append(front)
    twice = {name: fronts for name, fronts in homes.items() if len(fronts) > 1}
    for name, fronts in twice.items():
        if ENGINE_NAMES.get(name) == tuple(sorted(fronts)):
            continue
        assert tuple(sorted(fronts)) in ALIASES, f"{name} is exported by {fronts}"
        first, second = (load(f) for f in fronts)
        assert getattr(first, name) is getattr(second, name)


def test_no_object_is_public_under_two_names() -> None:
    seen: dict[int, str] = {}
    for front, names in FRONTS.items():
        if front in OPTIONAL and importlib.util.find_spec(OPTIONAL[front]) is None:
            continue  # pinned by the parametrised tests where it is installed
        module = importlib.import_module(front)
        for name in names:
            value = getattr(module, name)
            if isinstance(value, (str, int, tuple, types.ModuleType)) or value is Any:
                continue  # constants may coincide by value; engine objects capkv does not type are aliases of Any
            other = seen.setdefault(id(value), name)
            assert other == name, f"{front}.{name} is also public as {other}"


def test_names_that_are_bare_any_say_so_where_they_are_defined() -> None:
    """``capkv.SchedulerOutput`` is ``typing.Any``: its docstring (read by docs and editors) must say so."""
    found = []
    for front, names in FRONTS.items():
        if front in OPTIONAL and importlib.util.find_spec(OPTIONAL[front]) is None:
            continue
        module = importlib.import_module(front)
        for name in names:
            if getattr(module, name) is not Any:
                continue
            found.append(name)
            defined = next(m for m, ns in capkv._homes._FRONTS[front].items() if name in ns)  # noqa: SLF001
            tree = ast.parse(Path(importlib.import_module(defined).__file__ or "").read_text())
            body = tree.body
            at = next(i for i, n in enumerate(body) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == name)
            doc = body[at + 1]
            assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), f"{name} has no docstring"
            assert "alias of ``typing.Any``" in str(doc.value.value), f"{defined}.{name}: {doc.value.value!r}"
    assert len(found) == 5, found
