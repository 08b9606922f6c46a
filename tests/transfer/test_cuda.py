"""The CUDA path: side-stream copies through bounded staging, pinned rows, event completion.

Runs only where a CUDA device is present (CI on a GPU machine); the CPU suite
covers the layout logic, chunking and per-row copies it shares.
"""

from __future__ import annotations

import pytest
import torch

from capkv import KVSpec
from capkv.connectors import CPUOffloadConnector
from capkv.transfer import BlockCopier
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine
from tests.paged import LAYOUTS, Group, empty_caches, make_spec, randomize, same_bits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GROUPS = [Group(16), Group(32, layers=3, window=64)]


def _on_cuda(spec: KVSpec, layout: str, seed: int) -> dict[str, torch.Tensor]:
    caches = empty_caches(spec, layout, "cuda")
    randomize(caches, seed)
    return caches


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("staging", [1, 1 << 30])
def test_cuda_gather_matches_the_cpu_path_and_scatter_restores_it(layout: str, staging: int) -> None:
    spec = make_spec(GROUPS, layout=layout, dtype=torch.bfloat16)
    device_caches = _on_cuda(spec, layout, seed=3)
    host_caches = {name: t.cpu() for name, t in device_caches.items()}
    on_device = BlockCopier(spec, device_caches, staging_nbytes=staging)
    on_host = BlockCopier(spec, host_caches)
    blank = empty_caches(spec, layout, "cuda")
    target = BlockCopier(spec, blank, staging_nbytes=staging)
    for group in range(spec.num_groups):
        ids, dst = [9, 2, 31, 17, 4], [0, 5, 6, 30, 12]
        nbytes = on_device.block_nbytes(group)
        pool = on_device.host_rows(8, nbytes + 64)
        assert pool.is_pinned()
        rows = pool[1:6, :nbytes]  # strided rows: one copy per row
        handle = on_device.gather(group, ids, rows)
        handle.wait()
        assert handle.done()
        reference = on_host.host_rows(len(ids), nbytes)
        on_host.gather(group, ids, reference)
        assert torch.equal(rows, reference)
        target.scatter(group, dst, rows).stream_wait()
        torch.cuda.current_stream().synchronize()
        axis = spec.block_dim
        for name in spec.groups[group].layer_names:
            for s, d in zip(ids, dst, strict=True):
                assert same_bits(blank[name].select(axis, d).cpu(), host_caches[name].select(axis, s))


def test_a_save_waits_for_kernels_queued_before_it() -> None:
    spec = make_spec(GROUPS)
    caches = _on_cuda(spec, "flash", seed=4)
    copier = BlockCopier(spec, caches)
    name = spec.groups[0].layer_names[0]
    torch.cuda._sleep(50_000_000)  # a long kernel on the current stream, then a write after it
    caches[name][:, 3].fill_(1.0)
    rows = copier.host_rows(1, copier.block_nbytes(0))
    copier.gather(0, [3], rows).wait()
    expected = torch.full_like(caches[name][:, 3], 1.0).cpu().contiguous().view(torch.uint8).flatten()
    assert torch.equal(rows[0, : expected.numel()], expected)


def test_the_cpu_offload_connector_round_trips_on_cuda() -> None:
    spec = make_spec(GROUPS, num_blocks=64)
    connector = CPUOffloadConnector(spec, capacity_blocks=64)
    engine = MiniEngine(spec, connector, device="cuda")
    prompt = tokens(60, 150)
    engine.run("first", prompt)
    second = engine.run("second", prompt + [1])
    assert second.hit_tokens == 128 and second.load_errors == {}
