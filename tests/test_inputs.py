"""Public constructors and entry points validate their inputs in production, not only in dev mode.

In dev mode capkv's own functions also run under beartype, which refuses some of
these values first (a ``ContractError`` naming the parameter); either way the
error is a ``CapkvError`` naming the parameter and the value. Under ``python -O``
(production) each is an ``ArgumentError`` (a ``ConfigError`` and a ``TypeError``).
"""

from __future__ import annotations

import math
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from capkv import CapkvError, ContractError, KVGroupSpec, KVSpec
from capkv.connectors import CPUOffloadConnector, FileStoreConnector
from capkv.devmode import types_checked
from capkv.engine import ModelShape, Workload
from capkv.engine._request import Request as EngineRequest
from capkv.errors import ArgumentError

ROOT = Path(__file__).resolve().parents[1]


def by_dev_mode_types(error: CapkvError) -> bool:
    """Whether dev mode's beartype refused the call before capkv's own check (no connector, no parameter)."""
    if isinstance(error, ContractError) and error.connector is None and "violates type hint" in str(error):
        assert types_checked(), f"only dev mode's type checks may answer first, got {error!r}"
        return True
    return False


def refused(make: Any, parameter: str, value: object) -> CapkvError:
    with pytest.raises(CapkvError) as raised:
        make()
    error = raised.value
    assert parameter in str(error), str(error)
    if not by_dev_mode_types(error):
        assert isinstance(error, ArgumentError), repr(error)
        assert error.parameter is not None and error.parameter.startswith(parameter)
        assert isinstance(error, TypeError) and isinstance(error, ValueError)
        assert repr(error.value)[:30] in str(error) or error.value != error.value, str(error)  # nan != nan
    return error


GOOD_GROUP: dict[str, Any] = {"layer_names": ("a", "b"), "block_size": 16, "sliding_window": None, "kv_shape": (8, 2)}
GOOD_SPEC: dict[str, Any] = {"num_groups": 1, "num_blocks": 8}

SPEC_CASES: list[tuple[str, object]] = [
    ("num_groups", True), ("num_groups", 0), ("num_groups", 1.0), ("num_groups", "2"),
    ("num_blocks", 1.5), ("num_blocks", math.inf), ("num_blocks", math.nan), ("num_blocks", False), ("num_blocks", -4),
    ("null_block_id", True), ("null_block_id", -1), ("null_block_id", 8),
    ("block_dim", -1), ("dtype", "float16"), ("device", 5), ("groups", "g"),
]
GROUP_CASES: list[tuple[str, object]] = [
    ("block_size", 0), ("block_size", True), ("sliding_window", -1), ("sliding_window", 2.5),
    ("layer_names", "abc"), ("layer_names", ("a", "a")), ("kv_shape", (8, "2")), ("kv_shape", (8, 0)),
]


@pytest.mark.parametrize(("parameter", "value"), SPEC_CASES)
def test_kvspec_refuses(parameter: str, value: object) -> None:
    refused(lambda: KVSpec(**{**GOOD_SPEC, parameter: value}), parameter, value)


@pytest.mark.parametrize(("parameter", "value"), GROUP_CASES)
def test_kvgroupspec_refuses(parameter: str, value: object) -> None:
    error = refused(lambda: KVGroupSpec(**{**GOOD_GROUP, parameter: value}), parameter.split("[")[0], value)
    assert "KVGroupSpec" in str(error)


def test_layer_names_as_a_string_is_not_three_layers() -> None:
    with pytest.raises(CapkvError, match="layer_names"):
        KVGroupSpec(layer_names="abc")  # type: ignore[arg-type]


def test_valid_specs_are_normalised() -> None:
    if types_checked():
        pytest.skip("dev mode's type hints refuse lists and numpy ints outright; production normalises them (-O run)")
    spec = KVSpec(num_groups=1, num_blocks=numpy.int64(8), groups=[KVGroupSpec(layer_names=["a"], kv_shape=[8, 2])],  # type: ignore[arg-type]
                  device="cpu")  # type: ignore[arg-type]
    assert type(spec.num_blocks) is int and spec.groups[0].layer_names == ("a",) and spec.groups[0].kv_shape == (8, 2)
    assert spec.device == torch.device("cpu") and isinstance(spec.groups, tuple)


def test_from_kv_cache_config_refuses_a_bool_block_count() -> None:
    with pytest.raises(CapkvError, match="num_blocks"):
        KVSpec.from_kv_cache_config(object(), num_blocks=True)


SPEC = KVSpec(
    num_groups=1, num_blocks=8, dtype=torch.float16,
    groups=(KVGroupSpec(layer_names=("a",), block_size=4, kv_shape=(8, 4, 2)),),
)


