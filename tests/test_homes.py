"""Public homes, pinned: every exported class and function reports its front, and pickles name only public paths.

``capkv.MultiConnector.__module__ == "capkv"`` (not ``capkv.composite._multi``),
from the moment its module is imported by any route; ``__qualname__`` stays the
name; a pickle of a stack, a spec, an error or a marker names fronts only and
loads back to the same classes; the HMA variants built at run time report the
class they were asked to be and pickle too.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import pickle
import pickletools
import subprocess
import sys
import textwrap
import types
import typing
from abc import ABCMeta
from pathlib import Path
from typing import Any

import pytest

import capkv
import capkv.errors
from capkv import _homes
from capkv.testing import HMANullConnector, NullConnector
from tests.test_exports import FRONTS, OPTIONAL, load

ROOT = Path(__file__).resolve().parents[1]

EXPORTED = [(front, name) for front, names in sorted(FRONTS.items()) for name in names]


def home_of(front: str, name: str) -> str:
    """Where the object says it lives: its front, or ``capkv.errors`` for the errors ``capkv`` re-exports."""
    return "capkv.errors" if name in capkv.errors.__all__ else front


def global_modules(data: bytes) -> set[str]:
    """Every module a pickle names (GLOBAL / STACK_GLOBAL arguments)."""
    found: set[str] = set()
    strings: list[str] = []  # STACK_GLOBAL takes the module and name pushed last (memoized strings aside: rare here)
    for opcode, argument, _ in pickletools.genops(data):
        if opcode.name in ("GLOBAL", "INST"):
            found.add(str(argument).split(" ")[0])
        elif isinstance(argument, str):
            strings.append(argument)
        elif opcode.name == "STACK_GLOBAL":
            found.add(strings[-2])
    return found


def assert_public_pickle(obj: object) -> object:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(obj, protocol)
        private = {m for m in global_modules(data) if m.split(".")[0] == "capkv" and "._" in m}
        assert private == set(), (protocol, private)
    return pickle.loads(pickle.dumps(obj))


@pytest.mark.parametrize(("front", "name"), EXPORTED, ids=[f"{f}.{n}" for f, n in EXPORTED])
def test_every_exported_class_and_function_reports_its_front(front: str, name: str) -> None:
    value = getattr(load(front), name)
    if not isinstance(value, (type, types.FunctionType)) or value is Any:
        return  # aliases (typing.Any itself: engine objects capkv does not type), constants, instances
    assert value.__module__ == home_of(front, name)
    assert value.__qualname__ == name
    members = vars(value).values() if isinstance(value, type) else ()
    for member in members:
        inner = getattr(member, "__func__", member)
        if isinstance(inner, (type, types.FunctionType)) and inner.__module__.startswith("capkv."):
            assert inner.__module__ == value.__module__, inner.__qualname__  # its methods moved with it
    assert pickle.loads(pickle.dumps(value)) is value
    assert_public_pickle(value)


def test_the_homes_are_set_when_the_module_loads_by_any_route() -> None:
    """In a fresh process, import each defining module directly (never asking a front): already re-homed."""
    code = textwrap.dedent(
        """
        import importlib, json, types, sys, typing
        for front in json.loads(sys.argv[1]):
            importlib.import_module(front)
        from capkv import _homes
        wrong = []
        for front, exports in list(_homes._FRONTS.items()):
            for module, names in exports.items():
                if module == "capkv.errors":
                    continue
                defined = importlib.import_module(module)
                for name in names:
                    value = vars(defined)[name]
                    if isinstance(value, (type, types.FunctionType)) and value is not typing.Any and value.__module__ != front:
                        wrong.append(f"{module}.{name}: {value.__module__}")
        print(json.dumps(wrong))
        """
    )
    fronts = [f for f in FRONTS if f not in OPTIONAL or importlib.util.find_spec(OPTIONAL[f]) is not None]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CAPKV_DEV": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(fronts)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wrong = json.loads(done.stdout)
    assert wrong == [], f"end these modules with publish(__name__) (capkv._homes), naming any other front: {wrong}"


@pytest.mark.parametrize("front", sorted(set(FRONTS) - {"capkv.errors"}))
def test_every_name_a_front_exports_is_registered_for_its_home(front: str) -> None:
    load(front)
    registered = {name for names in _homes._FRONTS[front].values() for name in names}  # noqa: SLF001
    assert registered == set(FRONTS[front])


def test_type_hints_of_exported_classes_still_resolve() -> None:
    """A class's ``__module__`` is where ``typing.get_type_hints`` looks: re-homing must not break it.

    A hint that names something only type checkers import (``torch`` in ``KVSpec``) fails as it always did.
    """
    failures: dict[str, str] = {}
    for front, name in EXPORTED:
        if front in OPTIONAL and importlib.util.find_spec(OPTIONAL[front]) is None:
            continue
        value = getattr(load(front), name)
        if isinstance(value, type):
            try:
                typing.get_type_hints(value)
            except NameError as exc:
                failures[f"{front}.{name}"] = str(exc)
    assert failures == {"capkv.KVSpec": "name 'torch' is not defined"}


def test_stacks_copy_and_pickle_by_public_paths() -> None:
    plain = capkv.MultiConnector(NullConnector(), HMANullConnector())
    hma = capkv.MultiConnector(HMANullConnector(), capkv.MultiConnector(HMANullConnector()))
    for stack in (plain, hma):
        loaded = assert_public_pickle(stack)
        assert type(loaded) is type(stack)
        assert type(copy.copy(stack)) is type(stack) and type(copy.deepcopy(stack)) is type(stack)
    assert type(hma) is capkv.HMAMultiConnector and capkv.HMAMultiConnector.__module__ == "capkv"


class Tiered(capkv.MultiConnector[Any]):
    """A user's stack class (at module level, so pickle can find it)."""

    __slots__ = ()


