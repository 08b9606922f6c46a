"""``instrument``: identity in production; in dev mode a faithful proxy, stacks included."""

from __future__ import annotations

from functools import partial
from typing import Any, cast

import pytest
import torch

import capkv
from capkv import CapabilityError, ConfigError, ContractError, KVSpec, StackNode
from capkv.devmode import Instrumented, instrument
from tests.fakes import HMA, Plain, Req

SPEC = KVSpec(num_groups=2, num_blocks=16)
ONE_GROUP = KVSpec(num_groups=1, num_blocks=16)


class Standalone:
    """A connector written outside capkv: no base class, only the members it needs."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.seen.append((name, args))

    def request_finished_all_groups(self, request: object, block_ids: object, /) -> tuple[bool, None]:
        self.seen.append(("request_finished_all_groups", block_ids))
        return True, None


def test_production_returns_the_very_same_object(production: None) -> None:
    for connector in (Plain(), HMA(), capkv.MultiConnector(HMA(), Plain()), Standalone()):
        assert instrument(connector, SPEC) is connector
    plain = Plain()
    instrument(plain, SPEC).update_state_after_alloc(Req("r"), "not even block ids", 0)  # type: ignore[arg-type]
    assert plain.calls == [("update_state_after_alloc", (Req("r"), "not even block ids", 0))]


def test_mode_is_read_once_when_instrumenting(dev: bool) -> None:
    connector = HMA()
    checked = instrument(connector, SPEC)
    with capkv.devmode.dev_mode(False):
        still_checked = checked.update_state_after_alloc
        if dev:
            with pytest.raises(ContractError):
                still_checked(Req("r"), ([99], []), 0)
        assert instrument(connector, SPEC) is connector


def test_the_proxy_is_the_connector_for_everything_else(dev: bool) -> None:
    connector = HMA("h", hit=5)
    checked = instrument(connector, SPEC)
    if not dev:
        assert checked is connector
        return
    assert isinstance(checked, Instrumented) and isinstance(checked, HMA)
    assert checked.__wrapped__ is connector
    assert type(checked).__name__ == "HMA"
    assert checked.get_num_new_matched_tokens(Req("r"), 0) == (5, False)
    checked.delay_free = True
    assert connector.delay_free is True
    assert checked.request_finished_all_groups(Req("r"), ([1], [2])) == (True, None)
    assert checked.name == "h" and "calls" in dir(checked)
    assert repr(checked) == f"instrument({connector!r})" == "instrument(HMA('h'))"


def test_capabilities_are_kept_not_gained(dev: bool) -> None:
    hma, plain = instrument(HMA(), SPEC), instrument(Plain(), SPEC)
    assert capkv.supports_hma(hma) and isinstance(hma, capkv.SupportsHMA)
    assert not capkv.supports_hma(plain) and not hasattr(plain, "request_finished_all_groups")
    assert isinstance(plain, capkv.KVConnector) and isinstance(hma, capkv.HMAConnector)
    capkv.check_stack(hma, SPEC)
    with pytest.raises(CapabilityError, match='sub-connector #2 "Plain" does not implement SupportsHMA'):
        capkv.check_stack(instrument(capkv.MultiConnector(HMA(), Plain()), SPEC), SPEC)


def test_a_user_connector_outside_capkv(dev: bool) -> None:
    connector = Standalone()
    checked = instrument(connector, SPEC)
    assert capkv.supports_hma(checked)
    checked.request_finished_all_groups(Req("r"), ([1], [0, 0]))
    if dev:
        with pytest.raises(ContractError, match=r"^Standalone.request_finished_all_groups: block_ids group 0, position 0"):
            checked.request_finished_all_groups(Req("r"), ([16], []))
    assert connector.seen == [("request_finished_all_groups", ([1], [0, 0]))]


def test_stacks_are_rebuilt_over_instrumented_children(dev: bool) -> None:
    leaves = [HMA("a"), HMA("b"), HMA("c")]
    stack = capkv.MultiConnector(leaves[0], capkv.MultiConnector(leaves[1], leaves[2]))
    checked = instrument(stack, SPEC)
    if not dev:
        assert checked is stack
        return
    assert checked is not stack and isinstance(checked, capkv.HMAMultiConnector)
    inner = checked.children[1]
    assert isinstance(inner, Instrumented) and isinstance(inner, StackNode)
    assert [child.__wrapped__ for child in (checked.children[0], *inner.children)] == leaves
    checked.update_state_after_alloc(Req("r"), ([1, 2], [0, 0, 3]), 0)
    assert all(leaf.methods() == ["update_state_after_alloc"] for leaf in leaves)
    assert stack.children[0] is leaves[0], "the original stack is left as it was"


def test_a_bad_call_made_by_a_composite_is_caught_at_the_child(dev: bool) -> None:
    class Truncating(capkv.MultiConnector[Any]):
        """A composite that hands its children only group 0 — the bug of the field."""

        def update_state_after_alloc(self, request: capkv.Request, blocks: capkv.BlockIds, num_external_tokens: int, /) -> None:
            for child in self.children:
                child.update_state_after_alloc(request, (blocks[0],), num_external_tokens)

    stack = Truncating(HMA(), Plain())
    checked = instrument(stack, SPEC)
    if not dev:
        assert checked is stack
        return
    assert type(checked).__name__ == "Truncating"
    with pytest.raises(ContractError, match=r"^#1 HMA.update_state_after_alloc: blocks: .* has 1 group; expected one list per KV-cache group \(2\)") as info:
        checked.update_state_after_alloc(Req("r"), ([1], [2]), 0)
    assert info.value.connector == "#1 HMA"


def test_a_non_hma_stack_on_one_group_finishes_through_the_single_group_call(dev: bool) -> None:
    plain = Plain()
    checked = instrument(capkv.MultiConnector(plain, Plain()), ONE_GROUP)
    assert capkv.finish_request(checked, Req("r"), ([3, 4],)) == (False, None)
    assert plain.calls == [("request_finished", (Req("r"), [3, 4]))]


def test_keyword_arguments_reach_the_connector(dev: bool) -> None:
    spec = KVSpec(num_groups=1, num_blocks=2, dtype=torch.float32)
    plain = Plain()
    tensor = torch.zeros(2)
    instrument(plain, spec).save_kv_layer("l", tensor, "meta", stream=7)
    assert plain.calls == [("save_kv_layer", ("l", tensor, "meta", {"stream": 7}))]


def test_reinstrumenting(dev: bool) -> None:
    connector = HMA()
    checked = instrument(connector, SPEC)
    if not dev:
        assert checked is connector
        return
    assert instrument(checked, SPEC) is checked
    wider = KVSpec(num_groups=2, num_blocks=64)
    rebound = instrument(checked, wider)
    assert rebound is not checked and rebound.__wrapped__ is checked.__wrapped__
    rebound.update_state_after_alloc(Req("r"), ([40], []), 0)


def test_what_cannot_be_instrumented(dev: bool) -> None:
    class Opaque(StackNode):
        @property
        def children(self) -> tuple[object, ...]:
            return (HMA(),)

    if not dev:
        opaque = Opaque()
        assert instrument(opaque, SPEC) is opaque  # type: ignore[type-var]
        return
    with pytest.raises(CapabilityError, match=r'"Opaque" is a StackNode without with_children') as info:
        instrument(Opaque(), SPEC)  # type: ignore[type-var]
    assert (info.value.connector, info.value.method) == ("Opaque", "instrument")
    with pytest.raises(ConfigError, match="needs a connector instance, got the class HMA"):
        instrument(HMA, SPEC)  # type: ignore[type-var]


class OpenPlain:
    """A connector written vLLM-style: ordinary parameters, so a caller may pass any of them by keyword."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[object, ...]]] = []

    def update_state_after_alloc(self, request: object, blocks: object, num_external_tokens: object) -> None:
        self.seen.append(("update_state_after_alloc", (request, blocks, num_external_tokens)))

    def request_finished(self, request: object, block_ids: object) -> tuple[bool, None]:
        self.seen.append(("request_finished", (request, block_ids)))
        return False, None

    def register_kv_caches(self, kv_caches: object) -> None:
        self.seen.append(("register_kv_caches", (kv_caches,)))

    def save_kv_layer(self, layer_name: object, kv_layer: object, attn_metadata: object, **kwargs: Any) -> None:
        self.seen.append(("save_kv_layer", (layer_name, kv_layer, attn_metadata)))


