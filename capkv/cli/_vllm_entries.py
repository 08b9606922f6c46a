"""How vLLM reads one entry of a ``kv_transfer_config``: the class its factory builds, its children, its label.

Shared by the HMA verdict (:mod:`._vllm_judge`) and the sleep-mode check (:mod:`._vllm_sleep`); vLLM is imported only
to answer, so a capkv stack is judged without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, cast

from capkv.config._hosts import DROP_IN, HMA_HOST, HOST_MODULE, PLAIN_HOST

__all__ = [
    "MULTI",
    "Refused",
    "as_mapping",
    "capkv_host_class",
    "child_entries",
    "entry_label",
    "is_vllm_multi",
    "resolve_entry",
    "unwrap_config",
    "vllm_registers",
]

MULTI = "MultiConnector"


_NOT_INSTALLED = "vLLM is not installed, so how vLLM resolves it cannot be told (capkv[vllm])"


class Refused(Exception):
    """vLLM would refuse the configuration: the message names the entry."""


def unwrap_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    wrapped: object = config.get("kv_transfer_config")
    if "kv_connector" not in config and isinstance(wrapped, Mapping):
        return cast("Mapping[str, Any]", wrapped)
    return config


def entry_label(entry: Mapping[str, Any], position: str) -> str:
    return f"{position} {entry.get('kv_connector')}".strip()


def as_mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is a mapping (configurations are string-keyed), else an empty one."""
    return cast("Mapping[str, Any]", value) if isinstance(value, Mapping) else {}


def capkv_host_class(entry: Mapping[str, Any], position: str) -> str | None:
    """The class of ``capkv.vllm`` the entry names (known without importing vLLM), or ``None``."""
    if entry.get("kv_connector_module_path") != HOST_MODULE:
        return None
    name: object = entry.get("kv_connector")
    if name not in (PLAIN_HOST, HMA_HOST, DROP_IN):
        raise Refused(f'{entry_label(entry, position)}: class {name} not found in "{HOST_MODULE}"')
    return name


def child_entries(entry: Mapping[str, Any], position: str, *, required: bool) -> list[Mapping[str, Any]]:
    children: object = as_mapping(entry.get("kv_connector_extra_config")).get("connectors")
    if children is None and not required:
        return []
    if not isinstance(children, list) or not all(isinstance(c, Mapping) for c in cast("list[object]", children)):
        raise Refused(
            f'{entry_label(entry, position)} needs "connectors" in kv_connector_extra_config, a list of connector '
            f"entries, got {children!r}"
        )
    engine_id: object = entry.get("engine_id")
    found = [as_mapping(child) for child in cast("list[object]", children)]
    return [{"engine_id": engine_id, **child} for child in found] if engine_id is not None else found


def validate_entry(entry: Mapping[str, Any], position: str) -> None:
    """vLLM's own validation of the entry as a ``KVTransferConfig`` (where vLLM is installed)."""
    if importlib.util.find_spec("vllm") is None:
        return
    config: Any = importlib.import_module("vllm.config").KVTransferConfig
    try:
        config(**entry)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = next((line for line in lines if "Value error, " in line), lines[-1] if lines else type(exc).__name__)
        said = said.split("Value error, ", 1)[-1].split(" [type=", 1)[0]
        raise Refused(f"{entry_label(entry, position)}: vLLM's KVTransferConfig refuses it: {said}") from None


def resolve_entry(entry: Mapping[str, Any], position: str) -> type[Any]:
    """The class vLLM's ``KVConnectorFactory.get_connector_class`` gives for ``entry``."""
    label = entry_label(entry, position)
    name: object = entry.get("kv_connector")
    if not isinstance(name, str) or not name:
        raise Refused(f"{position or 'the configuration'}: kv_connector is not set")
    validate_entry(entry, position)
    module_path: object = entry.get("kv_connector_module_path")
    if module_path is not None:
        if not isinstance(module_path, str) or not module_path:
            raise Refused(f"{label}: kv_connector_module_path cannot be empty")
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:
            raise Refused(f'{label}: cannot import module "{module_path}": {type(exc).__name__}: {exc}') from None
        found: object = getattr(module, name, None)
        if not isinstance(found, type):
            raise Refused(f'{label}: class {name} not found in "{module_path}"')
        if not _takes_kv_cache_config(found):
            raise Refused(
                f"{label}: {found.__qualname__} does not take kv_cache_config (vLLM refuses the 2-argument constructor)"
            )
        return found
    if importlib.util.find_spec("vllm") is None:
        raise Refused(f"{label}: {_NOT_INSTALLED}")
    if not vllm_registers(name):
        raise Refused(f'{label}: vLLM knows no connector "{name}" (not registered; no kv_connector_module_path)')
    factory: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    config: Any = importlib.import_module("vllm.config").KVTransferConfig
    try:  # the class vLLM's factory builds for this entry (NIXL's transfer_mode "push": NixlPushConnector)
        cls: type[Any] = factory.get_connector_class(config(**entry))
    except Exception as exc:
        raise Refused(f"{label}: vLLM's connector factory refuses it: {type(exc).__name__}: {exc}") from None
    return cls


def vllm_registers(name: str) -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    factory: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    registry: Sequence[str] | Mapping[str, Any] = factory._registry  # pyright: ignore[reportPrivateUsage]
    return name in registry


def is_vllm_multi(cls: type[Any]) -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    module: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.multi_connector")
    multi: object = module.MultiConnector
    return isinstance(multi, type) and issubclass(cls, multi)


def _takes_kv_cache_config(cls: type[Any]) -> bool:
    """vLLM's ``supports_kw(cls, "kv_cache_config")``: a parameter of that name, or ``**kwargs``."""
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return "kv_cache_config" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