class _Meta(ABCMeta):
    pass


class Metered(capkv.MultiConnector[Any], metaclass=_Meta):
    """A user's stack class with a metaclass of its own."""

    __slots__ = ()


@pytest.mark.parametrize("declared", [Tiered, Metered])
def test_hma_variants_report_their_declared_class_and_pickle(declared: type[capkv.MultiConnector[Any]]) -> None:
    stack = declared(HMANullConnector(), HMANullConnector())
    variant = type(stack)
    assert variant is not declared and issubclass(variant, declared) and issubclass(variant, capkv.HMAMultiConnector)
    assert (variant.__module__, variant.__qualname__, variant.__name__) == (__name__, declared.__qualname__, declared.__name__)
    assert isinstance(variant, type(declared))
    assert pickle.loads(pickle.dumps(variant)) is variant
    loaded = assert_public_pickle(stack)
    assert type(loaded) is variant
    assert type(copy.deepcopy(stack)) is variant
    assert type(declared(NullConnector())) is declared  # not HMA-capable: the declared class itself


def test_hma_variants_load_in_a_fresh_process() -> None:
    """The variant's pickle names the declared class; a process that never built a variant builds it on load."""
    stack = Tiered(HMANullConnector())
    data = pickle.dumps((type(stack), stack))
    code = "import pickle, sys; kind, stack = pickle.loads(sys.stdin.buffer.read()); print(kind is type(stack), kind.__mro__[1].__name__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", f"import tests.test_homes\n{code}"], input=data, env=env,
                          capture_output=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().split() == ["True", "Tiered"]


@pytest.mark.parametrize("name", capkv.errors.__all__)
def test_errors_pickle_with_every_field_by_their_public_path(name: str) -> None:
    cls: type[capkv.errors.CapkvError] = getattr(capkv.errors, name)
    error = cls.__new__(cls)
    Exception.__init__(error, f"{name}: what went wrong")
    fields = {"connector": "#2 FileStoreConnector", "method": "get_finished", "group": 1, "value": [3, 4]}
    fields |= {"parameter": "num_blocks", "exceptions": (ValueError("child"),), "delay_free": True,
               "kv_transfer_params": {"k": 1}, "partial": None}
    error.__dict__.update(fields)
    loaded = assert_public_pickle(error)
    assert type(loaded) is cls and str(loaded) == str(error) and loaded.args == error.args
    assert {k: repr(v) for k, v in vars(loaded).items()} == {k: repr(v) for k, v in vars(error).items()}


def test_a_spec_and_the_markers_pickle_by_public_paths() -> None:
    spec = capkv.KVSpec(num_groups=2, num_blocks=16)
    assert assert_public_pickle(spec) == spec
    assert assert_public_pickle(capkv.composite.NOT_BUILT) is capkv.composite.NOT_BUILT
    drop = next(iter(capkv.composite.Drop))
    assert assert_public_pickle(drop) is drop
