from typing import Any

class KVCacheBlock:
    block_id: int
    ref_cnt: int
    is_null: bool
    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: Any = None,
        _block_hash_num_tokens: int | None = None,
        prev_free_block: KVCacheBlock | None = None,
        next_free_block: KVCacheBlock | None = None,
        is_null: bool = False,
        *,
        pool: Any = None,
    ) -> None: ...
    @property
    def block_hash(self) -> Any: ...