@pytest.mark.parametrize("value", [True, 2.0, "lots", 0])
def test_capacity_blocks_is_an_int_not_a_bool(value: object) -> None:
    refused(lambda: CPUOffloadConnector(SPEC, capacity_blocks=value), "capacity_blocks", value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("parameter", "value"), [("root", None), ("root", 3), ("namespace", 1), ("write", "w"), ("capacity_bytes", 0)])
def test_file_store_arguments(parameter: str, value: object, tmp_path: Path) -> None:
    arguments: dict[str, Any] = {"root": tmp_path, parameter: value}
    refused(lambda: FileStoreConnector(SPEC, **arguments), parameter, value)


def test_a_store_refuses_a_spec_that_is_not_a_kvspec(tmp_path: Path) -> None:
    refused(lambda: CPUOffloadConnector({"num_groups": 1}, capacity_blocks=4), "spec", {"num_groups": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kv_caches", [None, [torch.zeros(8, 4, 2, dtype=torch.float16)], numpy.zeros((8, 4, 2)), {"a": numpy.zeros((8, 4, 2))}],
    ids=["None", "list", "numpy array", "numpy value"],
)
def test_register_kv_caches_refuses_what_is_not_a_dict_of_tensors(kv_caches: object) -> None:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=4)
    with pytest.raises(ContractError) as raised:
        connector.register_kv_caches(kv_caches)  # type: ignore[arg-type]
    assert "kv_caches" in str(raised.value)
    if not by_dev_mode_types(raised.value):
        assert raised.value.connector == "CPUOffloadConnector" and raised.value.method == "register_kv_caches"


class NoTokens:
    request_id = "r1"
    num_computed_tokens = 0


@pytest.mark.parametrize("method", ["get_num_new_matched_tokens", "request_finished_all_groups"])
def test_a_store_names_a_request_without_all_token_ids(method: str) -> None:
    connector = CPUOffloadConnector(SPEC, capacity_blocks=4)
    call = {
        "get_num_new_matched_tokens": lambda: connector.get_num_new_matched_tokens(NoTokens(), 0),  # type: ignore[arg-type]
        "request_finished_all_groups": lambda: connector.request_finished_all_groups(NoTokens(), ([1],)),  # type: ignore[arg-type]
    }[method]
    with pytest.raises(ContractError) as raised:
        call()
    error = raised.value
    if not by_dev_mode_types(error):
        assert (error.connector, error.method) == ("CPUOffloadConnector", method)
        assert "all_token_ids" in str(error) and error.value is not None


@pytest.mark.parametrize(
    ("make", "parameter", "value"),
    [
        (lambda: ModelShape(num_layers=True), "num_layers", True),
        (lambda: ModelShape(sliding_block_size=0), "sliding_block_size", 0),
        (lambda: ModelShape(dtype="bfloat16"), "dtype", "bfloat16"),
        (lambda: Workload(num_requests=2.5), "num_requests", 2.5),
        (lambda: Workload(seed=None), "seed", None),
        (lambda: EngineRequest("r", "abc", max_tokens=1), "prompt_token_ids", "abc"),
        (lambda: EngineRequest("r", [1, -2], max_tokens=1), "prompt_token_ids[1]", -2),
        (lambda: EngineRequest("r", [1], max_tokens=True), "max_tokens", True),
        (lambda: EngineRequest(7, [1], max_tokens=1), "request_id", 7),
    ],
)
def test_engine_constructors_refuse(make: Any, parameter: str, value: object) -> None:
    refused(make, parameter, value)


def test_instrument_refuses_a_spec_that_is_not_a_kvspec_in_production_too() -> None:
    from capkv.devmode import instrument
    from tests.fakes import HMA

    refused(lambda: instrument(HMA(), "spec"), "spec", "spec")  # type: ignore[arg-type]


def test_block_id_check_memory_follows_the_ids_not_the_pool() -> None:
    """A pool of 2**31 blocks in 3 groups: checking 3 x 3,000 ids must not try to allocate 25 GB.

    Run in a child process whose address space is capped at 6 GiB (torch itself maps ~2 GiB).
    """
    script = textwrap.dedent(
        """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        from capkv import KVSpec
        from capkv.contracts._block_ids import check_block_groups
        spec = KVSpec(num_groups=3, num_blocks=2**31 - 1)
        ids = tuple(list(range(g * 10**6, g * 10**6 + 3000)) for g in range(3))
        check_block_groups(spec, ids, connector="c", method="m")
        bad = (ids[0], ids[1], ids[2][:-1] + [ids[2][0]])
        try:
            check_block_groups(spec, bad, connector="c", method="m")
        except Exception as error:
            print("refused:", type(error).__name__, error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "CAPKV_DEV": "0", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: ContractError" in done.stdout and "repeats the id at position 0" in done.stdout
    assert resource.RLIMIT_AS  # the cap the child ran under
