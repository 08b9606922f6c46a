"""Configured stacks: classes first, capability from classes, connectors only when built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capkv import (
    CapabilityError,
    ConfigError,
    ConflictError,
    HMAMultiConnector,
    MultiConnector,
    check_stack,
    non_hma_children,
    require_hma,
    supports_hma,
)
from capkv.config._loader import read_config_file
from capkv.config import (
    ConfiguredConnector,
    ConfiguredStack,
    ConnectorRegistry,
    build_stack,
    load_stack,
    load_stack_file,
)
from tests.config.sample_connectors import DiskConnector, FactoryBuilt, OffloadConnector

SAMPLES = "tests.config.sample_connectors"
OFFLOAD = {"kv_connector": f"{SAMPLES}:OffloadConnector"}
DISK = {"kv_connector": "DiskConnector", "kv_connector_module_path": SAMPLES}


def multi(*children: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": list(children), **extra}}


def test_a_leaf_resolves_to_its_class_with_its_extra_config() -> None:
    node = load_stack({**DISK, "kv_role": "kv_both", "kv_connector_extra_config": {"layout": "HND"}})
    assert node == ConfiguredConnector("DiskConnector", DiskConnector, {"layout": "HND"}, "")


def test_nested_stacks_keep_order_and_positions() -> None:
    node = load_stack(multi(OFFLOAD, multi(DISK, OFFLOAD)))
    assert isinstance(node, ConfiguredStack)
    assert node.cls is MultiConnector and node.position == ""
    inner = node.entries[1]
    assert isinstance(inner, ConfiguredStack)
    assert [entry.position for entry in inner.entries] == ["#2.1", "#2.2"]
    assert node.children == (OffloadConnector, inner)
    assert inner.children == (DiskConnector, OffloadConnector)


def test_capability_is_decided_from_classes_by_the_runtime_rule() -> None:
    hma_stack = load_stack(multi(OFFLOAD, multi(OFFLOAD)))
    mixed = load_stack(multi(OFFLOAD, multi(OFFLOAD, DISK), DISK))
    assert supports_hma(hma_stack)
    assert not supports_hma(mixed)
    assert [(c.position, c.name) for c in non_hma_children(mixed)] == [("#2.2", "DiskConnector"), ("#3", "DiskConnector")]


def test_require_hma_explains_a_configured_stack_like_check_stack_explains_a_built_one() -> None:
    configured = load_stack(multi(OFFLOAD, multi(DISK)))
    with pytest.raises(CapabilityError) as from_classes:
        require_hma(configured, 2)
    with pytest.raises(CapabilityError) as from_instances:
        check_stack(build_stack(configured), 2)
    assert str(from_classes.value) == str(from_instances.value) == (
        '"MultiConnector" cannot serve 2 KV-cache groups: sub-connector #2.1 "DiskConnector" does not '
        "implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to"
    )
    require_hma(configured, 1)


def test_loading_constructs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("constructed while loading")

    monkeypatch.setattr(DiskConnector, "__init__", refuse)
    configured = load_stack(multi(OFFLOAD, DISK))
    assert not supports_hma(configured)


def test_build_makes_the_stack_with_the_inferred_class() -> None:
    built = build_stack(load_stack(multi({**OFFLOAD, "kv_connector_extra_config": {"layout": "HND"}}, OFFLOAD)))
    assert isinstance(built, HMAMultiConnector)
    assert [type(c) for c in built.children] == [OffloadConnector, OffloadConnector]
    assert built.get_required_kvcache_layout() == "HND"
    plain = build_stack(load_stack(multi(OFFLOAD, DISK)))
    assert type(plain) is MultiConnector


def test_build_uses_the_factory_hook_or_a_given_factory() -> None:
    leaf = load_stack({"kv_connector": f"{SAMPLES}:FactoryBuilt", "kv_connector_extra_config": {"layout": "NHD"}})
    built = build_stack(leaf)
    assert isinstance(built, FactoryBuilt) and built.layout == "NHD"
    seen: list[str] = []

    def factory(node: ConfiguredConnector) -> Any:
        seen.append(node.position)
        return DiskConnector()

    stack = build_stack(load_stack(multi(OFFLOAD, DISK)), factory=factory)
    assert seen == ["#1", "#2"] and isinstance(stack, MultiConnector)


def test_build_errors_name_the_entry() -> None:
    configured = load_stack(multi(OFFLOAD, {**DISK, "kv_connector_extra_config": {"colour": "red"}}))
    with pytest.raises(ConfigError, match=r'^#2: cannot build "DiskConnector" with DiskConnector\(kv_connector_extra_config\): TypeError: '):
        build_stack(configured)


def test_children_conflicts_surface_from_the_built_stack() -> None:
    built = build_stack(load_stack(multi(
        {**OFFLOAD, "kv_connector_extra_config": {"layout": "HND"}},
        {**DISK, "kv_connector_extra_config": {"layout": "NHD"}},
    )))
    with pytest.raises(ConflictError, match="get_required_kvcache_layout: sub-connectors disagree"):
        check_stack(built, 1)


def test_an_engine_config_wrapper_is_unwrapped() -> None:
    assert load_stack({"kv_transfer_config": DISK}).cls is DiskConnector


def test_a_registry_of_ones_own() -> None:
    registry = ConnectorRegistry({"disk": f"{SAMPLES}:DiskConnector"}, entry_point_group=None, engine_namespaces=())
    assert load_stack({"kv_connector": "disk"}, registry=registry).cls is DiskConnector
    with pytest.raises(ConfigError, match='unknown connector "MultiConnector"'):
        load_stack(multi(DISK), registry=registry)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, r'^missing "kv_connector"$'),
        ({"kv_connector": 3}, r'^"kv_connector" must be a non-empty string, got a number$'),
        ({**DISK, "kv_connector_extra_config": []}, r'^"kv_connector_extra_config" must be an object, got a list$'),
        ({"kv_connector": "MultiConnector"}, r'^composite "MultiConnector" needs a non-empty "connectors" list'),
        (multi(), r'^composite "MultiConnector" needs a non-empty "connectors" list .* got a list$'),
        (multi(OFFLOAD, ["not", "an", "object"]), r'^#2: a connector entry must be an object with "kv_connector", got a list$'),
        (multi(OFFLOAD, multi({"kv_connector": "Nope"})), r'^#2.1: unknown connector "Nope"'),
        (multi({"kv_connector": "os:getcwd"}), r'^#1: connector "os:getcwd" is not a class'),
        ({**DISK, "kv_connector_extra_config": {1: 2}}, r"kv_connector_extra_config: keys must be strings"),
    ],
)
def test_malformed_configurations_are_one_line_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_stack(config)
    assert "\n" not in str(caught.value)


def test_json_and_toml_files_load_alike(tmp_path: Path) -> None:
    config = multi(OFFLOAD, DISK)
    (tmp_path / "stack.json").write_text(json.dumps(config))
    (tmp_path / "stack.toml").write_text(
        'kv_connector = "MultiConnector"\n'
        f'[[kv_connector_extra_config.connectors]]\nkv_connector = "{SAMPLES}:OffloadConnector"\n'
        f'[[kv_connector_extra_config.connectors]]\nkv_connector = "DiskConnector"\nkv_connector_module_path = "{SAMPLES}"\n'
    )
    assert read_config_file(tmp_path / "stack.json") == read_config_file(tmp_path / "stack.toml") == config
    assert load_stack_file(tmp_path / "stack.toml") == load_stack(config)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.json", '{"kv_connector": ', r"bad.json: invalid JSON at line 1 column 18: Expecting value$"),
        ("bad.toml", "kv_connector = \n", r"bad.toml: invalid TOML: "),
        ("list.json", "[1, 2]", r'list.json: expected an object with "kv_connector" at the top level, got a list$'),
        ("stack.yaml", "kv_connector: Disk", r'stack.yaml: unsupported file type ".yaml" \(use .json or .toml\)$'),
    ],
)
def test_malformed_files_are_one_line_errors(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        read_config_file(tmp_path / name)
    assert "\n" not in str(caught.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing.json: cannot read: No such file or directory$"):
        read_config_file(tmp_path / "missing.json")
