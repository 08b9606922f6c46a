"""A key names everything that determines a stored block's bytes (capkv/stores/_keys.py says what).

The property: for two requests that differ in exactly one component — tokens,
namespace, model layout, memory layout, group, cache salt, adapter, a
multimodal item, a prompt embedding, the worker's shard — block ``i`` of the
one and block ``i`` of the other share a physical key exactly when the change
does not reach block ``i`` (a token, an item or an embedding after the block's
end does not; everything else does); identical requests share every key. And
the same bytes split at another point — between two positions' embeddings, two
multimodal identifiers, the namespace and the salt, the salt and the adapter —
are another key: every part is length-framed (``frame``, which a decoder here
reads back one way only).
"""

from __future__ import annotations

import dataclasses
import json
import struct
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from capkv import ArgumentError, CapkvError, ContractError, KeyInputs, KVShard, KVSpec, MultimodalItem
from capkv.contracts._key_inputs import request_key_inputs
from capkv.stores import StoreKey
from capkv.stores._keys import PrefixHasher, RequestKeys, frame, framed_digest
from capkv.stores._value import HEADER_SIZE
from capkv.stores._fingerprint import layout_fingerprints
from capkv.testing import make_request
from capkv.transfer import BlockCopier
from tests.paged import Group, empty_caches, make_spec

ROOT = Path(__file__).resolve().parents[2]
GROUPS = (Group(16), Group(32, window=64))
PROMPT_LEN = 96


@dataclass(frozen=True)
class Components:
    """Everything a block's physical key may depend on."""

    tokens: tuple[int, ...]
    namespace: str = ""
    dtype: str = "float16"
    """The model layout (here: its dtype; layer names, shapes and block sizes go the same way)."""
    memory: str = "flash"
    """The memory layout of the registered KV cache."""
    group: int = 0
    salt: str | None = None
    adapter: str | None = None
    multimodal: tuple[MultimodalItem, ...] = ()
    embeds: tuple[bytes, ...] = ()
    shard: tuple[int, ...] = (0, 1)
    """(tensor-parallel rank, size[, pipeline-parallel rank, size])."""


SHARDS = [(0, 1), (0, 2), (1, 2), (0, 1, 1, 2), (1, 2, 1, 2), (0, 2, 0, 2)]
"""Workers' shards: tensor-parallel only, and with pipeline parallelism (another rank, another size)."""


@cache
def _fingerprints(dtype: str, memory: str, shard: tuple[int, ...]) -> tuple[KVSpec, tuple[bytes, ...]]:
    spec = make_spec(list(GROUPS), num_blocks=8, layout=memory, dtype=getattr(torch, dtype))
    tp_rank, tp_size, pp_rank, pp_size = (*shard, 0, 1) if len(shard) == 2 else shard
    spec = dataclasses.replace(spec, shard=KVShard(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size))
    copier = BlockCopier(spec, empty_caches(spec, memory))
    return spec, layout_fingerprints(spec, copier)


