"""A host's class-level members: what vLLM asks the connector *class* before building it.

Answered from the configured stack's classes, nothing built (vLLM's own by their classmethods with their own
entries, as vLLM's ``MultiConnector`` asks them), combined by the rows of :mod:`capkv.capabilities._table`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from capkv.adapters.vllm._access import VllmKVCacheAccess
from capkv.adapters.vllm._host_state import HostState
from capkv.adapters.vllm._stack import child_vllm_config, configured_fact
from capkv.adapters.vllm._stats import HostPromMetrics, rebuild_stats
from capkv.capabilities._facts import (
    ACCESS,
    LAYOUT,
    LOOKAHEAD,
    NEEDS_INSTANCE,
    PIECEWISE,
    SLEEP_MODE,
    ConfigFact,
)
from capkv.config._loader import ConfiguredConnector, ConfiguredNode, ConfiguredStack

__all__ = ["ClassLevelMembers", "configured_leaves"]


class ClassLevelMembers(HostState):
    """vLLM's class-level members, answered from the configured stack's classes."""

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """The layout the stack's classes agree on (``None``: no preference, or only instances know)."""
        transfer = vllm_config.kv_transfer_config
        configured = cls._configured(None if transfer is None else transfer.kv_connector_extra_config)
        if configured is None:
            return None
        answer = configured_fact(configured, LAYOUT, vllm_config=vllm_config)
        return None if answer is NEEDS_INSTANCE else cast("str | None", answer)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Whether any child needs piecewise CUDA graphs; yes when a class cannot say (always safe)."""
        configured = cls._configured(extra_config)
        if configured is None:
            return False
        answer = configured_fact(configured, PIECEWISE, vllm_config=None)
        return True if answer is NEEDS_INSTANCE else bool(answer)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """Whether vLLM may sleep with this stack (vLLM 0.33 refuses ``enable_sleep_mode`` otherwise): every
        leaf can — a vLLM class by its own answer for its own entry, a capkv class by its class-level fact
        (:func:`capkv.capabilities._facts.class_sleeps`); no when a class cannot say. No child: yes."""
        return cls._told(kv_transfer_config, SLEEP_MODE, True) is True

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: KVTransferConfig) -> VllmKVCacheAccess:
        """What vLLM 0.34 must allocate the KV cache for: every flag of every leaf — a vLLM class's own
        answer for its own entry, a capkv class's class-level ``kv_cache_access()`` (default: in-process).
        A leaf that answers only per instance: ``REGISTERS`` (one allocation per segment), which the
        built leaves are checked against at construction."""
        answer = cls._told(kv_transfer_config, ACCESS, 0)
        return VllmKVCacheAccess.REGISTERS if answer is NEEDS_INSTANCE else VllmKVCacheAccess(cast("int", answer))

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: KVTransferConfig) -> bool:
        """Whether vLLM 0.34 may hash lookahead tokens' blocks: every leaf takes them (a vLLM class by its
        own answer, a capkv class by its class-level fact, default no), and there is at least one."""
        return cls._told(kv_transfer_config, LOOKAHEAD, False) is True

    @classmethod
    def _told(cls, kv_transfer_config: KVTransferConfig, fact: ConfigFact, no_child: object) -> object:
        """``fact`` for the configured stack, from its classes (``no_child`` for an empty one)."""
        configured = cls._configured(kv_transfer_config.kv_connector_extra_config)
        if configured is None:
            return no_child
        return configured_fact(
            configured, fact, vllm_config=None, transfer=kv_transfer_config, inherit_role=cls.INHERIT_ROLE
        )

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        """vLLM's per-child statistics, rebuilt from what crossed a process boundary."""
        return rebuild_stats(data)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[Any], type[Any]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        """vLLM children's Prometheus metrics (one per class, as vLLM builds them) and capkv's counters."""
        transfer = vllm_config.kv_transfer_config
        configured = cls._configured(None if transfer is None else transfer.kv_connector_extra_config)
        children: dict[str, KVConnectorPromMetrics] = {}
        for leaf in configured_leaves(configured):
            if leaf.cls.__name__ in children or not issubclass(leaf.cls, KVConnectorBase_V1):
                continue
            built = leaf.cls.build_prom_metrics(
                child_vllm_config(vllm_config, leaf, inherit_role=cls.INHERIT_ROLE),
                metric_types, labelnames, per_engine_labelvalues,
            )
            if built is not None:
                children[leaf.cls.__name__] = cast("KVConnectorPromMetrics", built)
        return HostPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, children)


def configured_leaves(node: ConfiguredNode | None) -> Iterator[ConfiguredConnector]:
    """Every leaf of a configured stack, in order."""
    if isinstance(node, ConfiguredStack):
        for entry in node.entries:
            yield from configured_leaves(entry)
    elif node is not None:
        yield node