class OpenHMA(OpenPlain):
    def request_finished_all_groups(self, request: object, block_ids: object) -> tuple[bool, None]:
        self.seen.append(("request_finished_all_groups", (request, block_ids)))
        return False, None


LAYERS = KVSpec(num_groups=1, num_blocks=4, groups=(capkv.KVGroupSpec(layer_names=("a",), kv_shape=(4, 2)),))
KV = torch.zeros(4, 2)
PARAMETERS = {
    "update_state_after_alloc": ("request", "blocks", "num_external_tokens"),
    "request_finished": ("request", "block_ids"),
    "request_finished_all_groups": ("request", "block_ids"),
    "register_kv_caches": ("kv_caches",),
    "save_kv_layer": ("layer_name", "kv_layer", "attn_metadata"),
}
CALLS: dict[str, tuple[KVSpec, tuple[object, ...], tuple[object, ...]]] = {  # method: spec, a good call, a bad one
    "update_state_after_alloc": (SPEC, (Req("r"), ([1], [0, 0]), 0), (Req("r"), ([1], [16]), 0)),
    "request_finished": (ONE_GROUP, (Req("r"), [3]), (Req("r"), [3, 3])),
    "request_finished_all_groups": (SPEC, (Req("r"), ([1], [2])), (Req("r"), ([1],))),
    "register_kv_caches": (LAYERS, ({"a": KV},), ({"a": KV, "b": KV},)),
    "save_kv_layer": (LAYERS, ("a", KV, None), ("a", torch.zeros(4, 3), None)),
}


