"""The block pool: one id space shared by every KV-cache group, and the local prefix cache.

Freed blocks keep their prefix-cache entry until handed out again, so a later request can take them back
(vLLM's eviction order).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from capkv.errors import ConfigError

__all__ = ["BlockPool", "CacheKey"]

CacheKey = tuple[int, int]
"""``(group index, prefix hash at the block's last token)``."""


class BlockPool:
    """Free list, reference counts and prefix-cache entries of every block.

    Block 0 is the *null block*: never handed out, it fills the places of a block table whose KV is not kept
    (sliding-window blocks that left the window), so a table may repeat it. Every other block has a reference
    count. A block whose count drops to zero goes to the back of the free queue but keeps its prefix-cache
    entry until it is handed out again, so a later request with the same prefix can take it back (least
    recently freed blocks are reused first — vLLM's eviction order).
    """

    def __init__(self, num_blocks: int, null_block_id: int = 0) -> None:
        if num_blocks < 2:
            raise ConfigError(f"BlockPool needs at least 2 blocks (one is the null block), got {num_blocks}", value=num_blocks)
        self.null_block_id = null_block_id
        self._refs = [0] * num_blocks
        self._keys: list[CacheKey | None] = [None] * num_blocks
        self._cached: dict[CacheKey, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(b for b in range(num_blocks) if b != null_block_id)

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return len(self._refs)

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached ones included: they are evicted on reuse)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._refs) - 1 - len(self._free)

    def allocate(self, count: int) -> list[int]:
        """``count`` fresh blocks, each with one reference; their old cache entries are dropped."""
        if count > len(self._free):
            raise ConfigError(f"BlockPool: {count} blocks requested, {len(self._free)} free", value=count)
        blocks: list[int] = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            key = self._keys[block]
            if key is not None:
                del self._cached[key]
                self._keys[block] = None
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def lookup(self, key: CacheKey) -> int | None:
        """The block cached under ``key``, if any."""
        return self._cached.get(key)

    def touch(self, blocks: Iterable[int]) -> None:
        """Take one more reference on cache hits (reviving them from the free queue)."""
        for block in blocks:
            if block == self.null_block_id:
                continue
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def free(self, blocks: Iterable[int]) -> list[int]:
        """Drop one reference each; blocks nobody holds go to the back of the free queue.

        Returns the blocks that nobody holds any more.
        """
        released: list[int] = []
        for block in blocks:
            if block == self.null_block_id:
                continue
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                released.append(block)
        return released

    def forget(self, blocks: Iterable[int]) -> None:
        """Drop the prefix-cache entries of ``blocks`` (their KV is about to be overwritten)."""
        for block in blocks:
            key = self._keys[block]
            if key is not None:
                del self._cached[key]
                self._keys[block] = None

    def cache(self, key: CacheKey, block: int) -> None:
        """Publish ``block`` under ``key``; a block already published for the key wins."""
        if key not in self._cached and self._keys[block] is None:
            self._cached[key] = block
            self._keys[block] = key

    def is_free(self, block: int) -> bool:
        """Whether nobody holds ``block`` (a cache hit on it takes a free block back)."""
        return block in self._free

    def reset_prefix_cache(self) -> None:
        """Forget every cache entry (vLLM's ``reset_prefix_cache``); blocks in use keep their KV."""
        self._cached.clear()
        self._keys = [None] * len(self._keys)
