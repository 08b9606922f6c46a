"""Every misuse is a specific capkv error naming connector, method, group and value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from capkv import ConfigError, ContractError, KVGroupSpec, KVSpec, MetadataError
from capkv.connectors import CPUOffloadConnector, FileStoreConnector, StoreMetadata
from tests.connectors.conftest import tokens
from tests.connectors.engine import MiniEngine, Req
from tests.paged import Group, empty_caches, make_spec

SPEC = make_spec([Group(16), Group(32, window=64)], num_blocks=64)


def _primed() -> tuple[CPUOffloadConnector, list[int]]:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=32)
    prompt = tokens(50, 100)
    MiniEngine(SPEC, connector).run("first", prompt)
    return connector, prompt


def test_external_tokens_that_were_not_offered() -> None:
    connector, prompt = _primed()
    request = Req("r", prompt + [1])
    with pytest.raises(ContractError, match="offered it nothing") as caught:
        connector.update_state_after_alloc(request, ([1] * 7, [0] * 4), 16)
    assert (caught.value.connector, caught.value.method, caught.value.value) == (
        "CPUOffloadConnector", "update_state_after_alloc", 16,
    )
    assert connector.get_num_new_matched_tokens(request, 0) == (96, False)
    with pytest.raises(ContractError, match="more than offered"):
        connector.update_state_after_alloc(request, (list(range(1, 8)), [0, 0, 9, 10]), 128)
    connector.get_num_new_matched_tokens(request, 0)
    with pytest.raises(ContractError, match="not a whole number of group 1's blocks") as misaligned:
        connector.update_state_after_alloc(request, (list(range(1, 8)), [0, 0, 9, 10]), 80)
    assert misaligned.value.group == 1


def test_block_ids_of_the_wrong_shape_or_range() -> None:
    connector, prompt = _primed()
    request = Req("r", prompt + [1])
    connector.get_num_new_matched_tokens(request, 0)
    with pytest.raises(ContractError, match=r"block_ids: .* has 1 group; expected one list per KV-cache group \(2\)"):
        connector.update_state_after_alloc(request, (list(range(1, 8)),), 96)
    connector.get_num_new_matched_tokens(request, 0)
    with pytest.raises(ContractError, match="block_ids group 1, position 2: 64 is outside the pool") as caught:
        connector.update_state_after_alloc(request, (list(range(1, 8)), [0, 0, 64, 10]), 96)
    assert caught.value.group == 1 and caught.value.value == 64 and caught.value.method == "update_state_after_alloc"
    connector.get_num_new_matched_tokens(request, 0)
    with pytest.raises(ContractError, match="group 0 of request 'r' has 5 block ids; loading up to token 96 needs 6"):
        connector.update_state_after_alloc(request, (list(range(1, 6)), [0, 0, 9, 10]), 96)


def test_metadata_that_is_not_the_connectors_own() -> None:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=4)
    with pytest.raises(MetadataError, match="expected StoreMetadata, got 'meta'"):
        connector.bind_connector_metadata("meta")
    with pytest.raises(MetadataError, match="no connector metadata is bound"):
        connector.start_load_kv(None)


def test_copying_before_the_kv_cache_is_registered() -> None:
    connector, prompt = _primed()
    fresh = CPUOffloadConnector(SPEC, capacity_blocks=4)
    request = Req("r", prompt + [1])
    fresh.request_finished_all_groups(Req("x", tokens(51, 40), 40), ([1, 2], [3]))
    fresh.bind_connector_metadata(fresh.build_connector_meta(None))
    with pytest.raises(ConfigError, match="register_kv_caches has not been called") as caught:
        fresh.start_load_kv(None)
    assert caught.value.connector == "CPUOffloadConnector" and request.request_id == "r"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (KVSpec(num_groups=2, num_blocks=8, dtype=torch.float16), "describe each of its 2 KV-cache groups"),
        (KVSpec(num_groups=1, num_blocks=8, groups=(KVGroupSpec(layer_names=("a",), block_size=16, kv_shape=(8, 2, 16, 1, 1)),)), "needs a dtype"),
        (KVSpec(num_groups=1, num_blocks=8, dtype=torch.float16, groups=(KVGroupSpec(layer_names=("a",), kv_shape=(8, 2, 16, 1, 1)),)), "group 0 needs a positive block_size"),
        (KVSpec(num_groups=1, num_blocks=8, dtype=torch.float16, groups=(KVGroupSpec(block_size=16, kv_shape=(8, 2, 16, 1, 1)),)), "group 0 needs layer_names"),
    ],
)
def test_a_spec_that_cannot_key_or_size_blocks(spec: KVSpec, match: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        CPUOffloadConnector(spec, capacity_blocks=4)
    with pytest.raises(ConfigError, match=match):
        FileStoreConnector(spec, root=tmp_path)


def test_bad_capacity_and_bad_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="capacity_blocks must be an int >= 1, got 0"):
        CPUOffloadConnector(SPEC, capacity_blocks=0)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ConfigError, match="cannot use"):
        FileStoreConnector(SPEC, root=not_a_dir)


def test_registering_caches_that_do_not_match_the_spec() -> None:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=4)
    caches = empty_caches(SPEC)
    caches["g1.layer1"] = caches["g1.layer1"].float()
    with pytest.raises(ConfigError, match="layer 'g1.layer1' of group 1 has dtype torch.float32") as caught:
        connector.register_kv_caches(caches)
    assert caught.value.connector == "CPUOffloadConnector" and caught.value.group == 1


def test_token_ids_that_are_not_integers() -> None:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=4)
    with pytest.raises(ContractError, match="not 64-bit integer token ids|violates type hint"):
        connector.get_num_new_matched_tokens(Req("r", [1.5] * 40), 0)  # type: ignore[list-item]
    with pytest.raises(ContractError, match="not 64-bit integer token ids") as caught:
        connector.get_num_new_matched_tokens(Req("r", [2**70] * 40), 0)  # an int, too wide to hash
    assert caught.value.group == 0


@dataclass
class TokensOnly:
    """A request that does not say how much of it was computed (like the engine's before prefill)."""

    request_id: str
    all_token_ids: list[int]


def test_a_request_that_does_not_say_what_was_computed_is_not_saved() -> None:
    connector, _ = _primed()
    # Refused by the connector, or in dev mode already by its type hint (ComputedTokenRequest).
    with pytest.raises(ContractError, match="request_finished_all_groups") as caught:
        connector.request_finished_all_groups(TokensOnly("aborted", tokens(52, 100)), ([1, 2, 3], [0, 4]))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    assert "ComputedTokenRequest" in str(caught.value)
    assert connector.build_connector_meta(None).saves == ()


def test_a_request_aborted_before_prefill_saves_nothing() -> None:
    connector, _ = _primed()
    aborted = Req("aborted", tokens(53, 100), num_computed_tokens=0)
    assert connector.request_finished_all_groups(aborted, (list(range(1, 8)), [0, 0, 9, 10])) == (False, None)
    assert connector.build_connector_meta(None).saves == ()


@pytest.mark.parametrize("computed", [-16, 102, True])
def test_num_computed_tokens_outside_the_request_is_refused(computed: int) -> None:
    connector, prompt = _primed()
    request = Req("r", prompt + [1])
    with pytest.raises(ContractError, match=rf"num_computed_tokens={computed!r} for request 'r'; expected an int in \[0, 101\]") as caught:
        connector.get_num_new_matched_tokens(request, computed)
    assert (caught.value.connector, caught.value.method, caught.value.value) == (
        "CPUOffloadConnector", "get_num_new_matched_tokens", computed,
    )
    request.num_computed_tokens = computed
    with pytest.raises(ContractError, match=rf"num_computed_tokens={computed!r}") as finished:
        connector.request_finished_all_groups(request, (list(range(1, 8)), [0, 0, 9, 10]))
    assert finished.value.method == "request_finished_all_groups"


def test_connector_output_that_is_not_one() -> None:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=4)
    with pytest.raises(ContractError, match="update_connector_output.*KVConnectorOutput"):
        connector.update_connector_output(None)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
