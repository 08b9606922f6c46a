"""Connector names resolve to classes: registered, entry points, "module:Class", module path."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

import pytest

import capkv.config._registry as registry_module
from capkv import ConfigError, MultiConnector
from capkv.config import ConnectorRegistry, default_registry, register_connector
from capkv.config._registry import resolve_connector
from tests.config.sample_connectors import DiskConnector, OffloadConnector

SAMPLES = "tests.config.sample_connectors"


def test_builtin_names_resolve_lazily_to_capkv_classes() -> None:
    registry = ConnectorRegistry()
    assert "MultiConnector" in registry.names()
    assert registry.resolve("MultiConnector") is MultiConnector
    assert resolve_connector("MultiConnector") is MultiConnector


def test_a_builtin_is_one_module_path_line() -> None:
    registry = ConnectorRegistry({"Disk": f"{SAMPLES}:DiskConnector"}, entry_point_group=None)
    assert registry.names() == ["Disk"]
    assert registry.resolve("Disk") is DiskConnector


def test_decorator_registers_and_returns_the_class() -> None:
    registry = ConnectorRegistry(entry_point_group=None)

    @registry.register("fast-disk")
    class FastDisk(DiskConnector):
        pass

    assert registry.resolve("fast-disk") is FastDisk
    assert "fast-disk" in registry.names()


def test_default_registry_decorator() -> None:
    name = "tests.config.default-registry-sample"
    decorated = register_connector(name)(OffloadConnector)
    assert decorated is OffloadConnector
    assert default_registry.resolve(name) is OffloadConnector


def test_registering_a_name_twice_for_another_class_is_refused() -> None:
    registry = ConnectorRegistry(entry_point_group=None)
    registry.add("disk", DiskConnector)
    registry.add("disk", DiskConnector)  # the same class again is harmless
    registry.add("disk", f"{SAMPLES}:DiskConnector")  # and so is its own path
    with pytest.raises(ConfigError, match='"disk" is already registered'):
        registry.add("disk", OffloadConnector)


def test_module_colon_class_and_module_path() -> None:
    registry = ConnectorRegistry(entry_point_group=None)
    assert registry.resolve(f"{SAMPLES}:OffloadConnector") is OffloadConnector
    assert registry.resolve("DiskConnector", module_path=SAMPLES) is DiskConnector


def test_entry_points_are_read_once_and_lose_to_registered_names(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        calls.append(group)
        return [
            EntryPoint("plugin-disk", f"{SAMPLES}:DiskConnector", group),
            EntryPoint("MultiConnector", f"{SAMPLES}:DiskConnector", group),
        ]

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    registry = ConnectorRegistry()
    assert registry.resolve("plugin-disk") is DiskConnector
    assert registry.resolve("MultiConnector") is MultiConnector
    assert "plugin-disk" in registry.names()
    assert calls == ["capkv.connectors"]


@pytest.mark.parametrize(
    ("name", "module_path", "message"),
    [
        ("Nope", None, r'unknown connector "Nope" \(registered: CPUOffloadConnector, FileStoreConnector, MultiConnector, SingleGroupOffloadConnector, cpu, file, single; or give a "module:Class" path\)'),
        ("no.such.module:Disk", None, r'cannot import module "no.such.module" for connector "no.such.module:Disk"'),
        (f"{SAMPLES}:Missing", None, rf'module "{SAMPLES}" has no attribute "Missing"'),
        ("Missing", SAMPLES, rf'module "{SAMPLES}" has no attribute "Missing"'),
        (f"{SAMPLES}:NotAConnector", None, r"is not a KVConnector class \(missing get_num_new_matched_tokens, "),
        (f"{SAMPLES}:not_a_class", None, r"is not a class \(got function\)"),
        (f"{SAMPLES}:registry", None, r"is not a class \(got ConnectorRegistry\)"),
        ("capkv:KVConnectorBase", None, r"is abstract \(does not implement build_connector_meta, "),
        (":Disk", None, r'bad connector path ":Disk"'),
        ("tests.config.broken_module:Anything", None, r'importing module "tests.config.broken_module" .* failed: ZeroDivisionError'),
    ],
)
def test_resolution_errors_are_one_clear_line(name: str, module_path: str | None, message: str) -> None:
    registry = ConnectorRegistry(entry_point_group=None)
    with pytest.raises(ConfigError, match=message) as caught:
        registry.resolve(name, module_path=module_path)
    assert "\n" not in str(caught.value)


def test_resolution_errors_carry_the_name() -> None:
    with pytest.raises(ConfigError) as caught:
        ConnectorRegistry(entry_point_group=None).resolve("Nope")
    error: Any = caught.value
    assert (error.connector, error.method, error.value) == ("Nope", "resolve", "Nope")
