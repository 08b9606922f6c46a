"""``capkv check`` on vLLM's own configurations agrees with vLLM, over every connector vLLM 0.32 registers.

vLLM's answer is vLLM's own code, nothing built: ``KVConnectorFactory.supports_hma_config``
(HMA on: exit 0, off: 1, an exception: vLLM refuses the configuration, 2) and, for its
composite, ``MultiConnector._get_connector_classes_and_configs`` — what its constructor
resolves first (a missing ``connectors`` list, or a child it cannot resolve, refuses the
configuration even where the HMA decision passed). ``capkv check`` decides from classes
alone, and must give the same exit status on every configuration of the corpus: each
registered connector alone, vLLM's composite over each one next to a connector that keeps
HMA on and next to one that turns it off, nested composites, a misspelled child (first and
last), an empty and a missing ``connectors`` list, the composite named by its module path,
a child named by module path that cannot be imported, NIXL's transfer modes (vLLM 0.34's factory resolves
the class per entry), and capkv's drop-in over vLLM's children.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capkv.cli._main import main

HMA_CHILD = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}  # derives from SupportsHMA
PLAIN_CHILD = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}  # does not
MULTI_PATH = "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"


def multi(*children: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": list(children)}, **top}


def registered() -> list[str]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return sorted(KVConnectorFactory._registry)  # pyright: ignore[reportPrivateUsage]


def corpus() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in registered():
        yield f"{name} alone", {"kv_connector": name, "kv_role": "kv_both"}
        if name != "MultiConnector":
            child = {"kv_connector": name, "kv_role": "kv_both"}
            yield f"Multi[{name}, HMA child]", multi(child, HMA_CHILD)
            yield f"Multi[non-HMA child, {name}]", multi(PLAIN_CHILD, child)
    yield "nested, every child HMA", multi(HMA_CHILD, multi(HMA_CHILD, HMA_CHILD))
    yield "nested, a non-HMA grandchild", multi(HMA_CHILD, multi(HMA_CHILD, PLAIN_CHILD))
    yield "misspelled child, last", multi(HMA_CHILD, {"kv_connector": "NixlConnecter"})
    yield "misspelled child, after a non-HMA one", multi(PLAIN_CHILD, {"kv_connector": "NixlConnecter"})
    yield "misspelled alone", {"kv_connector": "OffloadingConector"}
    yield "empty connectors", multi()
    yield "no connectors key", {"kv_connector": "MultiConnector", "kv_connector_extra_config": {}}
    yield "Multi by module path, HMA", multi(HMA_CHILD, HMA_CHILD, kv_connector_module_path=MULTI_PATH)
    yield "Multi by module path, non-HMA", multi(HMA_CHILD, PLAIN_CHILD, kv_connector_module_path=MULTI_PATH)
    yield "child by module path that does not import", multi(
        HMA_CHILD, {"kv_connector": "Gone", "kv_connector_module_path": "no_such_module_for_capkv", "kv_role": "kv_both"})
    yield "child without kv_role", multi(HMA_CHILD, {"kv_connector": "NixlConnector"})
    for mode in ("push", "sideways"):  # vLLM 0.34's factory dispatches on it (and refuses an unknown mode)
        yield f"NIXL transfer_mode {mode}", multi(HMA_CHILD, {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                                                             "kv_connector_extra_config": {"transfer_mode": mode}})
    yield "drop-in over vLLM's children, HMA", multi(HMA_CHILD, {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                                                      kv_connector_module_path="capkv.vllm")
    yield "drop-in, empty", multi(kv_connector_module_path="capkv.vllm")
    yield "drop-in over vLLM's children, non-HMA", multi(HMA_CHILD, PLAIN_CHILD, kv_connector_module_path="capkv.vllm")


def vllm_says(config: dict[str, Any]) -> int:
    """vLLM's own verdict: 0 HMA on, 1 HMA off, 2 refused."""
    from vllm.config import KVTransferConfig

    try:
        transfer = KVTransferConfig(**config)
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        on = KVConnectorFactory.supports_hma_config(transfer)
        resolves(transfer)
    except Exception:
        return 2
    return 0 if on else 1


def resolves(transfer: Any) -> None:
    """What vLLM's composite's constructor resolves before building anything (``_get_connector_classes_and_configs``,
    whose ``VllmConfig`` argument only carries the ``kv_transfer_config`` read here), nested composites too."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

    if not issubclass(KVConnectorFactory.get_connector_class(transfer), MultiConnector):
        return
    entries = transfer.kv_connector_extra_config.get("connectors")
    assert entries is not None  # vLLM's own assertion in the constructor
    for entry in entries:
        resolves(KVTransferConfig(**entry, engine_id=entry.get("engine_id", transfer.engine_id)))


def capkv_says(tmp_path: Path, config: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "kv_transfer_config.json"
    path.write_text(json.dumps(config))
    status = main(["check", str(path)])
    out, err = capsys.readouterr()
    return status, (out + err).strip().splitlines()[-1] if (out + err).strip() else ""


def test_capkv_check_decides_as_vllm_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = list(corpus())
    assert len(registered()) >= 17  # every connector vLLM 0.32 registers is in the corpus
    disagreements: list[str] = []
    verdicts = {0: 0, 1: 0, 2: 0}
    for label, config in cases:
        expected = vllm_says(config)
        got, last = capkv_says(tmp_path, config, capsys)
        verdicts[expected] += 1
        if got != expected:
            disagreements.append(f"{label}: vLLM {expected}, capkv check {got} ({last})")
    with capsys.disabled():
        print(f"\ncapkv check vs vLLM on {len(cases)} configurations: {len(cases) - len(disagreements)} agree "
              f"(vLLM: {verdicts[0]} HMA on, {verdicts[1]} HMA off, {verdicts[2]} refused)")
    assert not disagreements, "\n".join(disagreements)


@pytest.mark.parametrize(
    ("config", "status", "named"),
    [
        (multi(HMA_CHILD, PLAIN_CHILD), 1, "#2 ExampleConnector"),
        (multi(HMA_CHILD, multi(HMA_CHILD, PLAIN_CHILD)), 1, "#2.2 ExampleConnector"),
        (multi(HMA_CHILD, {"kv_connector": "NixlConnecter"}), 2, '#2: unknown connector "NixlConnecter"'),
        (multi(HMA_CHILD, {"kv_connector": "Gone", "kv_connector_module_path": "no_such_module_for_capkv",
                           "kv_role": "kv_both"}), 2, '#2 Gone: cannot import module "no_such_module_for_capkv"'),
        ({"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {}}, 2,
         'MultiConnector needs "connectors"'),
        (multi(), 1, '"connectors" is empty'),
        (multi(HMA_CHILD, {"kv_connector": "NixlConnector"}), 2, "#2 NixlConnector: vLLM's KVTransferConfig refuses "
         "it: Please specify kv_role when kv_connector is set"),
    ],
)
def test_each_verdict_names_the_child(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, Any], status: int, named: str
) -> None:
    got, last = capkv_says(tmp_path, config, capsys)
    assert got == status and named in last, last
