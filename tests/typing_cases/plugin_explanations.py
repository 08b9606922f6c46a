"""Where a non-HMA stack must be HMA-capable, the ``capkv.mypy`` plugin names the children at fault.

Every line has the same verdict under mypy, mypy with the plugin, and pyright;
the ``# ^ mypy+plugin:`` pins are the plugin's messages. A stack kept in a
variable keeps its precise type, but where the *variable* is used mypy's own
message stands (plugins cannot hook that); it is pinned too, so a change shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from typing_extensions import assert_type

from capkv import HMAConnector, KVConnector, MultiConnector, SupportsHMA
from tests.typing_cases._connectors import Disk, Offload, PrefixStore

hma, plain, tok = Offload(), Disk(), PrefixStore()


def needs_hma(connector: SupportsHMA) -> None: ...
def needs_hma_connector(connector: HMAConnector) -> None: ...
def needs_optional_hma(connector: SupportsHMA | None) -> None: ...
def needs_connector(connector: KVConnector) -> None: ...
def needs_either(connector: SupportsHMA | KVConnector) -> None: ...


class Engine:
    def __init__(self, connector: HMAConnector) -> None: ...
    def swap(self, connector: SupportsHMA) -> None: ...


class MyStack(MultiConnector[*tuple[Any, ...]]):
    """A subclass: same rule, its own name in the message."""


# Arguments: functions, constructors, methods, keywords.
needs_hma(MultiConnector(hma, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma_connector(MultiConnector(plain, hma, tok))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_optional_hma(MultiConnector(plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
Engine(MultiConnector(hma, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
Engine(MultiConnector(hma)).swap(MultiConnector(plain, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(connector=MultiConnector(tok, plain))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(MyStack(hma, plain))  # expect-error
# ^ mypy+plugin: "MyStack" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]

# Assignments, returns, containers, conditionals.
declared: SupportsHMA = MultiConnector(hma, plain)  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
stacks: list[HMAConnector] = [MultiConnector(hma), MultiConnector(plain)]  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]


def build() -> HMAConnector:
    return MultiConnector(MultiConnector(hma, plain), hma)  # expect-error
    # ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1.2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]


def choose(flag: bool) -> SupportsHMA:
    return MultiConnector(hma) if flag else MultiConnector(plain)  # expect-error
    # ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]


lazily: Callable[[], SupportsHMA] = lambda: MultiConnector(plain)  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
C = TypeVar("C", bound=KVConnector)


def generic_child(connector: C) -> None:
    needs_hma(MultiConnector(connector, hma))  # expect-error
    # ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1 "C" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]


# The receiver of request_finished_all_groups.
MultiConnector(hma, plain).request_finished_all_groups  # expect-error
# ^ mypy+plugin: "MultiConnector" has no request_finished_all_groups: sub-connector #2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
finish = MultiConnector(MultiConnector(plain), hma).request_finished_all_groups  # expect-error
# ^ mypy+plugin: "MultiConnector" has no request_finished_all_groups: sub-connector #1.1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]

# Any arity, any depth: every offender, by position.
needs_hma(MultiConnector(hma, hma, hma, hma, hma, hma, hma, hma, hma, hma, plain, hma))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #11 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]
needs_hma(MultiConnector(MultiConnector(MultiConnector(hma, plain)), MultiConnector(plain), tok))  # expect-error
# ^ mypy+plugin: "MultiConnector" is not HMA-capable: sub-connector #1.1.2 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); sub-connector #2.1 "Disk" does not implement SupportsHMA (missing request_finished_all_groups); an HMA stack needs every child to  [capkv-hma]

# Accepted everywhere: HMA stacks, and plain stacks where plain connectors will do.
needs_hma(MultiConnector(hma, tok))
needs_hma(MultiConnector(MultiConnector(hma), MultiConnector(tok, hma)))
needs_connector(MultiConnector(hma, plain))
needs_either(MultiConnector(hma, plain))
plain_ok: KVConnector = MultiConnector(plain)
Engine(MultiConnector(hma, hma, hma, hma, hma, hma, hma, hma, hma, tok))

# An overloaded callee picks the item that fits; the plugin must not change which.
@overload
def pick(connector: SupportsHMA) -> int: ...
@overload
def pick(connector: KVConnector) -> str: ...
def pick(connector: object) -> object:
    return 0


assert_type(pick(MultiConnector(hma, plain)), str)
assert_type(pick(MultiConnector(hma, tok)), int)

# A type variable's bound: mypy's own message stands.
H = TypeVar("H", bound=HMAConnector)


def keep(connector: H) -> H:
    return connector


keep(MultiConnector(hma, hma))
keep(MultiConnector(hma, plain))  # expect-error
# ^ mypy+plugin: Value of type variable "H" of "keep" cannot be "MultiConnector[Offload, Disk]"  [type-var]

# Through a variable: the type is precise, the message at the use is mypy's.
stack = MultiConnector(hma, plain)
needs_hma(stack)  # expect-error
# ^ mypy+plugin: Argument 1 to "needs_hma" has incompatible type "MultiConnector[Offload, Disk]"; expected "SupportsHMA[Any]"  [arg-type]
stack.request_finished_all_groups  # expect-error
# ^ mypy+plugin: "MultiConnector[Offload, Disk]" has no attribute "request_finished_all_groups"  [attr-defined]
