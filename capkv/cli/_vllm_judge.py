"""What vLLM (0.32, 0.33) does with a ``kv_transfer_config``, decided from classes: HMA on, HMA off, or refused.

Nothing is built, so ``capkv check`` can answer without vLLM's engine; each verdict names the child that
decided it (vLLM's rules: docs/internals.md, "The command line").
"""

from __future__ import annotations

import enum
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from capkv.capabilities._table import SLEEP_MODE, fold
from capkv.config._hosts import DROP_IN, HMA_HOST, HOST_MODULE, PLAIN_HOST, STACK_KEY
from capkv.config._loader import ConfiguredNode, ConfiguredStack, load_stack
from capkv.errors import CapkvError

__all__ = ["Judgement", "Verdict", "build_as_vllm", "judge", "sleep_mode_asked", "vllm_loads"]

_MULTI = "MultiConnector"
_NOT_INSTALLED = "vLLM is not installed, so how vLLM resolves it cannot be told (capkv[vllm])"


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


class _Refused(Exception):
    """vLLM would refuse the configuration: the message names the entry."""


def vllm_loads(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` is a configuration vLLM reads as its own: it names a class of ``capkv.vllm``, or
    every connector in it is one vLLM knows by name or by ``kv_connector_module_path``."""
    entry = _unwrap(config)
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
    if path is None and name != _MULTI and _capkv_owns(name):
        return False
    children: object = _mapping(entry.get("kv_connector_extra_config")).get("connectors") if name == _MULTI else None
    if isinstance(children, list):
        entries = cast("list[object]", children)
        if not all(isinstance(child, Mapping) for child in entries) or not all(_all_known(_mapping(c)) for c in entries):
            return False
    return path is not None or _registered(name)


def _capkv_owns(name: str) -> bool:
    from capkv.config._registry import default_registry

    return default_registry.owns(name)


def _mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is a mapping (configurations are string-keyed), else an empty one."""
    return cast("Mapping[str, Any]", value) if isinstance(value, Mapping) else {}


def judge(config: Mapping[str, Any], *, sleep_mode: bool = False) -> Judgement:
    """What vLLM does with ``config`` when it decides HMA itself (and, with ``sleep_mode``, when
    ``enable_sleep_mode`` is set)."""
    entry = _unwrap(config)
    hma: dict[str, bool] = {}
    sleep: str | None = None
    try:
        on, why_off = _config_time_hma(entry, "", hma)
        _constructs(entry, "", on)
        if sleep_mode:
            sleep = _sleep_mode(entry)
    except _Refused as refused:
        return Judgement(Verdict.REFUSED, f"vLLM refuses this configuration: {refused}", hma)
    if on:
        return Judgement(Verdict.HMA_ON, "vLLM runs this with its hybrid KV-cache allocator (HMA) on", hma, sleep)
    return Judgement(Verdict.HMA_OFF, f"vLLM turns its hybrid KV-cache allocator (HMA) off: {why_off}", hma, sleep)


def sleep_mode_asked(config: Mapping[str, Any]) -> bool:
    """Whether an engine configuration file sets ``enable_sleep_mode`` next to its ``kv_transfer_config``."""
    return "kv_connector" not in config and any(config.get(key) is True for key in _SLEEP_KEYS)


_SLEEP_KEYS = ("enable_sleep_mode", "enable-sleep-mode")


def _sleep_mode(entry: Mapping[str, Any]) -> str:
    """vLLM 0.33's ``enable_sleep_mode`` check: the sentence when vLLM allows it (or does not ask);
    :class:`_Refused` naming the child and the leaf that answer no."""
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
        raise _Refused(f"with enable_sleep_mode, {_label(entry, '') or 'the connector'} answers {SLEEP_MODE} False: {where}")
    return f"vLLM may sleep with this configuration (enable_sleep_mode): every leaf answers {SLEEP_MODE} True"


_No = list[tuple[str, str, str]]
"""The leaves that answer no: position, label, why."""


def _leaves_that_cannot_sleep(entry: Mapping[str, Any], position: str, labels: dict[str, str]) -> _No:
    """The leaves below ``entry`` that answer no, in stack order (none when the entry can sleep: its
    children's answers folded by the table's row)."""
    labels[position] = _label(entry, position)
    host = _capkv_class(entry, position)
    if host is not None:
        return _capkv_leaves_that_cannot_sleep(entry, position, host, labels)
    cls = _resolve(entry, position)
    if _is_vllm_multi(cls):
        children = _children(entry, position, required=True)
        found: _No = []
        answers: list[bool] = []
        for index, child in enumerate(children, start=1):
            no = _leaves_that_cannot_sleep(child, f"{position}.{index}" if position else f"#{index}", labels)
            answers.append(not no)
            found += no
        return [] if fold(SLEEP_MODE, answers) else found
    transfer: Any = importlib.import_module("vllm.config").KVTransferConfig
    answer = _asked(lambda: cls.supports_sleep_mode(transfer(**entry)), labels[position])
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
        raise _Refused(f"{labels[position]}: {exc}") from None
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
        answer = _asked(
            lambda: configured_fact(node, SLEEP_MODE, vllm_config=None, transfer=transfer, inherit_role=cls.INHERIT_ROLE),
            label,
        )
        if answer is NEEDS_INSTANCE:
            return [(where, label, f"cannot say from its class ({SLEEP_MODE} is not class-level): the host answers no")]
        return [] if answer is True else [(where, label, f"answers {SLEEP_MODE}() {answer!r}")]

    return walk(configured)


def build_as_vllm(config: Mapping[str, Any]) -> list[str]:
    """Build the configured connector as vLLM builds its scheduler's (``--build``), over a KV cache
    configuration without groups (vLLM's placeholder); one line when that raises."""
    entry = _unwrap(config)
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
        return [f"building {_label(entry, '')} as vLLM does raised {type(exc).__name__}: {exc}"]
    return []


def _asked(ask: Callable[[], object], label: str) -> object:
    """A leaf's sleep-mode answer; what it raises, one refusal naming it."""
    try:
        return ask()
    except CapkvError as exc:
        raise _Refused(f"{label}: {exc}") from None
    except Exception as exc:
        raise _Refused(f"{label}: {SLEEP_MODE} raised {type(exc).__name__}: {exc}") from None


def _unwrap(config: Mapping[str, Any]) -> Mapping[str, Any]:
    wrapped: object = config.get("kv_transfer_config")
    if "kv_connector" not in config and isinstance(wrapped, Mapping):
        return cast("Mapping[str, Any]", wrapped)
    return config


def _label(entry: Mapping[str, Any], position: str) -> str:
    return f"{position} {entry.get('kv_connector')}".strip()


def _config_time_hma(entry: Mapping[str, Any], position: str, hma: dict[str, bool]) -> tuple[bool, str]:
    """vLLM's ``KVConnectorFactory.supports_hma_config``: (HMA kept on, why not)."""
    host = _capkv_class(entry, position)
    name = entry.get("kv_connector")
    if host in (PLAIN_HOST, HMA_HOST):
        hma[position] = host == HMA_HOST
        why = f"{_label(entry, position)} is not a vLLM SupportsHMA (host the stack with {HMA_HOST} to keep HMA on)"
        return host == HMA_HOST, "" if host == HMA_HOST else why
    if name != _MULTI:
        on = _supports_hma(_resolve(entry, position))
        hma[position] = on
        return on, "" if on else f"{_label(entry, position)} does not derive from vLLM's SupportsHMA"
    children = _children(entry, position, required=False)
    if not children:
        hma[position] = False
        return False, f'{_label(entry, position) or _MULTI} has no child ("connectors" is empty)'
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
    host = _capkv_class(entry, position)
    if host is not None:
        _capkv_host(entry, position, host, hma_on)
        return
    cls = _resolve(entry, position)
    if _is_vllm_multi(cls):
        children = _children(entry, position, required=True)
        wheres = [f"{position}.{index}" if position else f"#{index}" for index in range(1, len(children) + 1)]
        for child, where in zip(children, wheres):
            _constructs(child, where, hma_on)
        every = bool(children) and all(_config_time_hma(child, where, {})[0] for child, where in zip(children, wheres))
        if hma_on and not every:  # only under another name: vLLM asked the class, which claims HMA
            raise _Refused(
                f"{_label(entry, position)} is vLLM's MultiConnector, which vLLM kept HMA on for by its class; "
                "it then asserts that every child supports HMA, and not every one does"
            )
        return


def _capkv_class(entry: Mapping[str, Any], position: str) -> str | None:
    """The class of ``capkv.vllm`` the entry names (known without importing vLLM), or ``None``."""
    if entry.get("kv_connector_module_path") != HOST_MODULE:
        return None
    name: object = entry.get("kv_connector")
    if name not in (PLAIN_HOST, HMA_HOST, DROP_IN):
        raise _Refused(f'{_label(entry, position)}: class {name} not found in "{HOST_MODULE}"')
    return name


def _capkv_host(entry: Mapping[str, Any], position: str, name: str, hma_on: bool) -> None:
    """capkv's hosts refuse at construction what :mod:`capkv.config._hosts` refuses."""
    from capkv.capabilities._hma import describe, explain_not_hma, non_hma_children, supports_hma
    from capkv.config._hosts import require_host_capability

    extra = _mapping(entry.get("kv_connector_extra_config"))
    if name in (PLAIN_HOST, HMA_HOST) or STACK_KEY in extra:
        stack: object = extra.get(STACK_KEY)
        config = _mapping(stack)
        if not config:
            raise _Refused(f'{_label(entry, position)}: kv_connector_extra_config needs "{STACK_KEY}", the hosted stack')
    else:  # the drop-in, in vLLM's shape
        children: object = extra.get("connectors")
        if isinstance(children, list) and not children:
            return
        config = {"kv_connector": _MULTI, "kv_connector_extra_config": dict(extra)}
    try:
        configured = load_stack(config)
    except CapkvError as exc:
        raise _Refused(f"{_label(entry, position)}: {exc}") from None
    subject: object = configured if isinstance(configured, ConfiguredStack) else configured.cls
    if name == HMA_HOST:
        try:
            require_host_capability(HMA_HOST, configured)
        except CapkvError as exc:
            raise _Refused(str(exc)) from None
    if hma_on and not supports_hma(subject):
        raise _Refused(
            f'{_label(entry, position)} cannot serve HMA with "{describe(subject)}": '
            f"{explain_not_hma(non_hma_children(subject))}"
        )


def _children(entry: Mapping[str, Any], position: str, *, required: bool) -> list[Mapping[str, Any]]:
    children: object = _mapping(entry.get("kv_connector_extra_config")).get("connectors")
    if children is None and not required:
        return []
    if not isinstance(children, list) or not all(isinstance(c, Mapping) for c in cast("list[object]", children)):
        raise _Refused(
            f'{_label(entry, position)} needs "connectors" in kv_connector_extra_config, a list of connector '
            f"entries, got {children!r}"
        )
    engine_id: object = entry.get("engine_id")
    found = [_mapping(child) for child in cast("list[object]", children)]
    return [{"engine_id": engine_id, **child} for child in found] if engine_id is not None else found


def _validated(entry: Mapping[str, Any], position: str) -> None:
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
        raise _Refused(f"{_label(entry, position)}: vLLM's KVTransferConfig refuses it: {said}") from None


def _resolve(entry: Mapping[str, Any], position: str) -> type[Any]:
    """The class vLLM's ``KVConnectorFactory.get_connector_class`` gives for ``entry``."""
    label = _label(entry, position)
    name: object = entry.get("kv_connector")
    if not isinstance(name, str) or not name:
        raise _Refused(f"{position or 'the configuration'}: kv_connector is not set")
    _validated(entry, position)
    module_path: object = entry.get("kv_connector_module_path")
    if module_path is not None:
        if not isinstance(module_path, str) or not module_path:
            raise _Refused(f"{label}: kv_connector_module_path cannot be empty")
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:
            raise _Refused(f'{label}: cannot import module "{module_path}": {type(exc).__name__}: {exc}') from None
        found: object = getattr(module, name, None)
        if not isinstance(found, type):
            raise _Refused(f'{label}: class {name} not found in "{module_path}"')
        if not _takes_kv_cache_config(found):
            raise _Refused(
                f"{label}: {found.__qualname__} does not take kv_cache_config (vLLM refuses the 2-argument constructor)"
            )
        return found
    if importlib.util.find_spec("vllm") is None:
        raise _Refused(f"{label}: {_NOT_INSTALLED}")
    if not _registered(name):
        raise _Refused(f'{label}: vLLM knows no connector "{name}" (not registered; no kv_connector_module_path)')
    factory: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    try:
        cls: type[Any] = factory.get_connector_class_by_name(name)
    except Exception as exc:
        raise _Refused(f"{label}: vLLM cannot import it: {type(exc).__name__}: {exc}") from None
    return cls


def _registered(name: str) -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    factory: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory").KVConnectorFactory
    registry: Sequence[str] | Mapping[str, Any] = factory._registry  # pyright: ignore[reportPrivateUsage]
    return name in registry


def _supports_hma(cls: type[Any]) -> bool:
    base: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
    return issubclass(cls, base.SupportsHMA)


def _is_vllm_multi(cls: type[Any]) -> bool:
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
