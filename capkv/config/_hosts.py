"""Engine hosts of a capkv stack, as a configuration names them — without importing the engine.

The host inside vLLM and ``capkv check`` (with no vLLM installed) read the same shape and apply one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

from capkv.capabilities._hma import describe, explain_not_hma, non_hma_children, supports_hma
from capkv.config._loader import ConfiguredConnector, ConfiguredStack
from capkv.errors import CapabilityError, ConfigError

__all__ = [
    "DROP_IN",
    "HMA_HOST",
    "HOSTS",
    "HOST_MODULE",
    "PLAIN_HOST",
    "STACK_KEY",
    "HostEntry",
    "allowed_hosts",
    "drop_in_stack",
    "host_entry",
    "require_host_capability",
    "stack_config",
]

HOST_MODULE: Final = "capkv.vllm"
PLAIN_HOST: Final = "CapkvConnector"
HMA_HOST: Final = "CapkvHMAConnector"
HOSTS: Final = (PLAIN_HOST, HMA_HOST)
DROP_IN: Final = "MultiConnector"
"""``capkv.vllm.MultiConnector``: vLLM's composite's configuration (``connectors``), served by capkv."""
STACK_KEY: Final = "stack"
"""The key of ``kv_connector_extra_config`` that holds the hosted stack."""


@dataclass(frozen=True)
class HostEntry:
    """A ``kv_transfer_config`` that names a capkv host: which one, and the stack it hosts."""

    host: str
    """``CapkvConnector``, ``CapkvHMAConnector`` or ``MultiConnector`` (the drop-in)."""
    stack: Mapping[str, Any]
    """The hosted stack's configuration (``kv_connector_extra_config.stack``)."""


def host_entry(config: Mapping[str, Any]) -> HostEntry | None:
    """The capkv host ``config`` names (a ``{"kv_transfer_config": ...}`` wrapper is unwrapped), or ``None``.

    A host is named as vLLM loads it: ``kv_connector`` a host class and
    ``kv_connector_module_path = "capkv.vllm"``, or ``kv_connector = "capkv.vllm:<host>"``.
    Raises :class:`~capkv.ConfigError` for an unknown class in ``capkv.vllm`` or a missing stack.

    vLLM loads capkv through ``kv_connector_module_path = "capkv.vllm"`` and a host class, ``CapkvConnector``
    or ``CapkvHMAConnector``; the stack itself sits under ``kv_connector_extra_config.stack`` in the shape
    ``capkv check`` reads.
    """
    wrapped: object = config.get("kv_transfer_config")
    if "kv_connector" not in config and isinstance(wrapped, Mapping):
        config = cast("Mapping[str, Any]", wrapped)
    name: object = config.get("kv_connector")
    module: object = config.get("kv_connector_module_path")
    if isinstance(name, str) and module is None and name.startswith(HOST_MODULE + ":"):
        module, name = HOST_MODULE, name.partition(":")[2]
    if module != HOST_MODULE:
        return None
    extra: object = config.get("kv_connector_extra_config")
    if name == DROP_IN:
        return HostEntry(DROP_IN, drop_in_stack(extra))
    if name not in HOSTS:
        raise ConfigError(
            f'"{HOST_MODULE}" hosts a stack as {", ".join((DROP_IN, *HOSTS))}, not {name!r}',
            connector=str(name), method="kv_connector", value=name,
        )
    return HostEntry(name, stack_config(extra, host=name))


def drop_in_stack(extra: object) -> Mapping[str, Any]:
    """The stack of the drop-in's ``kv_connector_extra_config``: its ``stack`` (capkv's shape), or the
    composite of its ``connectors`` (vLLM's)."""
    given: Mapping[str, Any] = cast("Mapping[str, Any]", extra) if isinstance(extra, Mapping) else {}
    if STACK_KEY in given:
        return stack_config(given, host=DROP_IN)
    return {"kv_connector": DROP_IN, "kv_connector_extra_config": dict(given)}


def stack_config(extra: object, *, host: str) -> Mapping[str, Any]:
    """The stack under ``kv_connector_extra_config.stack``; a :class:`~capkv.ConfigError` when there is none."""
    stack: object = cast("Mapping[str, Any]", extra).get(STACK_KEY) if isinstance(extra, Mapping) else None
    if not isinstance(stack, Mapping):
        raise ConfigError(
            f'{host}: kv_connector_extra_config needs "{STACK_KEY}", the hosted stack '
            f'(e.g. {{"kv_connector": "MultiConnector", "kv_connector_extra_config": {{"connectors": [...]}}}}), '
            f"got {stack!r}",
            connector=host, method="__init__", value=stack,
        )
    return cast("Mapping[str, Any]", stack)


def allowed_hosts(stack: object) -> tuple[str, ...]:
    """The host classes that may serve ``stack`` (a connector, class, or configured stack)."""
    return HOSTS if supports_hma(_subject(stack)) else (PLAIN_HOST,)


def require_host_capability(host: str, stack: object) -> None:
    """Raise :class:`~capkv.CapabilityError` when ``host`` may not serve ``stack``.

    ``CapkvHMAConnector`` is a vLLM ``SupportsHMA``: vLLM keeps its hybrid
    allocator on and hands it every group, so every child of its stack must be
    HMA-capable — whatever the group count, as the class decides before vLLM knows it.
    """
    subject = _subject(stack)
    if host != HMA_HOST or supports_hma(subject):
        return
    offenders = non_hma_children(subject)
    raise CapabilityError(
        f'{HMA_HOST} cannot host "{describe(subject)}": {explain_not_hma(offenders)}; '
        f"host it with {PLAIN_HOST} (vLLM then turns its hybrid allocator off)",
        connector=", ".join(f"{c.position} {c.name}" if c.path else c.name for c in offenders),
        method="__init__",
        value=describe(subject),
    )


def _subject(stack: object) -> object:
    if isinstance(stack, ConfiguredStack):
        return stack
    if isinstance(stack, ConfiguredConnector):  # a configured leaf: its class decides
        return stack.cls
    return stack
