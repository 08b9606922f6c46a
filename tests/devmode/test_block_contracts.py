"""Block-id groups handed to an instrumented connector: every id checked, every fault named."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import capkv
from capkv import ContractError, KVSpec
from capkv.contracts import _id_scan as scan
from capkv.devmode import instrument
from tests.devmode.strategies import Fault, Pool, faulty_groups, malformed_groups, pools, valid_groups
from tests.fakes import HMA, Plain, Req


def spec_of(pool: Pool) -> KVSpec:
    return KVSpec(num_groups=pool.num_groups, num_blocks=pool.num_blocks, null_block_id=pool.null)


def refused(dev: bool, pool: Pool, fault: Fault, method: str) -> ContractError | None:
    """Call ``method`` with the fault; in dev mode return the error, in production check it passed through."""
    connector = HMA("c")
    checked = instrument(connector, spec_of(pool))
    call = getattr(checked, method)
    args = (Req("r"), fault.groups, 0) if method == "update_state_after_alloc" else (Req("r"), fault.groups)
    if not dev:
        assert checked is connector
        call(*args)
        assert connector.calls[-1][1][1] is fault.groups
        return None
    with pytest.raises(ContractError) as info:
        call(*args)
    assert connector.calls == []
    return info.value


@given(pools.flatmap(lambda p: st.tuples(st.just(p), valid_groups(p))))
def test_valid_groups_pass_unchanged(dev: bool, case: tuple[Pool, tuple[list[int], ...]]) -> None:
    pool, groups = case
    connector = HMA("c")
    checked = instrument(connector, spec_of(pool))
    checked.update_state_after_alloc(Req("r"), groups, 3)
    checked.request_finished_all_groups(Req("r"), groups)
    assert [(m, args[1]) for m, args in connector.calls] == [
        ("update_state_after_alloc", groups), ("request_finished_all_groups", groups)
    ]
    assert all(args[1] is groups for _, args in connector.calls)


@pytest.mark.parametrize("method", ["update_state_after_alloc", "request_finished_all_groups"])
@given(data=st.data())
def test_each_bad_id_is_named(dev: bool, method: str, data: st.DataObject) -> None:
    pool = data.draw(pools)
    fault = data.draw(faulty_groups(pool))
    error = refused(dev, pool, fault, method)
    if error is None:
        return
    assert (error.connector, error.method, error.group, error.position) == ("HMA", method, fault.group, fault.position)
    assert error.value is fault.value or (type(error.value) is int and error.value == fault.value)
    message = str(error)
    assert message.startswith(f"HMA.{method}: ")
    assert f"group {fault.group}, position {fault.position}:" in message
    assert repr(fault.value)[:40] in message
    assert f"expected {error.expected}" in message
    if fault.kind == "repeat":
        assert "only the null block" in message
    else:
        assert f"[0, {pool.num_blocks})" in message


@given(data=st.data())
def test_malformed_containers_are_refused(dev: bool, data: st.DataObject) -> None:
    pool = data.draw(pools)
    fault = data.draw(malformed_groups(pool))
    error = refused(dev, pool, fault, "update_state_after_alloc")
    if error is None:
        return
    assert (error.group, error.position) == (fault.group, None)
    assert error.value is fault.value
    expected = {"list": "a tuple of", "count": "one list per KV-cache group", "group": "a list of block ids"}[fault.kind]
    assert expected in str(error)


def test_null_block_may_repeat_but_real_ids_may_not(dev: bool) -> None:
    spec = KVSpec(num_groups=2, num_blocks=8, null_block_id=5)
    connector = HMA()
    checked = instrument(connector, spec)
    checked.request_finished_all_groups(Req("r"), ([5, 5, 1, 5, 2], []))
    if dev:
        with pytest.raises(ContractError, match=r"group 1, position 2: 0 repeats the id at position 0"):
            checked.request_finished_all_groups(Req("r"), ([5, 5], [0, 5, 0]))


def test_many_ids_take_the_vectorised_path(dev: bool) -> None:
    n = scan.VECTOR_THRESHOLD * 2
    spec = KVSpec(num_groups=2, num_blocks=n + 1)
    groups = (list(range(1, n + 1)), [0] * 5 + list(range(n, 0, -1)))
    connector = HMA()
    checked = instrument(connector, spec)
    checked.update_state_after_alloc(Req("r"), groups, 0)
    groups[1][-1] = n // 2
    if dev:
        with pytest.raises(ContractError, match=rf"group 1, position {n + 4}: {n // 2} repeats the id at position"):
            checked.update_state_after_alloc(Req("r"), groups, 0)


def test_single_group_call_needs_a_single_group(dev: bool) -> None:
    one = instrument(Plain(), KVSpec(num_groups=1, num_blocks=4))
    one.request_finished(Req("r"), [0, 1, 0, 3])
    two = instrument(Plain(), KVSpec(num_groups=2, num_blocks=4))
    if dev:
        with pytest.raises(ContractError, match="single group's ids but the KV cache has 2 groups") as info:
            two.request_finished(Req("r"), [1])
        assert info.value.method == "request_finished"
        with pytest.raises(ContractError, match="group 0, position 1: 4 is outside the pool"):
            one.request_finished(Req("r"), [1, 4])


# ---- the fast verdict agrees with the precise walk, on both of its paths ----------


@pytest.mark.parametrize("threshold", [0, 10**9], ids=["vectorised", "builtins"])
@given(data=st.data())
def test_fast_verdict_agrees_with_the_walk(threshold: int, data: st.DataObject) -> None:
    pool = data.draw(pools)
    groups = data.draw(st.one_of(valid_groups(pool), faulty_groups(pool).map(lambda f: f.groups)))
    repeatable = data.draw(st.sampled_from([pool.null, None]))
    exact = all(type(i) is int and -(2**31) <= i < 2**31 for g in groups for i in g)  # what the fast path reads
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scan, "WALK_BELOW", 0)
        patch.setattr(scan, "VECTOR_THRESHOLD", threshold)
        verdict = scan.all_valid(groups, pool.num_blocks, repeatable)  # type: ignore[arg-type]
    walk = scan.first_bad_id(groups, pool.num_blocks, repeatable)
    if verdict:
        assert walk is None
    elif exact:
        assert walk is not None


def test_fast_verdict_defers_unusual_valid_input_to_the_walk() -> None:
    class Ids(list[int]):
        pass

    groups = (Ids(range(1, scan.WALK_BELOW)), [2**40])
    assert not scan.all_valid(groups, 2**41, 0)
    assert scan.first_bad_id(groups, 2**41, 0) is None
    checked = instrument(HMA(), KVSpec(num_groups=2, num_blocks=2**41))
    checked.update_state_after_alloc(Req("r"), groups, 0)


def test_instrumented_stack_names_the_child(dev: bool) -> None:
    spec = KVSpec(num_groups=1, num_blocks=4)
    inner = capkv.MultiConnector(HMA("a"), HMA("b"))
    stack = instrument(capkv.MultiConnector(HMA("x"), inner), spec)
    grandchild = stack.children[1].children[0]
    if dev:
        with pytest.raises(ContractError) as info:
            grandchild.update_state_after_alloc(Req("r"), ([9],), 0)
        assert info.value.connector == "#2.1 HMA"
        assert str(info.value).startswith("#2.1 HMA.update_state_after_alloc: blocks group 0, position 0: 9 ")