def physical_keys(c: Components) -> list[StoreKey]:
    """The physical key of every full block of the request, in its group, as a worker of that shard stores it."""
    spec, fingerprints = _fingerprints(c.dtype, c.memory, c.shard)
    request = make_request(
        "r", list(c.tokens), cache_salt=c.salt, adapter=c.adapter, multimodal=c.multimodal, prompt_embeds=c.embeds
    )
    inputs = request_key_inputs(request, connector="test", method="test")
    keys = RequestKeys(PrefixHasher(spec, c.namespace, owner="test"), request.all_token_ids, inputs)
    size = GROUPS[c.group].block_size
    nbytes = HEADER_SIZE + 1024
    return [
        StoreKey(keys.key(c.group, block, method="test"), fingerprints[c.group], nbytes)
        for block in range(len(c.tokens) // size)
    ]


def reach(c: Components, change: str, position: int) -> list[bool]:
    """Per block of ``c``'s group: whether a change of ``change`` at prompt ``position`` reaches it."""
    size = GROUPS[c.group].block_size
    blocks = len(c.tokens) // size
    if change in ("tokens", "multimodal", "embeds"):
        return [position < (block + 1) * size for block in range(blocks)]
    return [True] * blocks


positions = st.integers(0, PROMPT_LEN - 1)
names = st.text(min_size=1, max_size=6)


@st.composite
def base_and_variant(draw: st.DrawFn) -> tuple[Components, Components, str, int]:
    tokens = tuple(draw(st.lists(st.integers(0, 50_000), min_size=PROMPT_LEN, max_size=PROMPT_LEN)))
    offset = draw(st.integers(0, PROMPT_LEN - 8))
    item = MultimodalItem(draw(names), offset, draw(st.integers(1, 8)))
    embeds = tuple(draw(st.binary(min_size=4, max_size=4)) for _ in range(draw(st.integers(0, PROMPT_LEN))))
    base = Components(
        tokens,
        namespace=draw(names),
        dtype=draw(st.sampled_from(["float16", "bfloat16"])),
        memory=draw(st.sampled_from(["flash", "hnd"])),
        group=draw(st.sampled_from([0, 1])),
        salt=draw(st.none() | names),
        adapter=draw(st.none() | names),
        multimodal=draw(st.sampled_from([(), (item,)])),
        embeds=embeds,
        shard=draw(st.sampled_from(SHARDS)),
    )
    change = draw(st.sampled_from([
        "tokens", "namespace", "dtype", "memory", "group", "salt", "adapter", "multimodal", "embeds", "shard",
    ]))
    position = 0
    if change == "tokens":
        position = draw(positions)
        changed = list(tokens)
        changed[position] = (changed[position] + draw(st.integers(1, 1000))) % 50_001
        variant = dataclasses.replace(base, tokens=tuple(changed))
    elif change == "namespace":
        variant = dataclasses.replace(base, namespace=base.namespace + draw(names))
    elif change == "dtype":
        variant = dataclasses.replace(base, dtype="bfloat16" if base.dtype == "float16" else "float16")
    elif change == "memory":
        variant = dataclasses.replace(base, memory="hnd" if base.memory == "flash" else "flash")
    elif change == "group":
        variant = dataclasses.replace(base, group=1 - base.group)
    elif change == "salt":
        variant = dataclasses.replace(base, salt=(base.salt or "") + draw(names))
    elif change == "adapter":
        variant = dataclasses.replace(base, adapter=(base.adapter or "") + draw(names))
    elif change == "multimodal":
        moved = draw(st.sampled_from(["identifier", "offset", "added"]))
        if moved == "added" or not base.multimodal:
            variant = dataclasses.replace(base, multimodal=(*base.multimodal, item))
            if base.multimodal:  # the same item twice: a second item at the same place
                variant = dataclasses.replace(base, multimodal=(*base.multimodal, dataclasses.replace(item, identifier=item.identifier + "'")))
        elif moved == "identifier":
            variant = dataclasses.replace(base, multimodal=(dataclasses.replace(item, identifier=item.identifier + "'"),))
        else:
            shifted = item.offset + 1 if item.offset + item.length < PROMPT_LEN else item.offset - 1
            variant = dataclasses.replace(base, multimodal=(dataclasses.replace(item, offset=shifted),))
            item = dataclasses.replace(item, offset=min(item.offset, shifted))
        position = item.offset
    elif change == "embeds":
        position = draw(positions)
        if position < len(embeds):  # another embedding at one position
            changed = list(embeds)
            changed[position] = bytes(b ^ 0xFF for b in changed[position])
        else:  # embeddings where the base had token ids: the first such position differs first
            changed = list(embeds) + [b"emb!"] * (position + 1 - len(embeds))
            position = len(embeds)
        variant = dataclasses.replace(base, embeds=tuple(changed))
    else:
        others = [s for s in SHARDS if s != base.shard]
        variant = dataclasses.replace(base, shard=draw(st.sampled_from(others)))
    return base, variant, change, position


@settings(max_examples=300, deadline=None)
@given(base_and_variant())
def test_requests_differing_in_one_component_share_a_key_only_where_it_does_not_reach(
    case: tuple[Components, Components, str, int],
) -> None:
    base, variant, change, position = case
    assert physical_keys(base) == physical_keys(dataclasses.replace(base))  # identical: every key shared
    mine, theirs = physical_keys(base), physical_keys(variant)
    if change == "group":  # another group: no key of the one is a key of the other
        assert not set(mine) & set(theirs)
        return
    expected = reach(base, change, position)
    assert [a != b for a, b in zip(mine, theirs, strict=True)] == expected, (change, position)
    reached = {key for key, changed in zip(mine, expected, strict=True) if changed}
    assert not reached & set(theirs)  # nor under another block's position


def test_keys_are_the_same_in_another_process() -> None:
    c = Components(tuple(range(PROMPT_LEN)), namespace="m", salt="tenant-a", adapter="sql-lora",
                   multimodal=(MultimodalItem("img-1", 3, 20),), embeds=(b"e0", b"e1"), shard=(1, 2))
    code = (
        "import json, sys; sys.path.insert(0, '.')\n"
        "from tests.stores.test_keys import Components, physical_keys, PROMPT_LEN\n"
        "from capkv import MultimodalItem\n"
        "c = Components(tuple(range(PROMPT_LEN)), namespace='m', salt='tenant-a', adapter='sql-lora',"
        " multimodal=(MultimodalItem('img-1', 3, 20),), embeds=(b'e0', b'e1'), shard=(1, 2))\n"
        "print(json.dumps([k.name for k in physical_keys(c)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONHASHSEED": "123", "PATH": "", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [k.name for k in physical_keys(c)]


def test_a_salt_or_adapter_reaches_every_block_and_an_empty_salt_is_none() -> None:
    tokens = tuple(range(PROMPT_LEN))
    plain = physical_keys(Components(tokens))
    assert physical_keys(Components(tokens, salt="")) == plain  # vLLM's rule: an empty salt is no salt
    for changed in (Components(tokens, salt="a"), Components(tokens, adapter="a")):
        assert not set(physical_keys(changed)) & set(plain)
    assert physical_keys(Components(tokens, salt="a")) != physical_keys(Components(tokens, adapter="a"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("cache_salt", 3), ("adapter", b"lora"), ("multimodal", "img"), ("multimodal", ("img",)), ("prompt_embeds", b"x"),
     ("prompt_embeds", ("x",))],
)
def test_a_key_input_of_the_wrong_type_is_an_argument_error_naming_it(field: str, value: object) -> None:
    """In production an ArgumentError naming the field; in dev mode the type contract says it first."""
    with pytest.raises(CapkvError, match=field) as caught:
        KeyInputs(**{field: value})  # type: ignore[arg-type]
    assert not isinstance(caught.value, ArgumentError) or caught.value.parameter.startswith(field)
    with pytest.raises(ArgumentError, match="identifier"):
        MultimodalItem("", 0, 1)
    with pytest.raises(ArgumentError, match="offset"):
        MultimodalItem("img", -1, 1)


def test_a_request_whose_key_inputs_are_not_key_inputs_is_a_contract_error_naming_the_connector() -> None:
    @dataclass
    class Odd:
        request_id: str
        all_token_ids: list[int]
        key_inputs: object
        num_computed_tokens: int = 0

    spec = make_spec(list(GROUPS), num_blocks=8)
    from capkv.stores import MemoryBackend, StoreConnector

    connector = StoreConnector(spec, MemoryBackend())
    with pytest.raises(ContractError, match="key_inputs") as caught:
        connector.get_num_new_matched_tokens(Odd("odd", list(range(40)), {"cache_salt": "a"}), 0)
    assert caught.value.connector == "StoreConnector" and caught.value.method == "get_num_new_matched_tokens"
    assert "'odd'" in str(caught.value)


# ---- injective by construction ------------------------------------------------------------------

def unframe(data: bytes) -> object:
    """The one value whose :func:`frame` is ``data`` (a decoder: that it exists and reads every framed
    value back is what makes the encoding injective). Sequences come back as tuples."""
    value, end = _unframe(data, 0)
    assert end == len(data), "trailing bytes: the framing does not say where a value ends"
    return value


def _unframe(data: bytes, at: int) -> tuple[object, int]:
    tag, at = data[at : at + 1], at + 1
    if tag == b"N":
        return None, at
    if tag == b"I":
        return struct.unpack_from("<q", data, at)[0], at + 8
    (length,) = struct.unpack_from("<Q", data, at)
    at += 8
    if tag == b"S":
        return data[at : at + length].decode(), at + length
    if tag == b"B":
        return data[at : at + length], at + length
    assert tag == b"T", tag
    items: list[object] = []
    for _ in range(length):
        item, at = _unframe(data, at)
        items.append(item)
    return tuple(items), at


framed = st.recursive(
    st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4).map(tuple) | st.lists(inner, max_size=4),
    max_leaves=12,
)


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, (tuple, list)) else value