def keyword_forms(method: str, args: tuple[object, ...]) -> list[tuple[tuple[object, ...], dict[str, object]]]:
    """Every way to pass ``args``: the first ``k`` by position, the rest by name (in reverse, for good measure)."""
    names = PARAMETERS[method]
    return [(args[:k], dict(reversed([*zip(names[k:], args[k:], strict=True)]))) for k in range(len(args) + 1)]


@pytest.mark.parametrize(
    ("cls", "method"),
    [(cls, method) for cls in (OpenPlain, OpenHMA) for method in CALLS if hasattr(cls, method)],
)
def test_keyword_calls_are_checked_as_the_connector_binds_them(dev: bool, cls: type[OpenPlain], method: str) -> None:
    spec, good, bad = CALLS[method]
    for args, kwargs in keyword_forms(method, good):
        connector = cls()
        getattr(instrument(connector, spec), method)(*args, **kwargs)
        assert connector.seen == [(method, good)]
    for args, kwargs in keyword_forms(method, bad):
        connector = cls()
        call = getattr(instrument(connector, spec), method)
        if dev:
            with pytest.raises(ContractError, match=rf"^{cls.__name__}\.{method}: "):
                call(*args, **kwargs)
            assert connector.seen == []
        else:
            call(*args, **kwargs)


def recorded(connector: object) -> list[Any]:
    return list(connector.calls if isinstance(connector, Plain) else cast(OpenPlain, connector).seen)


@pytest.mark.parametrize(
    ("cls", "method"),
    [(cls, method) for cls in (Plain, HMA, OpenPlain, OpenHMA) for method in CALLS if hasattr(cls, method)],
)
def test_any_call_behaves_as_on_the_bare_connector(dev: bool, cls: type[object], method: str) -> None:
    """Whatever the connector's own signature accepts is checked; whatever it refuses fails just as it would."""
    spec, good, bad = CALLS[method]
    refusals = 0
    for args in (good, bad):
        for call_args, kwargs in [*keyword_forms(method, args), (args[:-1], {}), ((*args, "extra"), {})]:
            bare, checked = cls(), cls()
            try:
                getattr(bare, method)(*call_args, **kwargs)
            except TypeError as refusal:
                refusals += 1
                with pytest.raises(TypeError) as got:
                    getattr(instrument(checked, spec), method)(*call_args, **kwargs)
                assert str(got.value) == str(refusal)
                assert recorded(checked) == []
                continue
            call = partial(getattr(instrument(checked, spec), method), *call_args, **kwargs)
            if dev and args is bad:
                with pytest.raises(ContractError, match=rf"^{cls.__name__}\.{method}: "):
                    call()
                assert recorded(checked) == []
            else:
                call()
                assert recorded(checked) == recorded(bare)
    # capkv's fakes take the contract's positional-only parameters, and only save_kv_layer's by name
    keywords_refused = issubclass(cls, Plain) and method != "save_kv_layer"
    assert refusals == 2 * (2 + (len(PARAMETERS[method]) if keywords_refused else 0))


