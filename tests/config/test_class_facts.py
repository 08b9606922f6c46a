"""Facts answered from classes: ``class_fact``, and ``capkv check`` on stacks no config file can build."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from capkv import ConflictError, KVConnectorBase, MultiConnector, class_level
from capkv.capabilities._facts import NEEDS_INSTANCE, STATIC_FACTS, class_fact
from capkv.composite._building import answers_by_agreement
from capkv.connectors._cpu_offload import CPUOffloadConnector
from capkv.connectors._file_store import FileStoreConnector
from capkv.connectors._single_group import SingleGroupOffloadConnector
from tests.config import sample_connectors
from tests.config.sample_connectors import FIXED, EngineBound, EngineBoundConfigured, EngineBoundNHD
from tests.config.test_check_cli import SAMPLES, check, leaf, multi
from tests.fakes import Plain

README_STACK = """\
kv_connector = "MultiConnector"

[[kv_connector_extra_config.connectors]]
kv_connector = "CPUOffloadConnector"
kv_connector_extra_config = { capacity_blocks = 4096 }

[[kv_connector_extra_config.connectors]]
kv_connector = "MultiConnector"
kv_connector_extra_config.connectors = [
  { kv_connector = "FileStoreConnector", kv_connector_extra_config = { root = "/var/cache/kv" } },
  { kv_connector = "SingleGroupOffloadConnector", kv_connector_extra_config = { capacity_blocks = 1024 } },
]
"""


# ---- class_fact ------------------------------------------------------------------


@pytest.mark.parametrize("cls", [CPUOffloadConnector, FileStoreConnector, SingleGroupOffloadConnector])
def test_reference_connectors_answer_from_their_class(cls: type[Any]) -> None:
    assert [class_fact(cls, fact) for fact in STATIC_FACTS] == [None, False, None]


def test_the_member_found_through_the_mro_decides() -> None:
    assert class_fact(EngineBound, "get_required_kvcache_layout") == "HND"
    assert class_fact(EngineBound, "requires_piecewise_for_cudagraph") is True
    assert class_fact(EngineBoundNHD, "get_required_kvcache_layout") == "NHD"
    assert class_fact(EngineBoundNHD, "requires_piecewise_for_cudagraph") is True  # inherited
    assert class_fact(EngineBoundConfigured, "get_required_kvcache_layout") is NEEDS_INSTANCE
    assert class_fact(EngineBoundConfigured, "get_finished_count") is None  # still class-level
    assert class_fact(Plain, "get_finished_count") is NEEDS_INSTANCE  # instance override of the base default


def test_plain_classmethods_and_staticmethods_answer_too() -> None:
    class ByClassmethod(Plain):
        @classmethod
        def get_finished_count(cls) -> int | None:  # type: ignore[override]
            return 4

    class ByStaticmethod(ByClassmethod):
        @staticmethod
        def get_finished_count() -> int | None:  # type: ignore[override]
            return 8

    assert class_fact(ByClassmethod, "get_finished_count") == 4
    assert class_fact(ByStaticmethod, "get_finished_count") == 8


def test_class_level_answers_match_the_instances() -> None:
    connector = EngineBound(engine_object=None)
    assert connector.get_required_kvcache_layout() == class_fact(EngineBound, "get_required_kvcache_layout")
    assert isinstance(vars(KVConnectorBase)["get_finished_count"], classmethod)
    configured = EngineBoundConfigured(engine_object=None)
    configured.layout = "NHD"
    assert configured.get_required_kvcache_layout() == "NHD"


def test_a_multiconnector_needs_its_children() -> None:
    assert all(class_fact(MultiConnector, fact) is NEEDS_INSTANCE for fact in STATIC_FACTS)
    assert all(answers_by_agreement(MultiConnector, fact) for fact in STATIC_FACTS)


def test_a_composite_with_its_own_rule_is_asked_as_an_instance() -> None:
    class FirstChildDecides(MultiConnector):  # type: ignore[type-arg]
        def get_required_kvcache_layout(self) -> str | None:
            return self.children[0].get_required_kvcache_layout()  # type: ignore[no-any-return]

    assert not answers_by_agreement(FirstChildDecides, "get_required_kvcache_layout")
    assert answers_by_agreement(FirstChildDecides, "get_finished_count")
    assert not answers_by_agreement(Plain, "get_finished_count")


# ---- capkv check -------------------------------------------------------------------


def check_toml(tmp_path: Path, text: str, *options: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from capkv.cli._main import main

    path = tmp_path / "stack.toml"
    path.write_text(text)
    status = main(["check", str(path), *options])
    out, err = capsys.readouterr()
    return status, out, err


def test_reference_stack_has_every_fact_and_serves_one_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check_toml(tmp_path, README_STACK, "--groups", "1", capsys=capsys)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert "?" not in out
    assert all("layout: any  piecewise cudagraph: no  finished count: default" in line for line in lines[:-1])
    assert lines[-1] == "ok: the stack can serve 1 KV-cache group (#1, #2.1, #2.2 not built from extra config: facts from their classes)"


def test_reference_stack_facts_with_classes_only_and_two_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = check_toml(tmp_path, README_STACK, "--classes-only", capsys=capsys)
    assert status == 0 and "?" not in "\n".join(out.splitlines()[:-1])
    assert out.splitlines()[-1].startswith("ok for 1 KV-cache group (classes only); not for 2 or more: ")
    status, out, err = check_toml(tmp_path, README_STACK, "--groups", "2", capsys=capsys)
    assert status == 1 and "?" not in out
    assert err.splitlines() == [
        'capkv check: error: "MultiConnector" cannot serve 2 KV-cache groups: sub-connector #2.2 '
        '"SingleGroupOffloadConnector" does not implement SupportsHMA (missing request_finished_all_groups); '
        "an HMA stack needs every child to"
    ]


def conflict_text(*children: Any, method: str) -> str:
    with pytest.raises(ConflictError) as raised:
        getattr(MultiConnector(*children), method)()
    return str(raised.value)


@pytest.mark.parametrize("options", [(), ("--classes-only",)])
def test_class_level_conflict_reads_as_the_built_stack_would_raise_it(
    tmp_path: Path, options: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = check(tmp_path, multi(leaf("EngineBound"), leaf("EngineBoundNHD")), *options, capsys=capsys)
    expected = conflict_text(EngineBound(None), EngineBoundNHD(None), method="get_required_kvcache_layout")
    assert expected.startswith("HMAMultiConnector.get_required_kvcache_layout: sub-connectors disagree (")
    assert status == 1
    assert err.splitlines() == [f"capkv check: error: {expected}"]
    assert "layout: conflict  piecewise cudagraph: yes" in out.splitlines()[0]


def test_a_nested_conflict_is_reported_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("EngineBound"), multi(leaf("EngineBound"), leaf("EngineBoundNHD")))
    status, out, err = check(tmp_path, config, capsys=capsys)
    inner = conflict_text(EngineBound(None), EngineBoundNHD(None), method="get_required_kvcache_layout")
    assert (status, err.splitlines()) == (1, [f"capkv check: error: {inner}"])
    assert [line.count("layout: conflict") for line in out.splitlines()] == [1, 0, 1, 0, 0]


def test_an_instance_level_override_still_needs_building(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("EngineBound"), leaf("EngineBoundConfigured"))
    status, out, err = check(tmp_path, config, capsys=capsys)
    assert status == 2
    row = " ".join(out.splitlines()[2].split())
    assert row == "└─ #2 EngineBoundConfigured HMA: yes layout: ? piecewise cudagraph: yes finished count: default"
    assert "layout: ?" in out.splitlines()[0], "a composite with an unknown child does not know its layout"
    assert err.splitlines() == [
        f'capkv check: error: #2: cannot build "{SAMPLES}:EngineBoundConfigured" with '
        "EngineBoundConfigured(kv_connector_extra_config): TypeError: EngineBound.__init__() missing 1 required "
        "positional argument: 'engine_object' (layouts and finished counts are unchecked; --classes-only skips building)"
    ], "only the connector whose fact is missing is an error, not #1"


def test_instance_answers_fill_in_beside_class_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = multi(leaf("EngineBound"), leaf("DiskConnector", layout="HND", finished_count=None))
    status, out, err = check(tmp_path, config, capsys=capsys)
    assert (status, err) == (0, "")
    assert out.splitlines()[0].startswith("MultiConnector  ") and "layout: HND  piecewise cudagraph: yes" in out.splitlines()[0]
    assert out.splitlines()[-1] == (
        "ok for 1 KV-cache group (#1 not built from extra config: facts from their classes); not for 2 or more: "
        '"MultiConnector" cannot serve 2 KV-cache groups: sub-connector #2 "DiskConnector" does not implement '
        "SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to"
    )


def test_a_conflict_among_known_children_is_found_beside_an_unknown_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = multi(leaf("EngineBound"), leaf("DiskConnector", colour="red"), leaf("EngineBoundNHD"))
    status, _, err = check(tmp_path, config, capsys=capsys)
    assert status == 1, "a conflict wins over a connector that cannot be built"
    assert err.splitlines()[0] == (
        "capkv check: error: MultiConnector.get_required_kvcache_layout: sub-connectors disagree "
        "(#1 EngineBound -> 'HND', #3 EngineBoundNHD -> 'NHD')"
    )
    assert "cannot build" in err.splitlines()[-1]


STACKS = [
    *(list(pair) for pair in itertools.product(sorted(FIXED), repeat=2)),
    *([a, [b, c]] for a, b, c in itertools.product(["Fixed_None_None", "Fixed_HND_None"], ["Fixed_HND_2", "Fixed_None_None"], ["Fixed_NHD_None", "Fixed_None_2"])),
]


def as_config(stack: list[Any]) -> dict[str, Any]:
    return multi(*(as_config(child) if isinstance(child, list) else leaf(child) for child in stack))


def as_built(stack: list[Any]) -> Any:
    children = [as_built(child) if isinstance(child, list) else getattr(sample_connectors, child)() for child in stack]
    return MultiConnector(*children)


@pytest.mark.parametrize("stack", STACKS, ids=str)
def test_check_from_classes_agrees_with_the_built_stack(
    tmp_path: Path, stack: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Same verdict and same first message, whether the rule runs on classes or on instances."""
    built = as_built(stack)
    expected: list[str] = []
    for method in ("get_required_kvcache_layout", "get_finished_count"):
        try:
            getattr(built, method)()
        except ConflictError as exc:
            expected.append(f"capkv check: error: {exc}")
    status, out, err = check(tmp_path, as_config(stack), "--classes-only", capsys=capsys)
    assert (status, err.splitlines()) == ((1, expected) if expected else (0, []))
    if not expected:
        piecewise = "yes" if built.requires_piecewise_for_cudagraph() else "no"
        assert f"piecewise cudagraph: {piecewise}" in out.splitlines()[0]
