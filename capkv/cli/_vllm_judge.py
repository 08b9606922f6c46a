"""What vLLM (0.32 to 0.34) does with a ``kv_transfer_config``, decided from classes: HMA on, HMA off, or refused.

Nothing is built, so ``capkv check`` can answer without vLLM's engine; each verdict names the child that
decided it (vLLM's rules: docs/internals.md, "The command line").
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from capkv.cli._vllm_entries import (
    MULTI,
    Refused,
    as_mapping,
    capkv_host_class,
    child_entries,
    entry_label,
    is_vllm_multi,
    resolve_entry,
    unwrap_config,
    vllm_registers,
)
from capkv.cli._vllm_sleep import judge_sleep_mode
from capkv.config._hosts import HMA_HOST, HOST_MODULE, PLAIN_HOST, STACK_KEY
from capkv.config._loader import ConfiguredStack, load_stack
from capkv.errors import CapkvError

__all__ = ["Judgement", "Verdict", "build_as_vllm", "judge", "vllm_loads"]


class Verdict(enum.Enum):
    """What vLLM does with the configuration (and ``capkv check``'s exit status for it)."""

    HMA_ON = 0
    HMA_OFF = 1
    REFUSED = 2


@dataclass


class Judgement:
    """The verdict, the sentence that says why, and each node's HMA answer (by position)."""

    verdict: Verdict
    reason: str
    hma: dict[str, bool] = field(default_factory=lambda: dict[str, bool]())
    sleep: str | None = None
    """With sleep mode asked about and not refused: what vLLM does about it (may sleep, or does not ask)."""


def vllm_loads(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` is a configuration vLLM reads as its own: it names a class of ``capkv.vllm``, or
    every connector in it is one vLLM knows by name or by ``kv_connector_module_path``."""
    entry = unwrap_config(config)
    if entry.get("kv_connector_module_path") == HOST_MODULE:
        return True
    return _all_known(entry)


def _all_known(entry: Mapping[str, Any]) -> bool:
    """Every connector of ``entry`` is one vLLM resolves. capkv's own names (registered, ``module:Class``)
    are told first, so a capkv stack is recognised without importing vLLM (or torch)."""
    name = entry.get("kv_connector")
    if not isinstance(name, str) or ":" in name:
        return False
    path = entry.get("kv_connector_module_path")
    if path is None and name != MULTI and _capkv_owns(name):
        return False
    children: object = as_mapping(entry.get("kv_connector_extra_config")).get("connectors") if name == MULTI else None
    if isinstance(children, list):
        entries = cast("list[object]", children)
        if not all(isinstance(child, Mapping) for child in entries) or not all(_all_known(as_mapping(c)) for c in entries):
            return False
    return path is not None or vllm_registers(name)


def _capkv_owns(name: str) -> bool:
    from capkv.config._registry import default_registry

    return default_registry.owns(name)


def judge(config: Mapping[str, Any], *, sleep_mode: bool = False) -> Judgement:
    """What vLLM does with ``config`` when it decides HMA itself (and, with ``sleep_mode``, when
    ``enable_sleep_mode`` is set)."""
    entry = unwrap_config(config)
    hma: dict[str, bool] = {}
    sleep: str | None = None
    try:
        on, why_off = _config_time_hma(entry, "", hma)
        _constructs(entry, "", on)
        if sleep_mode:
            sleep = judge_sleep_mode(entry)
    except Refused as refused:
        return Judgement(Verdict.REFUSED, f"vLLM refuses this configuration: {refused}", hma)
    if on:
        return Judgement(Verdict.HMA_ON, "vLLM runs this with its hybrid KV-cache allocator (HMA) on", hma, sleep)
    return Judgement(Verdict.HMA_OFF, f"vLLM turns its hybrid KV-cache allocator (HMA) off: {why_off}", hma, sleep)


def build_as_vllm(config: Mapping[str, Any]) -> list[str]:
    """Build the configured connector as vLLM builds its scheduler's (``--build``), over a KV cache
    configuration without groups (vLLM's placeholder); one line when that raises."""
    entry = unwrap_config(config)
    try:
        from vllm.config import KVTransferConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.kv_cache_interface import KVCacheConfig

        vllm_config = VllmConfig(kv_transfer_config=KVTransferConfig(**dict(entry)))
        placeholder = KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[])
        built = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.SCHEDULER, placeholder)
        shutdown: Any = getattr(built, "shutdown", None)
        if callable(shutdown):
            shutdown()
    except Exception as exc:
        return [f"building {entry_label(entry, '')} as vLLM does raised {type(exc).__name__}: {exc}"]
    return []


def _config_time_hma(entry: Mapping[str, Any], position: str, hma: dict[str, bool]) -> tuple[bool, str]:
    """vLLM's ``KVConnectorFactory.supports_hma_config``: (HMA kept on, why not)."""
    host = capkv_host_class(entry, position)
    name = entry.get("kv_connector")
    if host in (PLAIN_HOST, HMA_HOST):
        hma[position] = host == HMA_HOST
        why = f"{entry_label(entry, position)} is not a vLLM SupportsHMA (host the stack with {HMA_HOST} to keep HMA on)"
        return host == HMA_HOST, "" if host == HMA_HOST else why
    if name != MULTI:
        on = _supports_hma(resolve_entry(entry, position))
        hma[position] = on
        return on, "" if on else f"{entry_label(entry, position)} does not derive from vLLM's SupportsHMA"
    children = child_entries(entry, position, required=False)
    if not children:
        hma[position] = False
        return False, f'{entry_label(entry, position) or MULTI} has no child ("connectors" is empty)'
    for index, child in enumerate(children, start=1):
        where = f"{position}.{index}" if position else f"#{index}"
        on, why = _config_time_hma(child, where, hma)
        if not on:  # vLLM stops at the first child that does not support HMA
            hma[position] = False
            return False, why
    hma[position] = True
    return True, ""


def _constructs(entry: Mapping[str, Any], position: str, hma_on: bool) -> None:
    """What building the connector refuses, decided from classes."""
    host = capkv_host_class(entry, position)
    if host is not None:
        _capkv_host(entry, position, host, hma_on)
        return
    cls = resolve_entry(entry, position)
    if is_vllm_multi(cls):
        children = child_entries(entry, position, required=True)
        wheres = [f"{position}.{index}" if position else f"#{index}" for index in range(1, len(children) + 1)]
        for child, where in zip(children, wheres):
            _constructs(child, where, hma_on)
        every = bool(children) and all(_config_time_hma(child, where, {})[0] for child, where in zip(children, wheres))
        if hma_on and not every:  # only under another name: vLLM asked the class, which claims HMA
            raise Refused(
                f"{entry_label(entry, position)} is vLLM's MultiConnector, which vLLM kept HMA on for by its class; "
                "it then asserts that every child supports HMA, and not every one does"
            )
        return


def _capkv_host(entry: Mapping[str, Any], position: str, name: str, hma_on: bool) -> None:
    """capkv's hosts refuse at construction what :mod:`capkv.config._hosts` refuses."""
    from capkv.capabilities._hma import describe, explain_not_hma, non_hma_children, supports_hma
    from capkv.config._hosts import require_host_capability

    extra = as_mapping(entry.get("kv_connector_extra_config"))
    if name in (PLAIN_HOST, HMA_HOST) or STACK_KEY in extra:
        stack: object = extra.get(STACK_KEY)
        config = as_mapping(stack)
        if not config:
            raise Refused(f'{entry_label(entry, position)}: kv_connector_extra_config needs "{STACK_KEY}", the hosted stack')
    else:  # the drop-in, in vLLM's shape
        children: object = extra.get("connectors")
        if isinstance(children, list) and not children:
            return
        config = {"kv_connector": MULTI, "kv_connector_extra_config": dict(extra)}
    try:
        configured = load_stack(config)
    except CapkvError as exc:
        raise Refused(f"{entry_label(entry, position)}: {exc}") from None
    subject: object = configured if isinstance(configured, ConfiguredStack) else configured.cls
    if name == HMA_HOST:
        try:
            require_host_capability(HMA_HOST, configured)
        except CapkvError as exc:
            raise Refused(str(exc)) from None
    if hma_on and not supports_hma(subject):
        raise Refused(
            f'{entry_label(entry, position)} cannot serve HMA with "{describe(subject)}": '
            f"{explain_not_hma(non_hma_children(subject))}"
        )


def _supports_hma(cls: type[Any]) -> bool:
    base: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
    return issubclass(cls, base.SupportsHMA)