def test_a_connector_taking_anything_is_checked_by_the_contract_names(dev: bool) -> None:
    connector = Standalone()
    checked = instrument(connector, SPEC)
    checked.update_state_after_alloc(Req("r"), blocks=([1], [2]), num_external_tokens=0)
    assert connector.seen == [("update_state_after_alloc", (Req("r"),))]
    if dev:
        with pytest.raises(ContractError, match=r"^Standalone.update_state_after_alloc: blocks group 1"):
            checked.update_state_after_alloc(Req("r"), num_external_tokens=0, blocks=([1], [16]))
        with pytest.raises(ContractError, match=r"^Standalone.update_state_after_alloc: blocks group 0"):
            checked.update_state_after_alloc(Req("r"), ([16], []), num_external_tokens=0)
    checked.update_state_after_alloc(Req("r"), other=([16], []))  # not the contract's argument: the connector's business
    assert len(connector.seen) == 2


def test_defaults_are_checked_as_the_connector_receives_them(dev: bool) -> None:
    class Defaulted(OpenPlain):
        def update_state_after_alloc(self, request: object, blocks: object = ([99],), num_external_tokens: object = 0) -> None:
            super().update_state_after_alloc(request, blocks, num_external_tokens)

    connector = Defaulted()
    checked = instrument(connector, ONE_GROUP)
    checked.update_state_after_alloc(Req("r"), ([1],))
    if dev:
        with pytest.raises(ContractError, match=r"^Defaulted.update_state_after_alloc: blocks group 0, position 0: 99"):
            checked.update_state_after_alloc(Req("r"))
        assert connector.seen == [("update_state_after_alloc", (Req("r"), ([1],), 0))]


def test_keyword_only_parameters_are_found_by_position(dev: bool) -> None:
    class KeywordOnly(OpenHMA):
        def request_finished_all_groups(self, request: object, *, ids: object) -> tuple[bool, None]:
            return super().request_finished_all_groups(request, ids)

    connector = KeywordOnly()
    checked = instrument(connector, SPEC)
    assert checked.request_finished_all_groups(Req("r"), ids=([1], [2])) == (False, None)
    if dev:
        with pytest.raises(ContractError, match=r"^KeywordOnly.request_finished_all_groups: block_ids: \(\[1\],\) has 1 group"):
            checked.request_finished_all_groups(Req("r"), ids=([1],))
    with pytest.raises(TypeError, match="positional argument"):
        checked.request_finished_all_groups(Req("r"), ([1], [2]))


def test_an_instrumented_stack_keeps_the_engines_kv_spec(dev: bool) -> None:
    """The rebuilt stack masks an unfinished load's blocks by token, as the one the engine checked does."""
    from capkv import MultiConnector
    from tests.test_tiers import spec, tiered

    front, back = HMA("front", slices=True), HMA("back", hit=tiered(16, 48), slices=True, load_async=True)
    stack = MultiConnector(front, back)
    stack.bind_kv_spec(spec(16))
    served = instrument(stack, spec(16))
    request = Req("a")
    assert served.get_num_new_matched_tokens(request, 16) == (32, True)
    served.update_state_after_alloc(request, ([5, 1, 2],), 32)
    served.request_finished_all_groups(request, ([5, 1, 2],))  # aborted mid-load
    finished = [args[1] for method, args in front.calls if method == "request_finished_all_groups"]
    assert finished == [([5, 0, 0],)], "the engine's own block is kept; without the spec every block was dropped"
