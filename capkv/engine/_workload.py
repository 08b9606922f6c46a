"""Workloads of requests that share prefixes (system prompts, documents, few-shot examples).

So a second request with the same prefix can reuse the first one's KV — locally, or through a connector.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from capkv._homes import publish
from capkv.contracts._arguments import require_int
from capkv.engine._request import Request
from capkv.errors import ConfigError

__all__ = ["Workload"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """How many requests, how long their shared and private parts are, how many tokens they generate.

    Each request is one of ``num_prefixes`` shared prefixes followed by a tail of its own, so a second request
    with the same prefix can reuse the first one's KV — from the local prefix cache, or through a connector
    once that cache is gone.
    """

    num_requests: int = 32
    num_prefixes: int = 4
    prefix_len: int = 384
    suffix_len: int = 65
    max_tokens: int = 8
    vocab_size: int = 32_000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_requests", "num_prefixes", "max_tokens", "vocab_size"):
            require_int(getattr(self, name), "Workload", name, minimum=1)
        for name in ("prefix_len", "suffix_len"):
            require_int(getattr(self, name), "Workload", name, minimum=0)
        require_int(self.seed, "Workload", "seed")
        if self.prefix_len < 0 or self.suffix_len < 0 or self.prefix_len + self.suffix_len < 1:
            raise ConfigError(
                "Workload: prefix_len and suffix_len must be >= 0 and not both 0",
                method="Workload", value=(self.prefix_len, self.suffix_len),
            )

    def requests(self, tag: str = "req") -> list[Request]:
        """The workload's requests (the same tokens every call; ids ``{tag}-{i}``)."""
        rng = random.Random(self.seed)
        prefixes = self._prefixes(rng)
        return [
            Request(
                f"{tag}-{i}",
                prefixes[i % self.num_prefixes] + [rng.randrange(self.vocab_size) for _ in range(self.suffix_len)],
                max_tokens=self.max_tokens,
            )
            for i in range(self.num_requests)
        ]

    def prefix_heads(self, tokens: int, tag: str = "head") -> list[Request]:
        """One request per shared prefix, prompted with its first ``tokens`` tokens (ids ``{tag}-{i}``).

        Served through a store, it leaves the store holding the first part of every prefix and
        nothing of the rest — the shape of a small front tier in front of a complete one.
        """
        require_int(tokens, "Workload.prefix_heads", "tokens", minimum=1)
        if tokens > self.prefix_len:
            raise ConfigError(
                f"Workload.prefix_heads: tokens={tokens} is more than the prefixes' {self.prefix_len}",
                method="Workload.prefix_heads", value=tokens,
            )
        prefixes = self._prefixes(random.Random(self.seed))
        return [Request(f"{tag}-{i}", prefix[:tokens], max_tokens=1) for i, prefix in enumerate(prefixes)]

    def _prefixes(self, rng: random.Random) -> list[list[int]]:
        return [[rng.randrange(self.vocab_size) for _ in range(self.prefix_len)] for _ in range(self.num_prefixes)]

    @property
    def prompt_tokens(self) -> int:
        return self.num_requests * (self.prefix_len + self.suffix_len)


publish(__name__)
