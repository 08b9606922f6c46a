"""vLLM's real ``Scheduler`` driving a P/D node's connector, with a worker-side connector called in vLLM's order.

A :class:`Node` is one engine without a model: vLLM's ``Scheduler`` (its KV-cache
manager, prefix cache, load-failure policies, ``request_finished`` before the step's
``update_connector_output``) over the configured connector, and the same configuration
built for the worker role, called per step as vLLM 0.32's model runner calls it
(``KVConnectorModelRunnerMixin._get_kv_connector_output``: bind, ``start_load_kv``,
the layers' ``wait_for_layer_load``/``save_kv_layer``, ``wait_for_save``,
``get_transfer_results``, ``get_block_ids_with_load_errors``, statistics, worker
metadata, clear). The worker's KV cache is real CPU tensors. Each :meth:`Node.step`
records what vLLM observes: the worker's transfer report, the engine's outputs
(tokens, finish reasons, ``kv_transfer_params``), every request's state, and the
connector statistics vLLM logs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from capkv.adapters.vllm._spec import engine_spec

BLOCK = 32
LAYERS = tuple(f"model.layers.{i}.self_attn.attn" for i in range(4))
TOKEN = 7
"""What the model "samples" (never a stop token)."""
VOLATILE = ("remote_host", "remote_port", "remote_blocks_expiry_time")
"""``kv_transfer_params`` that name where a node listens or when its lease ends: not compared."""

init_none_hash(sha256)


def kv_cache_config(groups: int, num_blocks: int = 48) -> KVCacheConfig:
    """One full-attention group, or (HMA) full-attention and sliding-window (64 tokens) layers apart."""
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)
    window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, sliding_window=64)
    if groups == 1:
        specs = [KVCacheGroupSpec(list(LAYERS), full)]
    else:
        specs = [KVCacheGroupSpec(list(LAYERS[0::2]), full), KVCacheGroupSpec(list(LAYERS[1::2]), window)]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=specs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def side_channel() -> Iterator[None]:
    """A NIXL scheduler's handshake listener on a free loopback port of its own (vLLM reads both at construction)."""
    saved = {name: os.environ.get(name) for name in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")}
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class Node:
    """One engine's scheduler and worker over a connector configuration."""

    scheduler: Scheduler
    worker: KVConnectorBase_V1
    caches: dict[str, torch.Tensor]
    groups: int
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def connector(self) -> Any:
        return self.scheduler.connector

    def add(self, request_id: str, prompt: list[int], *, max_tokens: int = 8, params: Mapping[str, Any] | None = None) -> None:
        request = Request(
            request_id=request_id, prompt_token_ids=list(prompt), sampling_params=SamplingParams(max_tokens=max_tokens),
            pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256),
        )
        request.kv_transfer_params = None if params is None else dict(params)
        self.scheduler.add_request(request)

    def step(self) -> dict[str, Any]:
        """One engine step; returns (and keeps) what vLLM observed."""
        scheduler = self.scheduler
        output = scheduler.schedule()
        kv = self._worker_step(output)
        ids = list(output.num_scheduled_tokens)
        sampled = [[TOKEN] if scheduler.requests[i].num_computed_tokens >= scheduler.requests[i].num_tokens else []
                   for i in ids]
        fields: dict[str, Any] = {"req_ids": ids, "sampled_token_ids": sampled, "kv_connector_output": kv}
        if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:  # vLLM 0.32 (0.34 indexes by position)
            fields["req_id_to_index"] = {i: n for n, i in enumerate(ids)}
        runner = ModelRunnerOutput(**fields)
        engine_outputs = scheduler.update_from_output(output, runner)
        outputs, stats = [], {}
        for core in engine_outputs.values():
            for out in core.outputs:
                params = None if out.kv_transfer_params is None else {
                    k: v for k, v in out.kv_transfer_params.items() if k not in VOLATILE}
                outputs.append((out.request_id, list(out.new_token_ids), str(out.finish_reason), params))
            if core.scheduler_stats is not None and core.scheduler_stats.kv_connector_stats:
                stats.update(core.scheduler_stats.kv_connector_stats)
        record = {
            "scheduled": sorted(output.num_scheduled_tokens.items()),
            "finished_sending": sorted(kv.finished_sending or ()),
            "finished_recving": sorted(kv.finished_recving or ()),
            "failed_recving": sorted(kv.failed_recving),
            "invalid_block_ids": sorted(kv.invalid_block_ids),
            "outputs": sorted(outputs, key=lambda item: item[0]),
            "states": sorted((i, str(r.status), r.num_computed_tokens) for i, r in scheduler.requests.items()),
            "blocks": {i: [list(g) for g in scheduler.kv_cache_manager.get_block_ids(i)] for i in sorted(scheduler.requests)},
            "stats": stats,
        }
        self.steps.append(record)
        return record

    def run(self, steps: int) -> list[dict[str, Any]]:
        return [self.step() for _ in range(steps)]

    def _worker_step(self, output: Any) -> KVConnectorOutput:
        worker = self.worker
        worker.bind_connector_metadata(output.kv_connector_metadata)
        worker.start_load_kv(_ForwardContext())
        for name in LAYERS:
            worker.wait_for_layer_load(name)
            worker.save_kv_layer(name, self.caches[name], None)  # type: ignore[arg-type]
        worker.wait_for_save()
        results = worker.get_transfer_results(output.finished_req_ids)
        kv = KVConnectorOutput(
            finished_sending=results.finished_sending, finished_recving=results.finished_recving,
            failed_recving=results.failed_recving, invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_stats=worker.get_kv_connector_stats(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        worker.clear_connector_metadata()
        return kv

    def shutdown(self) -> None:
        self.scheduler.shutdown()
        self.worker.shutdown()


class _ForwardContext:
    attn_metadata: dict[str, Any] = {}
    no_compile_layers: dict[str, Any] = {}


def node(model_dir: Path, transfer: Mapping[str, Any], *, groups: int, policy: str = "fail", num_blocks: int = 48,
         handshake: str = "engine") -> Node:
    """A node serving ``transfer`` (a ``kv_transfer_config``). ``handshake``: ``"engine"`` hands the scheduler
    side what the worker side produced, as vLLM's engine core does at start-up; ``"per-child"`` hands each child
    of a composite its own worker child's (what vLLM's composite cannot do: it keeps the first); ``"none"``."""
    config = engine_config(model_dir, transfer, groups=groups, policy=policy)
    config.cache_config.num_gpu_blocks = num_blocks
    kv_config = kv_cache_config(groups, num_blocks)
    with side_channel():
        scheduler = Scheduler(vllm_config=config, kv_cache_config=kv_config, structured_output_manager=StructuredOutputManager(config),
                              block_size=BLOCK, log_stats=True)
    return _with_worker(scheduler, config, kv_config, groups, handshake)


def engine_config(model_dir: Path, transfer: Mapping[str, Any], *, groups: int, policy: str = "fail") -> VllmConfig:
    """The engine's configuration: the tiny model, blocks of :data:`BLOCK` tokens, vLLM's HMA on for two groups."""
    transfer_config = KVTransferConfig(**{**dict(transfer), "kv_load_failure_policy": policy})
    return VllmConfig(
        model_config=ModelConfig(model=str(model_dir), dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=2048,
                                         is_encoder_decoder=False, disable_hybrid_kv_cache_manager=groups == 1),
        kv_transfer_config=transfer_config, device_config=DeviceConfig("cpu"),
    )


def _with_worker(scheduler: Scheduler, config: VllmConfig, kv_config: KVCacheConfig, groups: int, handshake: str) -> Node:
    worker = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_config)
    assert isinstance(worker, KVConnectorBase_V1)
    spec = engine_spec(kv_config, owner="test")
    caches = {}
    for group in spec.groups:
        for name in group.layer_names:
            caches[name] = torch.randn(group.kv_shape, dtype=torch.float32).to(torch.bfloat16)
    worker.register_kv_caches(caches)
    connector: Any = scheduler.connector
    pairs = [(connector, worker)] if handshake == "engine" else []
    if handshake == "per-child":
        pairs = list(zip(connector.sub_connectors, cast(Any, worker).sub_connectors, strict=True))
    for scheduler_side, worker_side in pairs:
        payload = worker_side.get_handshake_metadata()
        scheduler_side.set_xfer_handshake_metadata_pp_aware({} if payload is None else {(0, 0): payload})
    return Node(scheduler, worker, caches, groups)


def prompt(length: int, *, seed: int, prefix: list[int] | None = None) -> list[int]:
    """``length`` token ids: ``prefix`` then seeded ones."""
    generator = torch.Generator().manual_seed(seed)
    head = list(prefix or [])
    tail = torch.randint(10, 1000, (length - len(head),), generator=generator).tolist()
    return head + tail
