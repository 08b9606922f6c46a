"""vLLM 0.33's ``enable_sleep_mode`` check of a ``kv_transfer_config``, decided from classes.

vLLM refuses sleep mode when its connector answers ``supports_sleep_mode`` False; this names the leaf that does,
answered as the hosts answer it (the same row of the capability table).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

from capkv.capabilities._table import SLEEP_MODE, fold
from capkv.cli._vllm_entries import (
    Refused,
    capkv_host_class,
    child_entries,
    entry_label,
    is_vllm_multi,
    resolve_entry,
)
from capkv.config._hosts import HOST_MODULE
from capkv.config._loader import ConfiguredNode, ConfiguredStack
from capkv.errors import CapkvError

__all__ = ["judge_sleep_mode", "sleep_mode_asked"]


def sleep_mode_asked(config: Mapping[str, Any]) -> bool:
    """Whether an engine configuration file sets ``enable_sleep_mode`` next to its ``kv_transfer_config``."""
    return "kv_connector" not in config and any(config.get(key) is True for key in _SLEEP_KEYS)


_SLEEP_KEYS = ("enable_sleep_mode", "enable-sleep-mode")


def judge_sleep_mode(entry: Mapping[str, Any]) -> str:
    """vLLM 0.33's ``enable_sleep_mode`` check: the sentence when vLLM allows it (or does not ask);
    :class:`Refused` naming the child and the leaf that answer no."""
    if importlib.util.find_spec("vllm") is None:
        return "sleep mode is not judged: vLLM is not installed (capkv[vllm]), so whether it asks the connector cannot be told"
    base: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base").KVConnectorBase_V1
    if getattr(base, SLEEP_MODE, None) is None:
        version: object = getattr(importlib.import_module("vllm"), "__version__", "?")
        return (
            f"sleep mode is not judged: the installed vLLM ({version}) has no {SLEEP_MODE} for connectors "
            "(vLLM 0.33 added it), so it does not ask this configuration whether the engine may sleep"
        )
    labels: dict[str, str] = {}
    no = _leaves_that_cannot_sleep(entry, "", labels)
    if no:
        leaf, label, why = no[0]
        child = leaf.split(".", 1)[0]
        where = f"{label} {why}" if child == leaf else f"{labels[child]} cannot sleep: its leaf {label} {why}"
        raise Refused(f"with enable_sleep_mode, {entry_label(entry, '') or 'the connector'} answers {SLEEP_MODE} False: {where}")
    return f"vLLM may sleep with this configuration (enable_sleep_mode): every leaf answers {SLEEP_MODE} True"


_No = list[tuple[str, str, str]]
"""The leaves that answer no: position, label, why."""


def _leaves_that_cannot_sleep(entry: Mapping[str, Any], position: str, labels: dict[str, str]) -> _No:
    """The leaves below ``entry`` that answer no, in stack order (none when the entry can sleep: its
    children's answers folded by the table's row)."""
    labels[position] = entry_label(entry, position)
    host = capkv_host_class(entry, position)
    if host is not None:
        return _capkv_leaves_that_cannot_sleep(entry, position, host, labels)
    cls = resolve_entry(entry, position)
    if is_vllm_multi(cls):
        children = child_entries(entry, position, required=True)
        found: _No = []
        answers: list[bool] = []
        for index, child in enumerate(children, start=1):
            no = _leaves_that_cannot_sleep(child, f"{position}.{index}" if position else f"#{index}", labels)
            answers.append(not no)
            found += no
        return [] if fold(SLEEP_MODE, answers) else found
    transfer: Any = importlib.import_module("vllm.config").KVTransferConfig
    answer = asked(lambda: cls.supports_sleep_mode(transfer(**entry)), labels[position])
    return [] if answer is True else [(position, labels[position], f"answers {SLEEP_MODE}() {answer!r}")]


def _capkv_leaves_that_cannot_sleep(
    entry: Mapping[str, Any], position: str, host: str, labels: dict[str, str]
) -> _No:
    """A capkv host's (or the drop-in's) leaves, each answered as the host answers it: a vLLM class by its
    own classmethod for its own entry, a capkv class by its class-level fact."""
    from capkv.adapters.vllm._stack import configured_fact
    from capkv.capabilities._facts import NEEDS_INSTANCE

    hosts: Any = importlib.import_module(HOST_MODULE)
    cls: Any = getattr(hosts, host)
    transfer: Any = importlib.import_module("vllm.config").KVTransferConfig(**entry)
    try:
        configured: ConfiguredNode | None = cls._configured(transfer.kv_connector_extra_config)
    except CapkvError as exc:
        raise Refused(f"{labels[position]}: {exc}") from None
    if configured is None:
        return []

    def walk(node: ConfiguredNode) -> _No:
        where = f"{position}.{node.position[1:]}" if position and node.position else node.position or position
        label = f"{where} {node.cls.__name__}".strip()
        if where != position:
            labels[where] = label
        if isinstance(node, ConfiguredStack):
            parts = [walk(child) for child in node.entries]
            return [] if fold(SLEEP_MODE, (not part for part in parts)) else [no for part in parts for no in part]
        answer = asked(
            lambda: configured_fact(node, SLEEP_MODE, vllm_config=None, transfer=transfer, inherit_role=cls.INHERIT_ROLE),
            label,
        )
        if answer is NEEDS_INSTANCE:
            return [(where, label, f"cannot say from its class ({SLEEP_MODE} is not class-level): the host answers no")]
        return [] if answer is True else [(where, label, f"answers {SLEEP_MODE}() {answer!r}")]

    return walk(configured)


def asked(ask: Callable[[], object], label: str) -> object:
    """A leaf's sleep-mode answer; what it raises, one refusal naming it."""
    try:
        return ask()
    except CapkvError as exc:
        raise Refused(f"{label}: {exc}") from None
    except Exception as exc:
        raise Refused(f"{label}: {SLEEP_MODE} raised {type(exc).__name__}: {exc}") from None
