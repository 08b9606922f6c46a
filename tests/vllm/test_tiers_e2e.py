"""Tiers that add up in vLLM 0.32: a fresh engine over MultiConnector(Y, X) loads Y's part and X's rest.

Store Y holds a prompt's first two 128-token blocks (vLLM's CPU block size), store X all three. Under the
first-hit rule a fresh engine loaded Y's two blocks and computed the third; composed, it loads all three
(384 cached tokens), and its output is bit-equal to a no-connector engine's local prefix-cache hit.
"""

from __future__ import annotations

from pathlib import Path

from tests.vllm.engine import counter, serve
from tests.vllm.model import prompts
from tests.vllm.test_host_e2e import assert_same, files, host, multi

BLOCK = 128
PROMPT = prompts(1, 3 * BLOCK + 16, seed=5)  # three full blocks and a tail
MAX_TOKENS = 8


def test_a_split_prefix_loads_from_both_stores(model_dir: Path, tmp_path: Path) -> None:
    ref = serve(model_dir, PROMPT, max_tokens=MAX_TOKENS, runs=2, block_size=BLOCK)
    assert ref.groups == 2 and ref.runs[1].cached == [3 * BLOCK], "the reference's second run hits its prefix cache"

    y, x = files(tmp_path / "y"), files(tmp_path / "x")
    serve(model_dir, [PROMPT[0][: 2 * BLOCK]], max_tokens=1, kv_transfer_config=host("CapkvHMAConnector", y),
          block_size=BLOCK)
    serve(model_dir, PROMPT, max_tokens=1, kv_transfer_config=host("CapkvHMAConnector", x), block_size=BLOCK)

    got = serve(model_dir, PROMPT, max_tokens=MAX_TOKENS, kv_transfer_config=host("CapkvHMAConnector", multi(y, x)),
                block_size=BLOCK)
    assert got.groups == 2
    assert got.runs[0].cached == [3 * BLOCK], "Y's two blocks and X's third: nothing of the prefix computed"
    assert got.loaded_tokens == (2 * BLOCK, BLOCK), "Y loads its two blocks, X the third"
    assert counter(got.stats["FileStoreConnector"], "hit_tokens") == 3 * BLOCK  # vLLM's keys: one per class
    assert_same(got, ref, run=1, label="the composed load")
