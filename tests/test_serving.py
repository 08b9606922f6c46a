"""check_stack and finish_request: refusals before serving and at finish, never truncation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capkv import devmode

from capkv import (
    CapabilityError,
    CapkvError,
    ConfigError,
    ContractError,
    ConflictError,
    KVGroupSpec,
    KVSpec,
    MultiConnector,
    check_stack,
    finish_request,
)
from tests.fakes import HMA, KVCacheConfig, Plain, Req

TWO_GROUPS = KVCacheConfig(kv_cache_groups=["full", "sliding"])
ONE_GROUP = KVCacheConfig(kv_cache_groups=["full"])


@pytest.mark.parametrize("config", [TWO_GROUPS, 2, KVSpec(num_groups=2, num_blocks=8)])
def test_an_hma_stack_serves_several_groups(config: object) -> None:
    check_stack(MultiConnector(HMA(), MultiConnector(HMA(), HMA())), config)  # type: ignore[arg-type]


@pytest.mark.parametrize("config", [ONE_GROUP, 1, KVSpec(num_groups=1, num_blocks=8)])
def test_any_stack_serves_one_group(config: object) -> None:
    check_stack(MultiConnector(Plain(), HMA()), config)  # type: ignore[arg-type]
    check_stack(Plain(), config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stack", "offenders"),
    [
        (lambda: MultiConnector(HMA(), Plain()), ['#2 "Plain"']),
        (lambda: MultiConnector(Plain(), HMA()), ['#1 "Plain"']),
        (lambda: MultiConnector(Plain(), Plain()), ['#1 "Plain"', '#2 "Plain"']),
        (lambda: MultiConnector(MultiConnector(HMA(), Plain()), HMA(), Plain()), ['#1.2 "Plain"', '#3 "Plain"']),
    ],
)
def test_a_non_hma_stack_is_refused_before_serving_naming_every_offender(stack: object, offenders: list[str]) -> None:
    with pytest.raises(CapabilityError) as info:
        check_stack(stack(), TWO_GROUPS)  # type: ignore[operator]
    message = str(info.value)
    assert message.startswith('"MultiConnector" cannot serve 2 KV-cache groups: ')
    assert message.endswith("an HMA stack needs every child to")
    for offender in offenders:
        assert f"sub-connector {offender} does not implement SupportsHMA (missing request_finished_all_groups)" in message
    assert message.count("does not implement") == len(offenders)
    assert info.value.method == "check_stack" and info.value.value == 2


def test_a_plain_leaf_is_refused_by_name() -> None:
    with pytest.raises(CapabilityError, match=r'connector "Plain" does not implement SupportsHMA'):
        check_stack(Plain(), 3)


def test_something_that_is_not_a_connector_is_refused() -> None:
    with pytest.raises(CapabilityError, match=r'"str" is not a KVConnector \(missing get_num_new_matched_tokens, '):
        check_stack("connector", 1)


def test_children_conflicts_surface_before_serving() -> None:
    a, b = HMA(), HMA()
    a.layout, b.layout = "HND", "NHD"
    with pytest.raises(ConflictError, match="get_required_kvcache_layout"):
        check_stack(MultiConnector(a, b), 2)


def test_finish_hands_every_group_to_an_hma_connector() -> None:
    a, b = HMA(), HMA()
    finish_request(MultiConnector(a, b), Req("r"), ([1, 2], [0, 3]))
    assert a.calls == b.calls == [("request_finished_all_groups", (Req("r"), ([1, 2], [0, 3])))]


def test_finish_with_one_group_uses_the_single_group_method() -> None:
    a = Plain()
    assert finish_request(MultiConnector(a), Req("r"), ([4, 5],)) == (False, None)
    assert a.calls == [("request_finished", (Req("r"), [4, 5]))]


@pytest.mark.parametrize("block_ids", [([1], [2]), ([1], [2], [3])])
def test_finish_never_truncates_to_group_zero(block_ids: tuple[list[int], ...]) -> None:
    a, b = HMA(), Plain()
    with pytest.raises(CapabilityError, match=r'sub-connector #2 "Plain" does not implement SupportsHMA') as info:
        finish_request(MultiConnector(a, b), Req("r"), block_ids)
    assert info.value.value == len(block_ids) and info.value.method == "finish_request"
    assert a.calls == b.calls == [], "no child saw a partial request"


@pytest.mark.parametrize("block_ids", [(), [5, 6], [[5, 6]], ([1], (2,)), "ids", ([1], None)])
@pytest.mark.parametrize("connector", [HMA, Plain])
def test_finish_refuses_block_ids_that_are_not_one_list_per_group(connector: type[Plain], block_ids: object) -> None:
    child = connector()
    with pytest.raises(ContractError, match="block_ids") as info:
        finish_request(child, Req("r"), block_ids)  # type: ignore[arg-type]
    if not devmode.types_checked():  # in dev mode beartype refuses it first, by capkv's type hints
        assert str(info.value).startswith(f'finish_request("{connector.__name__}"): block_ids must be a non-empty tuple')
        assert info.value.value is block_ids and info.value.method == "finish_request"
    assert child.calls == [], "nothing reached the connector"


@pytest.mark.parametrize("config", [object(), None, {"kv_cache_groups": 2}, 0, -3, True, KVCacheConfig([])])
def test_check_stack_refuses_what_is_not_a_kv_cache_config(config: object) -> None:
    refusal = ConfigError if not devmode.types_checked() or isinstance(config, (int, KVCacheConfig)) else CapkvError
    with pytest.raises(refusal):
        check_stack(HMA(), config)  # type: ignore[arg-type]


def test_refusals_survive_python_O(tmp_path: Path) -> None:
    """The seed's weakness: asserts vanish under -O. capkv's checks must not."""
    script = tmp_path / "under_O.py"
    script.write_text(textwrap.dedent(
        """
        import sys
        assert False, "asserts must be off in this run"
        from capkv import CapabilityError, MultiConnector, check_stack, finish_request
        from tests.fakes import HMA, Plain, Req
        stack = MultiConnector(HMA(), Plain())
        refused = 0
        for attempt in (lambda: check_stack(stack, 2), lambda: finish_request(stack, Req("r"), ([1], [2]))):
            try:
                attempt()
            except CapabilityError:
                refused += 1
        print("refused", refused, "hma-attr", hasattr(stack, "request_finished_all_groups"))
        """
    ))
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-O", str(script)], cwd=root, capture_output=True, text=True,
                            env={"PYTHONPATH": str(root), "PATH": ""}, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["refused", "2", "hma-attr", "False"]


def test_kv_spec_rejects_impossible_shapes() -> None:
    with pytest.raises(ConfigError, match=r"null_block_id must be an int in \[0, 7\], got 8"):
        KVSpec(num_groups=1, num_blocks=8, null_block_id=8)
    with pytest.raises(ConfigError, match="2 group specs given for num_groups=1"):
        KVSpec(num_groups=1, num_blocks=8, groups=(KVGroupSpec(), KVGroupSpec()))
    with pytest.raises(ConfigError, match="layer 'l0' is in group 0 and group 1"):
        KVSpec(num_groups=2, num_blocks=8, groups=(KVGroupSpec(layer_names=("l0",)), KVGroupSpec(layer_names=("l0",))))
    with pytest.raises(ConfigError, match=r"has 4 blocks in dimension 1, expected num_blocks=8"):
        KVSpec(num_groups=1, num_blocks=8, block_dim=1, groups=(KVGroupSpec(kv_shape=(2, 4, 16)),))
    spec = KVSpec(num_groups=2, num_blocks=8, groups=(KVGroupSpec(layer_names=("a",)), KVGroupSpec(layer_names=("b", "c"))))
    assert [spec.group_of_layer(n) for n in ("a", "b", "c", "z")] == [0, 1, 1, None]