@settings(max_examples=500, deadline=None)
@given(framed, framed)
def test_the_key_encoding_reads_back_one_way_only(a: object, b: object) -> None:
    assert unframe(frame(a)) == _tuples(a)  # a left inverse: frame is injective (up to list == tuple)
    assert (frame(a) == frame(b)) == (_tuples(a) == _tuples(b))
    assert (framed_digest(a) == framed_digest(b)) == (_tuples(a) == _tuples(b))


def test_what_is_not_a_key_part_is_refused() -> None:
    for bad in (True, 1.5, {"a": 1}, (b"x", object())):
        with pytest.raises(CapkvError):  # an ArgumentError (in dev mode the type contract may say it first)
            frame(bad)  # type: ignore[arg-type]


def test_embeddings_split_elsewhere_are_other_keys() -> None:
    """The defect this encoding fixes: per-position digests were joined unframed, so (ab, c) was (a, bc)."""
    tokens = tuple(range(PROMPT_LEN))
    one = physical_keys(Components(tokens, embeds=(b"ab", b"c")))
    other = physical_keys(Components(tokens, embeds=(b"a", b"bc")))
    assert not set(one) & set(other)


def _split(whole: str | bytes, cuts: list[int]) -> list[str | bytes]:
    bounds = [0, *cuts, len(whole)]
    return [whole[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def resplit(draw: st.DrawFn) -> tuple[Components, Components, str, int]:
    """A base request, and one whose variable-length inputs hold the same bytes split at another point:
    within one component (the embeddings of neighbouring positions, two multimodal identifiers) or
    across two (namespace and salt, salt and adapter)."""
    tokens = tuple(draw(st.lists(st.integers(0, 50_000), min_size=PROMPT_LEN, max_size=PROMPT_LEN)))
    base = Components(tokens, group=draw(st.sampled_from([0, 1])), shard=draw(st.sampled_from(SHARDS)))
    where = draw(st.sampled_from(["embeds", "multimodal", "namespace|salt", "salt|adapter", "adapter|namespace"]))
    if where == "embeds":
        count = draw(st.integers(2, PROMPT_LEN))
        whole = draw(st.binary(min_size=count + 1, max_size=count + 6))
        cuts = sorted(draw(st.lists(st.integers(1, len(whole) - 1), min_size=count - 1, max_size=count - 1, unique=True)))
        others = sorted(draw(st.lists(st.integers(1, len(whole) - 1), min_size=count - 1, max_size=count - 1, unique=True)))
        assume(cuts != others)
        mine, theirs = _split(whole, cuts), _split(whole, others)
        first = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
        return (dataclasses.replace(base, embeds=tuple(mine)),  # type: ignore[arg-type]
                dataclasses.replace(base, embeds=tuple(theirs)), "embeds", first)  # type: ignore[arg-type]
    if where == "multimodal":
        offset = draw(st.integers(0, PROMPT_LEN - 8))
        whole = draw(st.text(min_size=3, max_size=10))
        cut, other = draw(st.integers(1, len(whole) - 1)), draw(st.integers(1, len(whole) - 1))
        assume(cut != other)
        def items(at: int) -> tuple[MultimodalItem, ...]:
            return (MultimodalItem(whole[:at], offset, 4), MultimodalItem(whole[at:], offset + 4, 4))
        return (dataclasses.replace(base, multimodal=items(cut)), dataclasses.replace(base, multimodal=items(other)),
                "multimodal", offset)
    first_field, second_field = where.split("|")
    whole = draw(st.text(min_size=1, max_size=10))
    cut, other = draw(st.integers(0, len(whole))), draw(st.integers(0, len(whole)))
    assume(cut != other)
    def fields(at: int) -> dict[str, str | None]:
        values = {first_field: whole[:at], second_field: whole[at:]}
        return {name: (value or (None if name != "namespace" else "")) for name, value in values.items()}
    return (dataclasses.replace(base, **fields(cut)), dataclasses.replace(base, **fields(other)),  # type: ignore[arg-type]
            where, 0)


@settings(max_examples=500, deadline=None)
@given(resplit())
def test_the_same_bytes_split_at_another_point_never_share_a_key(case: tuple[Components, Components, str, int]) -> None:
    base, variant, change, position = case
    mine, theirs = physical_keys(base), physical_keys(variant)
    assert mine == physical_keys(dataclasses.replace(base))
    expected = reach(base, change, position)
    assert [a != b for a, b in zip(mine, theirs, strict=True)] == expected, (change, position)
    reached = {key for key, changed in zip(mine, expected, strict=True) if changed}
    assert not reached & set(theirs)
